"""Meta build + per-module seeded materialisation (executor/materialize.py).

This file is also a model file (`tests/executor/test_materialize.py:tiny_llama`): a tiny
Llama-style model with a RoPE `inv_freq` non-persistent buffer, optionally with its
embedding and head tied, so that worker processes can load it by path.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tests.executor.gloo_group import gloo_group
from tests.executor.runs import spawn_workers

HERE = Path(__file__).resolve()
GPT_TINY = f"{HERE.parents[2] / 'examples' / 'gpt.py'}:tiny"
STEPS, BATCH, SEQ, LR = 3, 4, 8, 1e-2


# -- the model file part -------------------------------------------------------------------
class RoPE(nn.Module):
    """Rotary embeddings (Su et al. 2021): inv_freq_i = base^(-2i/d), a non-persistent buffer."""

    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # b, heads, s, d
        t = torch.arange(x.shape[-2], dtype=torch.float32, device=x.device)
        freqs = torch.outer(t, self.inv_freq)
        cos, sin = freqs.cos(), freqs.sin()
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.rope = RoPE(hidden // heads)
        self.gate = nn.Linear(hidden, 2 * hidden, bias=False)
        self.up = nn.Linear(hidden, 2 * hidden, bias=False)
        self.down = nn.Linear(2 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(self.norm1(x)).chunk(3, -1))
        att = F.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, h))
        y = self.norm2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class TinyLlama(nn.Module):
    def __init__(self, vocab: int, hidden: int, heads: int, layers: int, tie: bool):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def tiny_llama(vocab: int = 64, hidden: int = 32, heads: int = 4, layers: int = 2, tie: bool = False):
    return TinyLlama(vocab, hidden, heads, layers, tie)


def tiny_tied(**args):
    return tiny_llama(tie=True, **args)


class ScaledBlock(Block):
    """A block that registers a parameter of its own (a layer-scale gamma, as in CaiT and many
    ViTs): under recomputation the wrapped module itself holds it."""

    def __init__(self, hidden: int, heads: int):
        super().__init__(hidden, heads)
        self.gamma = nn.Parameter(torch.full((hidden,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gamma * (super().forward(x) - x)


def tiny_scaled(vocab: int = 64, hidden: int = 32, heads: int = 4, layers: int = 2):
    model = TinyLlama(vocab, hidden, heads, layers, tie=False)
    model.blocks = nn.ModuleList(ScaledBlock(hidden, heads) for _ in range(layers))
    return model


# -- helpers -------------------------------------------------------------------------------
def _batches(vocab: int = 64):
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab, (BATCH, SEQ + 1), generator=gen) for _ in range(STEPS)]


def _loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))


def _eager_losses(model_file, state: dict) -> list[float]:
    """The plain single-process model, started from `state`, trained STEPS AdamW steps."""
    model = model_file.build({}, device="cpu")
    model.load_state_dict(state)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for tokens in _batches():
        loss = _loss(model, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parts(spec: str, ref: str, world: int):
    from smplan.executor.build import build_model_parts
    from smplan.executor.mesh import ParallelDims
    from smplan.executor.run import resolve_plan

    plan, model_file = resolve_plan(spec, model=ref)
    dims = ParallelDims(plan.pp, plan.dp, plan.tp, world)
    dims.build_mesh("cpu")
    return plan, model_file, build_model_parts(plan, model_file, dims, torch.device("cpu"), seed=7, loss_fn=None)


@pytest.fixture
def one_process():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


# -- single process ------------------------------------------------------------------------
def test_meta_build_keeps_buffers_real():
    from smplan.executor.materialize import build_meta
    from smplan.planner import load_model_file

    model = build_meta(load_model_file(f"{HERE}:tiny_llama"), {}, seed=0)
    assert all(p.is_meta for p in model.parameters())
    eager = load_model_file(f"{HERE}:tiny_llama").build({}, device="cpu")
    assert torch.equal(model.blocks[1].rope.inv_freq, eager.blocks[1].rope.inv_freq)


def test_rope_buffer_is_computed_not_left_uninitialised(one_process):
    _, model_file, parts = _parts("mbs=1,gbs=1", f"{HERE}:tiny_llama", 1)
    eager = model_file.build({}, device="cpu")
    chunk = parts.chunks[0]
    for i in range(2):
        assert torch.equal(chunk.blocks[i].rope.inv_freq, eager.blocks[i].rope.inv_freq)
    assert not any(p.is_meta for p in chunk.parameters())


def test_tied_weights_share_storage_and_train_like_eager(one_process):
    _, model_file, parts = _parts("mbs=1,gbs=1", f"{HERE}:tiny_tied", 1)
    chunk = parts.chunks[0]
    assert chunk.head.weight is chunk.embed.weight
    assert chunk.head.weight.data_ptr() == chunk.embed.weight.data_ptr()
    assert len(list(chunk.parameters())) == len({id(p) for _, p in chunk.named_parameters(remove_duplicate=False)})
    expected = _eager_losses(model_file, {k: v.clone() for k, v in chunk.state_dict().items()})
    opt = torch.optim.AdamW(chunk.parameters(), lr=LR)
    got = []
    for tokens in _batches():
        loss = _loss(chunk, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
        got.append(loss.item())
    assert got == pytest.approx(expected, rel=1e-6)
    assert chunk.head.weight is chunk.embed.weight  # still tied after the optimizer steps


def test_initial_weights_depend_on_seed_and_name_only():
    from smplan.executor.build import full_initial_state
    from smplan.executor.materialize import module_seed
    from smplan.planner import load_model_file

    mf = load_model_file(f"{HERE}:tiny_llama")
    a, b, c = (full_initial_state(mf, {}, s) for s in (7, 7, 8))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.qkv.weight"], c["blocks.0.qkv.weight"])
    assert not torch.equal(a["blocks.0.qkv.weight"], a["blocks.1.qkv.weight"])  # seeded per module
    bigger = full_initial_state(mf, {"layers": 3}, 7)  # one more block leaves the others as they were
    assert all(torch.equal(a[k], bigger[k]) for k in a)
    assert module_seed(7, "blocks.0.qkv") != module_seed(7, "blocks.1.qkv")
    assert 0 <= module_seed(2**63 - 1, "x") < 2**63


class _Scale(nn.Module):  # no reset_parameters: keeps its constructor's values
    def __init__(self, n: int):
        super().__init__()
        self.scale = nn.Parameter(torch.arange(n, dtype=torch.float32))


class _HalfInit(nn.Module):  # reset_parameters that forgets a parameter
    def __init__(self, n: int):
        super().__init__()
        self.a, self.b = nn.Parameter(torch.empty(n)), nn.Parameter(torch.ones(n))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.zeros_(self.a)


def test_constructor_values_without_reset_parameters_and_unset_parameters_are_caught():
    from smplan.executor.materialize import MaterializeError, materialize, params_on_meta

    with params_on_meta():
        model = nn.Sequential(nn.Linear(3, 3), _Scale(4))
    assert model[0].weight.is_meta and not model[1].scale.is_meta
    reference = model
    chunk = nn.Sequential(nn.Linear(3, 3, device="meta"), _Scale(4))
    materialize(chunk, reference, "cpu", seed=0)
    assert torch.equal(chunk[1].scale, torch.arange(4.0))
    with params_on_meta():
        half = _HalfInit(3)
    with pytest.raises(MaterializeError, match="left parameter 'b' unset"):
        materialize(_HalfInit(3).to("meta"), half, "cpu", seed=0)


# -- two processes -------------------------------------------------------------------------
def _worker(rank: int, world: int, spec: str, init_file: str) -> None:
    from smplan.executor.build import full_initial_state

    with gloo_group(init_file, rank, world):
        plan, model_file, parts = _parts(spec, f"{HERE}:tiny_tied", world)
        chunk = parts.chunks[0]
        inner = getattr(chunk, "module", chunk)  # DDP wraps
        assert inner.head.weight is inner.embed.weight, "tie lost"
        if plan.zero:
            from torch.distributed.fsdp import FSDPModule

            state = chunk._get_fsdp_state()
            owners = [fp for g in state._fsdp_param_groups for fp in g.fsdp_params
                      if fp.sharded_param is inner.embed.weight]
            assert isinstance(chunk, FSDPModule) and len(owners) == 1, "FSDP does not own the tied parameter once"
        full = {n: _full(p) for n, p in inner.named_parameters(remove_duplicate=False)}
        for n, t in inner.named_buffers():
            full[n] = t.detach().clone()
        expected_init = full_initial_state(model_file, {}, 7)
        for name, value in expected_init.items():
            assert torch.equal(full[name], value), f"initial {name} differs from the single-process one"
        eager = _eager_losses(model_file, expected_init) if rank == 0 else None
        opt = torch.optim.AdamW(chunk.parameters(), lr=LR)
        losses = []
        for tokens in _batches():
            mine = tokens[rank * BATCH // world:(rank + 1) * BATCH // world]
            loss = _loss(chunk, mine)
            loss.backward()
            opt.step()
            opt.zero_grad()
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(total.item() / world)
        if rank == 0:
            assert losses == pytest.approx(eager, rel=1e-5), (losses, eager)
        assert inner.head.weight is inner.embed.weight, "tie lost in training"




@pytest.mark.parametrize("spec", [pytest.param("dp=2,zero=0,mbs=2,gbs=4", marks=pytest.mark.slow),  # CI time
                                  "dp=2,zero=3,mbs=2,gbs=4"])
def test_tied_weights_under_data_parallel(spec, tmp_path):
    spawn_workers(_worker, 2, spec, tmp_path, timeout_s=120)


def _init_worker(rank: int, world: int, spec: str, init_file: str) -> None:
    from smplan.executor.build import full_initial_state

    with gloo_group(init_file, rank, world):
        _, model_file, parts = _parts(spec, GPT_TINY, world)
        expected = full_initial_state(model_file, {}, 7)
        seen = 0
        for chunk in parts.chunks:
            for name, tensor in chunk.state_dict().items():  # DTensor shards gathered
                assert torch.equal(_full(tensor), expected[name]), f"{spec}: initial {name} differs"
                seen += 1
        assert seen > 0


def test_canonical_name_drops_every_wrapper_segment():
    from smplan.executor.materialize import canonical_name

    assert canonical_name("blocks.0._checkpoint_wrapped_module.proj.weight") == "blocks.0.proj.weight"
    assert canonical_name("blocks.0._checkpoint_wrapped_module") == "blocks.0"  # the wrapped block itself
    assert canonical_name("_orig_mod.blocks.1._checkpoint_wrapped_module.gamma") == "blocks.1.gamma"


@pytest.mark.parametrize("recompute", ["full", "sac", "selective"])
def test_recomputed_block_with_a_parameter_of_its_own_materialises(one_process, recompute):
    from smplan.executor.build import full_initial_state

    _, model_file, parts = _parts(f"mbs=2,gbs=2,recompute={recompute}", f"{HERE}:tiny_scaled", 1)
    expected = full_initial_state(model_file, {}, 7)
    state = {name: _full(t) for chunk in parts.chunks for name, t in chunk.state_dict().items()}
    assert state.keys() == expected.keys() and "blocks.0.gamma" in state
    for name, tensor in state.items():
        assert torch.equal(tensor, expected[name]), f"{recompute}: initial {name} differs"


@pytest.mark.parametrize("spec", ["tp=2,dp=2,zero=3,mbs=1,gbs=2",
                                  pytest.param("pp=2,tp=2,mbs=1,gbs=2", marks=pytest.mark.slow)])  # CI time: 4 processes
def test_every_layout_starts_from_the_single_process_weights(spec, tmp_path):
    spawn_workers(_init_worker, 4, spec, tmp_path, timeout_s=180)


HOOKED = '''
import torch
from torch import nn

CALLS = []


def init_weights(module):
    CALLS.append(type(module).__name__)
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        nn.init.zeros_(module.bias)
    else:
        module.reset_parameters()


def model():
    return nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.Linear(64, 8))
'''


def test_init_weights_hook_replaces_reset_parameters(tmp_path):
    from smplan.executor.build import full_initial_state
    from smplan.planner import load_model_file

    path = tmp_path / "hooked.py"
    path.write_text(HOOKED)
    mf = load_model_file(str(path))
    state = full_initial_state(mf, {}, seed=3)
    assert mf.module.CALLS == ["Linear", "LayerNorm", "Linear"]  # once per module that owns parameters
    assert abs(state["0.weight"].std().item() - 0.02) < 0.002 and not state["2.bias"].any()
    assert torch.equal(state["1.weight"], torch.ones(64))
    assert torch.equal(full_initial_state(mf, {}, seed=3)["0.weight"], state["0.weight"])
