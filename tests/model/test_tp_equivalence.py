"""The TP equivalence check (smplan.model.tp_equivalence): a block must compute on tp ranks'
shards what it computes whole, or a checkpoint loaded at another tp computes garbage."""

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from smplan.model import tp_equivalence
from smplan.model.tp_equivalence import tp_equivalence_problem


class FusedMLP(nn.Module):
    """SwiGLU with gate and up fused, split by .chunk(2): under ColwiseParallel each rank's gate
    is half gate and half up columns."""

    def __init__(self, d=16, ffn=32, fused=True):
        super().__init__()
        self.fused = fused
        self.gate_up = nn.Linear(d, 2 * ffn, bias=False, device="meta")
        self.down = nn.Linear(ffn, d, bias=True, device="meta")

    def forward(self, x):
        h = self.gate_up(x)
        gate, up = h.chunk(2, dim=-1) if self.fused else h.view(*h.shape[:-1], -1, 2).unbind(-1)
        return x + self.down(F.silu(gate) * up)


def _styled(block):
    return {"gate_up": (block.gate_up, "col"), "down": (block.down, "row")}


def _x():
    return torch.empty(2, 4, 16, device="meta")


def test_a_fused_gate_up_split_by_position_computes_something_else_on_shards():
    block = FusedMLP()
    why = tp_equivalence_problem(block, (_x(),), {}, _styled(block), 2)
    assert why.startswith("the block computes something else on tp=2's shards than whole (relative error ")
    assert ".chunk() or .split()" in why and "examples/gpt.py" in why


def test_an_interleaved_gate_up_is_the_same_function_on_shards_and_a_row_bias_counts_once():
    # gate and up interleaved column by column: every rank's slice holds pairs, so it is equal
    block = FusedMLP(fused=False)
    assert tp_equivalence_problem(block, (_x(),), {}, _styled(block), 2) is None
    assert tp_equivalence_problem(block, (_x(),), {}, _styled(block), 4) is None


def test_weights_tiled_from_a_pool_still_tell_a_fused_split_from_an_interleaved_one(monkeypatch):
    # a weight past POOL_SIZE elements repeats a pool of draws: a prime size keeps its rows apart
    monkeypatch.setattr(tp_equivalence, "POOL_SIZE", 67)  # gate_up: 64 x 16
    weight = tp_equivalence._uniform_(torch.empty(64, 16), -1.0, 1.0, torch.Generator().manual_seed(0))
    assert len({tuple(row.tolist()) for row in weight}) == 64 and weight.abs().max() <= 1.0
    block = FusedMLP()
    assert tp_equivalence_problem(block, (_x(),), {}, _styled(block), 2) is not None
    block = FusedMLP(fused=False)
    assert tp_equivalence_problem(block, (_x(),), {}, _styled(block), 2) is None


def test_blocks_past_the_size_limit_and_tp_1_are_not_checked(monkeypatch):
    block = FusedMLP()
    assert tp_equivalence_problem(block, (_x(),), {}, _styled(block), 1) is None
    monkeypatch.setattr(tp_equivalence, "MAX_TRIAL_PARAMS", 100)
    assert tp_equivalence_problem(block, (_x(),), {}, _styled(block), 2) is None


class FailsOnShards(FusedMLP):
    """Raises on one rank only, before the all-reduce that rank's peers wait in."""

    def forward(self, x):
        if self.gate_up.weight.data_ptr() != self.gate_up.weight.untyped_storage().data_ptr():
            raise RuntimeError("this rank's slice")
        return super().forward(x)


def test_a_rank_that_fails_does_not_hang_the_others(monkeypatch):
    monkeypatch.setattr(tp_equivalence, "BARRIER_TIMEOUT_S", 5.0)
    block = FailsOnShards(fused=False)
    start = time.monotonic()
    assert tp_equivalence_problem(block, (_x(),), {}, _styled(block), 2) is None  # not this check's question
    assert time.monotonic() - start < 5.0


@pytest.mark.parametrize("name, refused", [("FUSED_QKV_MODEL", True), ("PER_HEAD_QKV_MODEL", False)])
def test_a_profile_refuses_tp_for_a_fused_qkv_split_by_position(cli_runner, tmp_path, name, refused):
    from smplan.planner import profile_model

    from smplan.cli.main import cli
    from tests import own_models

    path = tmp_path / "m.py"
    path.write_text(getattr(own_models, name))
    unsupported = profile_model(str(path), cache=False).unsupported
    assert ("tp" in unsupported) == refused
    if refused:
        assert unsupported["tp"].startswith("the block computes something else on tp=2's shards")
        run = cli_runner.invoke(cli, ["execute", "tp=2,mbs=1,gbs=2", "--model", str(path), "-o", str(tmp_path / "r")])
        assert run.exit_code == 2 and "tp=2: the block computes something else" in run.output
        assert len(run.output.strip().splitlines()) == 1 and "Traceback" not in run.output
        assert not (tmp_path / "r").exists()


