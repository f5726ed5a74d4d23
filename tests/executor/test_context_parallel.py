"""Context parallelism (cp): the load-balanced split, the causal mask by global position,
the K/V all-gather and its backward, token-count weighting, and `smplan execute` with cp=2
ending where one process does."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from smplan.executor.context_parallel import (
    SequenceShard,
    causal_mask,
    gather_order,
    rank_positions,
    weighted_loss,
)
from smplan.planner.model_file import load_model_file

from tests.executor.gloo_group import gloo_group
from tests.executor.runs import (
    GPT_TINY,
    assert_same_state,
    checkpoint_state,
    metrics,
    rank_logs,
    run_execute,
    spawn_workers,
)

# -- one process: positions and masks ---------------------------------------------------------


def test_each_rank_holds_chunks_i_and_2cp_minus_1_minus_i():
    assert rank_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert rank_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert rank_positions(16, 4, 1).tolist() == [2, 3, 12, 13]
    every = torch.cat([rank_positions(24, 3, r) for r in range(3)])
    assert sorted(every.tolist()) == list(range(24))  # each token on exactly one rank
    with pytest.raises(ValueError, match="2\\*cp=4"):
        rank_positions(14, 2, 0)


def test_causal_work_is_balanced_over_the_ranks():
    """The point of the 2*cp split: every rank's queries see the same number of keys."""
    for seq, cp in ((16, 2), (32, 4), (24, 3)):
        seen = [int((~causal_mask(rank_positions(seq, cp, r), torch.arange(seq))).sum()) for r in range(cp)]
        assert len(set(seen)) == 1, (seq, cp, seen)


def test_gather_order_restores_the_sequence():
    for seq, cp in ((8, 2), (24, 3), (32, 4)):
        gathered = torch.cat([rank_positions(seq, cp, r) for r in range(cp)])  # what an all-gather returns
        assert gathered[gather_order(seq, cp)].tolist() == list(range(seq))


