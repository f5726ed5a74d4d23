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