# -- what a review found: torch's styles keep the module, and masks come either way round ---------

class Scaled(nn.Linear):
    """A subclass with its own forward (torch's styles keep it; the check must too)."""

    def forward(self, x):
        return super().forward(x) * 2.0


class Attention(nn.Module):
    """Fused q/k/v, either split by position (`chunk`) or laid out per head; a bool mask with
    True = masked (masked_fill's convention) passed as a keyword; optionally also returning the
    head-sharded scores, a plain tensor attribute, a buffer it counts calls in."""

    def __init__(self, chunk=True, scores=False, counter=False):
        super().__init__()
        self.chunk, self.scores, self.counter = chunk, scores, counter
        self.qkv = nn.Linear(16, 48, device="meta")
        self.o = Scaled(16, 16, device="meta")
        self.scale = torch.tensor(0.5, device="meta")  # neither a parameter nor a buffer
        self.register_buffer("calls", torch.zeros((), device="meta"))

    def forward(self, x, mask=None):
        b, s, _ = x.shape
        h = self.qkv(x)
        if self.chunk:
            q, k, v = (t.view(b, s, -1, 4).transpose(1, 2) for t in h.chunk(3, dim=-1))
        else:
            q, k, v = h.view(b, s, -1, 12).transpose(1, 2).chunk(3, dim=-1)
        att = (q @ k.transpose(-1, -2) * self.scale).masked_fill(mask, float("-inf")).softmax(-1)
        y = self.o((att @ v).transpose(1, 2).reshape(b, s, -1)) * self.o.out_features ** -0.5  # global width
        if self.counter:
            self.calls += 1
            y = y / self.calls
        return (x + y, att) if self.scores else x + y


def _attention_call():
    return (torch.empty(2, 4, 16, device="meta"),), {"mask": torch.empty(4, 4, dtype=torch.bool, device="meta")}


@pytest.mark.parametrize("kwargs", [{}, {"scores": True}, {"counter": True}])
def test_attention_split_by_position_is_caught_with_any_mask_convention_and_extras(kwargs):
    """A mask filled all True hid every position (NaN: not checked); extra head-sharded outputs
    and plain tensor attributes made the whole check give up."""
    block = Attention(**kwargs)
    styled = {"qkv": (block.qkv, "col"), "o": (block.o, "row")}
    assert tp_equivalence_problem(block, *_attention_call(), styled, 2) is not None
    per_head = Attention(chunk=False, **kwargs)
    styled = {"qkv": (per_head.qkv, "col"), "o": (per_head.o, "row")}
    assert tp_equivalence_problem(per_head, *_attention_call(), styled, 2) is None


class AlwaysDropout(FusedMLP):
    def forward(self, x):
        return F.dropout(super().forward(x), 0.1)  # training=True by default: random in eval mode too


class ReturnsEarlyOnRankOne(FusedMLP):
    def forward(self, x):
        if self.gate_up.weight.data_ptr() != self.gate_up.weight.untyped_storage().data_ptr():
            return x  # rank 1 never reaches the all-reduce rank 0 waits in
        return super().forward(x)


def test_random_or_divergent_forwards_are_not_judged_and_do_not_wait_out_the_barrier():
    block = AlwaysDropout(fused=False)
    assert tp_equivalence_problem(block, (_x(),), {}, _styled(block), 2) is None
    block = ReturnsEarlyOnRankOne(fused=False)
    start = time.monotonic()
    assert tp_equivalence_problem(block, (_x(),), {}, _styled(block), 2) is None
    assert time.monotonic() - start < 5.0


class SplitByOutFeatures(nn.Module):
    """nanoGPT's `split(self.n_embd)`: under torch's styles `out_features` stays the global width,
    so the local 24 columns split into 16 and 8 and the unpacking fails at launch."""

    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(16, 48, device="meta"), nn.Linear(16, 16, device="meta")

    def forward(self, x):
        q, k, v = self.qkv(x).split(self.qkv.out_features // 3, dim=-1)
        return x + self.o(q * k * v)


def test_the_forward_trial_keeps_the_global_out_features_as_torchs_styles_do():
    from smplan.model.tp_forward import tp_forward_trial

    block = SplitByOutFeatures()
    styled = {"qkv": (block.qkv, "col"), "o": (block.o, "row")}
    trial = tp_forward_trial(block, (_x(),), {}, styled)
    assert trial.problem.startswith("the block's forward fails on tp=2's local shards (ValueError: not enough values")
