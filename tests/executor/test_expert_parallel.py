"""Expert parallelism run for real (executor/expert_parallel.py) on examples/moe.py:tiny (4
experts per bank, top 2, dropless routing): ep only moves the experts, so every layout ends
at the single-process loss, each rank holds only its experts, the expert gradients equal
the single-process ones, and a SIGKILLed run resumes bit for bit from its DCP checkpoint
(which also resumes as ep=1)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.executor.gloo_group import gloo_group
from tests.executor.runs import (
    assert_same_state,
    checkpoint_state,
    metrics,
    rank_logs,
    run_execute,
    spawn_workers,
)

MOE = str(Path(__file__).resolve().parents[2] / "examples" / "moe.py") + ":tiny"
STEPS = 6
RTOL = 1e-4


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("moe-reference")
    result = run_execute("mbs=1,gbs=4", out, "--steps", str(STEPS), model=MOE, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:]
    return metrics(out)


@pytest.mark.parametrize("plan", [
    pytest.param("dp=2,ep=1,mbs=1,gbs=4", id="dp2-ep1", marks=pytest.mark.slow),
    pytest.param("dp=2,ep=2,mbs=1,gbs=4", id="dp2-ep2-ddp"),
    pytest.param("dp=2,ep=2,zero=3,mbs=1,gbs=4", id="dp2-ep2-fsdp", marks=pytest.mark.slow),
    pytest.param("tp=2,ep=2,mbs=1,gbs=4", id="tp2-ep2"),  # the tp ranks split the slots
    # the experts fold over the cp ranks too; slow for CI time: the fold over tp and dp runs above
    pytest.param("cp=2,ep=2,mbs=1,gbs=4", id="cp2-ep2", marks=pytest.mark.slow),
    pytest.param("tp=2,dp=2,ep=2,zero=1,mbs=1,gbs=4", id="tp2-dp2-ep2-edp2", marks=pytest.mark.slow),
    pytest.param("pp=2,tp=2,ep=2,mbs=1,gbs=4", id="pp2-tp2-ep2", marks=pytest.mark.slow),
    pytest.param("dp=4,ep=2,zero=3,mbs=1,gbs=4", id="dp4-ep2-zero3-edp2", marks=pytest.mark.slow),
])
def test_expert_parallelism_is_a_pure_layout_change(tmp_path, single_process, plan):
    result = run_execute(plan, tmp_path / "run", "--steps", str(STEPS), model=MOE, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:]
    got = metrics(tmp_path / "run")
    assert len(got) == STEPS
    for mine, ref in zip(got, single_process, strict=True):
        assert mine["loss"] == pytest.approx(ref["loss"], rel=RTOL), (plan, mine["step"])
        # before clipping: an expert gradient off by a factor (edp vs dp average) shows here
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=RTOL), (plan, mine["step"])


@pytest.mark.parametrize("plan", [
    pytest.param("dp=2,ep=2,mbs=1,gbs=4", id="dp2-ep2", marks=pytest.mark.slow),
    # ZeRO: the experts also sharded over edp by FSDP, saved whole by DCP all the same
    pytest.param("dp=4,ep=2,zero=1,mbs=1,gbs=4", id="dp4-ep2-zero1-edp2", marks=pytest.mark.slow),
])
def test_sigkill_and_restart_with_experts_sharded_is_bit_identical(tmp_path, single_process, plan):
    args = ("--steps", "4", "--checkpoint-every", "2")
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    first = run_execute(plan, clean, *args, model=MOE, timeout=240)
    assert first.returncode == 0, first.stdout[-4000:]
    second = run_execute(plan, faulty, *args, "--max-restarts", "1", env={"SMPLAN_FAIL_AT_STEP": "3"},
                         model=MOE, timeout=240)
    assert second.returncode == 0, second.stdout[-4000:]
    assert "at step 3" in rank_logs(faulty) and "resumed from" in second.stdout
    assert [r["loss"] for r in metrics(clean)] == [r["loss"] for r in metrics(faulty)]
    a = checkpoint_state(clean / "checkpoints" / "step-4", tmp_path)
    b = checkpoint_state(faulty / "checkpoints" / "step-4", tmp_path)
    assert_same_state(a, b)
    # DCP holds every expert once, whole: a checkpoint of ep=2 resumes as ep=1 (resharded)
    assert a["model.blocks.0.mlp.experts.w1"].shape == (4, 32, 32)
    resharded = tmp_path / "ep1"
    third = run_execute("dp=2,ep=1,mbs=1,gbs=4", resharded, "--steps", str(STEPS), "--checkpoint-dir",
                        str(clean / "checkpoints"), "--force-resume", model=MOE, timeout=240)  # saving none there
    assert third.returncode == 0 and "resumed from" in third.stdout, third.stdout[-4000:]
    after = metrics(resharded)
    assert [r["step"] for r in after] == [5, 6]
    for mine, ref in zip(after, single_process[4:], strict=True):
        assert mine["loss"] == pytest.approx(ref["loss"], rel=RTOL)


# -- in-process workers: what each rank holds, and its gradients -------------------------------


def _shard_worker(rank: int, world: int, spec: str, init_file: str) -> None:
    from smplan.executor.build import build_model_parts, full_initial_state
    from smplan.executor.expert_parallel import reduce_expert_grads
    from smplan.executor.mesh import ParallelDims
    from smplan.executor.run import resolve_plan
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    with gloo_group(init_file, rank, world):
        plan, mf = resolve_plan(spec, model=MOE)
        dims = ParallelDims(plan.pp, plan.dp, plan.tp, world, ep=plan.ep)
        dims.build_mesh("cpu")
        parts = build_model_parts(plan, mf, dims, torch.device("cpu"), seed=7, loss_fn=None)
        ep_rank, per = dims["ep"].get_local_rank(), 4 // plan.ep  # tiny: 4 experts per bank
        (chunk,) = parts.chunks
        # the single-process model and its gradient over the whole global batch
        reference = mf.build({}, device=None)
        reference.load_state_dict(full_initial_state(mf, {}, 7))
        x, y = mf.hook("batch")(plan.global_batch, model=reference, seed=3)
        mf.hook("loss")(reference(x), y).backward()
        ref_params = dict(reference.named_parameters())
        # this rank's share of the batch through the parallel model
        mine = slice(dims.coord("dp") * plan.micro_batch, (dims.coord("dp") + 1) * plan.micro_batch)
        mf.hook("loss")(chunk(x[mine]), y[mine]).backward()
        reduce_expert_grads(parts.expert_banks, dims["edp"], plan.dp)
        experts = 0
        edp = dims["edp"].size() if plan.zero else 1  # ZeRO also shards the experts over edp
        for name, p in chunk.named_parameters():
            name = name.removeprefix("module.")
            ref = ref_params[name]
            if ".experts." in name and edp > 1:
                experts += 1
                assert isinstance(p, DTensor) and p.device_mesh.mesh_dim_names == ("edp", "ep"), (spec, name)
                assert p.to_local().numel() * plan.ep * edp == ref.numel(), (spec, name, p.to_local().shape)
                assert torch.equal(p.full_tensor(), ref.detach()), f"{spec}: initial {name} differs"
                torch.testing.assert_close(p.grad.full_tensor(), ref.grad, rtol=1e-5, atol=1e-7)
            elif ".experts." in name:
                experts += 1
                assert isinstance(p, DTensor) and p.to_local().shape[0] == per, (spec, name, p.shape)
                local = slice(ep_rank * per, (ep_rank + 1) * per)
                assert torch.equal(p.to_local(), ref.detach()[local]), f"{spec}: initial {name} differs"
                torch.testing.assert_close(p.grad.to_local(), ref.grad[local], rtol=1e-5, atol=1e-7)
            elif isinstance(p, DTensor):  # FSDP-sharded dense parameter
                assert torch.equal(p.full_tensor(), ref.detach()), f"{spec}: {name} differs"
                torch.testing.assert_close(p.grad.full_tensor(), ref.grad, rtol=1e-5, atol=1e-7)
            else:
                assert torch.equal(p.detach(), ref.detach()), f"{spec}: {name} differs"
                torch.testing.assert_close(p.grad, ref.grad, rtol=1e-5, atol=1e-7)
        assert experts == 9  # w1, w2, w3 of the three MoE blocks


def test_each_rank_holds_its_experts_and_their_single_process_gradient(tmp_path):
    spawn_workers(_shard_worker, 2, "dp=2,ep=2,mbs=2,gbs=4", tmp_path, timeout_s=180)


@pytest.mark.slow
def test_expert_gradients_are_summed_over_edp(tmp_path):
    """dp=4, ep=2: two ranks hold each expert (edp=2), and their gradients meet."""
    spawn_workers(_shard_worker, 4, "dp=4,ep=2,mbs=1,gbs=4", tmp_path, timeout_s=240)


@pytest.mark.slow
def test_zero_shards_the_experts_over_edp(tmp_path):
    """dp=4, ep=2, zero=3: each expert lives on an edp pair, FSDP halves it again (1/4 of a
    bank per rank), and the gradients FSDP reduce-scatters equal the single-process ones."""
    spawn_workers(_shard_worker, 4, "dp=4,ep=2,zero=3,mbs=1,gbs=4", tmp_path, timeout_s=240)


def test_the_expert_grid_must_fold_into_the_dp_x_cp_x_tp_ranks():
    from smplan.executor.mesh import MeshError, ParallelDims

    assert ParallelDims(pp=1, dp=2, tp=2, world_size=4, ep=4).ep_enabled
    assert ParallelDims(pp=1, dp=1, tp=2, cp=2, world_size=4, ep=4).ep_enabled
    with pytest.raises(MeshError, match="ep=4 must divide dp\\*cp\\*tp=6"):
        ParallelDims(pp=1, dp=3, tp=2, world_size=6, ep=4)


# One process builds moe.py:tiny recomputing every block fully: its dense layer is checkpointed, its embedding not.
WRAPPED = """
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://{init}", rank=0, world_size=1)
from smplan.executor.build import build_model_parts
from smplan.executor.mesh import ParallelDims
from smplan.planner.model_file import load_model_file
from smplan.planner.plan import Plan, even_stages
plan = Plan(model="{model}", hw="local", nodes=1, global_batch=4, dtype="fp32", stages=even_stages(3, 1, "full"))
dims = ParallelDims(1, 1, 1, 1, gpus_per_node=1)
dims.build_mesh("cpu")
chunk = build_model_parts(plan, load_model_file("{model}"), dims, torch.device("cpu"), seed=1, loss_fn=None).chunks[0]
print(type(chunk.dense).__name__, type(chunk.embed).__name__)
dist.destroy_process_group()
"""


def test_recomputing_the_dense_layer_before_the_blocks_keeps_the_losses(tmp_path, single_process):
    """A rank recomputing a block with full or sac recomputes moe.py's dense layer too (as the
    planner prices it: memory_model.pre_recompute); the losses stay the single process's."""
    from smplan.planner.memory_model import device_recompute_kind
    from smplan.planner.plan import Stage

    # pp=2, v=2: device 0 holds stages 0 and 2; its second chunk recomputes, so its first's parts do too
    stages = [Stage(0, 1, "full", 0), Stage(1, 2, "none", 0), Stage(2, 3, "full", 1), Stage(3, 4, "none", 0)]
    assert device_recompute_kind(stages, 0, 2) == "full" and device_recompute_kind(stages, 1, 2) is None
    built = subprocess.run([sys.executable, "-c", WRAPPED.format(model=MOE, init=tmp_path / "init")], capture_output=True,
                           text=True, timeout=120)
    assert built.stdout.split() == ["CheckpointWrapper", "Embedding"], built.stdout + built.stderr
    result = run_execute("mbs=1,gbs=4,recompute=full", tmp_path / "run", "--steps", str(STEPS), model=MOE, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:]
    for ref, got in zip(single_process, metrics(tmp_path / "run"), strict=True):
        assert got["loss"] == pytest.approx(ref["loss"], rel=RTOL)