@pytest.mark.parametrize("cp", [2, 4])
def test_local_queries_against_full_kv_equal_full_causal_attention(cp):
    gen = torch.Generator().manual_seed(0)
    b, h, s, d = 2, 3, 16, 8
    q, k, v = (torch.randn(b, h, s, d, generator=gen) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for r in range(cp):
        pos = rank_positions(s, cp, r)
        mask = causal_mask(pos, torch.arange(s))
        sdpa = F.scaled_dot_product_attention(q[:, :, pos], k, v, attn_mask=~mask)
        scores = (q[:, :, pos] @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(mask, float("-inf"))
        explicit = torch.softmax(scores, -1) @ v
        torch.testing.assert_close(sdpa, full[:, :, pos])
        torch.testing.assert_close(explicit, full[:, :, pos])


def test_the_gpt_hook_reaches_embedding_and_attention():
    model_file = load_model_file(GPT_TINY)
    model = model_file.build({}, device="meta")
    shard = SequenceShard(16, 2, 1)  # no group: only positions and mask are read here
    model_file.hook("context_parallel")(model, shard)
    assert model.embed.sequence is shard
    assert all(block.attn.sequence is shard for block in model.blocks)
    assert shard.mask().shape == (8, 16)


# -- two processes: the all-gather, its backward, the weighting, the whole model ----------------

MOE_TINY = GPT_TINY.replace("gpt.py:tiny", "moe.py:tiny")
MODELS = {  # model file, builder arguments
    "gpt-explicit": (GPT_TINY, {}),  # explicit softmax attention, learned positions
    "gpt-sdpa-gqa": (GPT_TINY, {"attention": "sdpa", "kv_heads": 2}),
    "moe-mla": (MOE_TINY, {"attention": "mla", "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                           "v_head_dim": 8}),
}


def _worker(rank: int, world: int, models: str, init_file: str) -> None:
    with gloo_group(init_file, rank, world):
        _check_gather(rank, world)
        _check_token_weight(rank, world)
        for name in models.split(","):
            _check_model(rank, world, *MODELS[name])


def _check_gather(rank: int, cp: int) -> None:
    shard = SequenceShard(8, cp, rank, dist.group.WORLD)
    full = torch.arange(2 * 8 * 3, dtype=torch.float32).reshape(2, 8, 3)
    local = full[:, shard.positions].clone().requires_grad_()
    gathered = shard.gather(local, 1)
    assert torch.equal(gathered, full), "gather must return the whole sequence in order"
    weights = [torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(r)) for r in range(cp)]
    (gathered * weights[rank]).sum().backward()
    # Backward reduce-scatters: each rank's slice gets the sum of every rank's gradient.
    assert torch.allclose(local.grad, sum(weights)[:, shard.positions])


def _check_token_weight(rank: int, cp: int) -> None:
    shard = SequenceShard(8, cp, rank, dist.group.WORLD)
    gen = torch.Generator().manual_seed(3)
    logits, targets = torch.randn(2, 8, 5, generator=gen), torch.randint(0, 5, (2, 8), generator=gen)
    targets[0, :5] = -100  # rank 0 holds [0, 1, 6, 7]: its share of ignored tokens differs
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def loss(out, y):
        return F.cross_entropy(out.flatten(0, 1), y.flatten())

    local = weighted_loss(loss, shard)(shard.split(logits), shard.split(targets))
    dist.all_reduce(local)
    torch.testing.assert_close(local / cp, expected)
    # A rank whose targets are all ignored adds zero, not NaN, and still backpropagates.
    targets[:, rank_positions(8, cp, 1)] = -100
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    mine = shard.split(logits).requires_grad_()
    local = weighted_loss(loss, shard)(mine, shard.split(targets))
    local.backward()
    assert torch.isfinite(mine.grad).all() and (rank != 1 or not mine.grad.any())
    dist.all_reduce(local)
    torch.testing.assert_close(local.detach() / cp, expected)


def _check_model(rank: int, cp: int, ref_name: str, args: dict) -> None:
    """A model with its context_parallel hook: logits at this rank's positions and the
    gradients (summed over cp, as the dp x cp mean does) equal the single-process ones."""
    model_file = load_model_file(ref_name)
    torch.manual_seed(0)
    ref = model_file.build(args, device="cpu")
    torch.manual_seed(0)
    model = model_file.build(args, device="cpu")
    model.load_state_dict(ref.state_dict())
    shard = SequenceShard(16, cp, rank, dist.group.WORLD)
    model_file.hook("context_parallel")(model, shard)
    x, y = model_file.hook("batch")(2, model=ref, seed=5)
    loss = model_file.hook("loss")
    out_ref = ref(x)
    loss(out_ref, y).backward()
    out = model(shard.split(x))
    torch.testing.assert_close(out, out_ref[:, shard.positions], rtol=1e-5, atol=1e-6)
    (loss(out, shard.split(y)) / cp).backward()
    for (name, p), (_, p_ref) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        dist.all_reduce(p.grad)
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")




def test_two_cp_ranks_compute_what_one_process_does(tmp_path):
    spawn_workers(_worker, 2, ",".join(MODELS), tmp_path, timeout_s=150)


# -- smplan execute ------------------------------------------------------------------------------

STEPS = ("--steps", "6")


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    """Six steps of gpt.py:tiny on one process: what every cp layout must reproduce."""
    out = tmp_path_factory.mktemp("single") / "run"
    result = run_execute("mbs=1,gbs=4", out, *STEPS, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    return metrics(out)


@pytest.mark.parametrize("plan", [
    pytest.param("cp=2,mbs=1,gbs=4", id="cp"),
    pytest.param("cp=2,zero=3,mbs=1,gbs=4", id="cp-fsdp", marks=pytest.mark.slow),
    pytest.param("dp=2,cp=2,mbs=1,gbs=4", id="dp-cp", marks=pytest.mark.slow),
    pytest.param("tp=2,sp=1,cp=2,mbs=1,gbs=4", id="tp-sp-cp", marks=pytest.mark.slow),
    pytest.param("pp=2,cp=2,mbs=1,gbs=4", id="pp-cp", marks=pytest.mark.slow),
])
def test_execute_with_cp_ends_at_the_single_process_loss(tmp_path, single_process, plan):
    result = run_execute(plan, tmp_path / "cp", *STEPS, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    split = metrics(tmp_path / "cp")
    assert len(split) == len(single_process) == 6
    for one, many in zip(single_process, split, strict=True):
        assert many["loss"] == pytest.approx(one["loss"], rel=1e-4), (plan, one["step"], one["loss"], many["loss"])
        assert many["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)


@pytest.mark.slow  # moe under cp also runs in test_expert_parallel[cp2-ep2]
def test_moe_with_cp2_ends_at_the_single_process_loss(tmp_path):
    """examples/moe.py's hook (grouped-query and latent attention; routing on local tokens,
    dropless, so each token meets the same experts)."""
    runs = {}
    for plan in ("mbs=1,gbs=4", "cp=2,mbs=1,gbs=4"):
        result = run_execute(plan, tmp_path / plan, "--steps", "3", model=MOE_TINY, timeout=240)
        assert result.returncode == 0, result.stdout[-3000:]
        runs[plan] = [r["loss"] for r in metrics(tmp_path / plan)]
    assert runs["cp=2,mbs=1,gbs=4"] == pytest.approx(runs["mbs=1,gbs=4"], rel=1e-4)


@pytest.mark.slow
def test_cp2_resumes_bit_identically_after_sigkill(tmp_path):
    """As tests/executor/test_resume_matrix.py: SIGKILL a worker after the step-2 checkpoint."""
    args = ("--steps", "4", "--checkpoint-every", "2", "--arg", "dropout=0.1")
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    first = run_execute("cp=2,mbs=1,gbs=4", clean, *args, timeout=240)
    assert first.returncode == 0, first.stdout[-4000:]
    second = run_execute("cp=2,mbs=1,gbs=4", faulty, *args, "--max-restarts", "1",
                         env={"SMPLAN_FAIL_AT_STEP": "3"}, timeout=240)
    assert second.returncode == 0, second.stdout[-4000:]
    assert "at step 3" in rank_logs(faulty) and "resumed from" in second.stdout
    assert [r["loss"] for r in metrics(clean)] == [r["loss"] for r in metrics(faulty)]
    assert_same_state(checkpoint_state(clean / "checkpoints" / "step-4", tmp_path),
                      checkpoint_state(faulty / "checkpoints" / "step-4", tmp_path))
