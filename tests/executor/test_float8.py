"""dtype=fp8 in the executor: the blocks' linears become torchao float8 linears (on CPU too,
where torch._scaled_mm runs), the head does not, and what cannot run is refused in one line."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from smplan.executor.float8 import (
    Float8Unavailable,
    convert_blocks,
    convertible,
    fp8_device_problem,
    fp8_line,
    fp8_plan_problem,
    torchao_float8,
)
from torch import nn

from tests.conftest import EXAMPLES
from tests.executor.runs import metrics, run_execute


class _Block(nn.Module):
    def __init__(self, width: int, odd: int):
        super().__init__()
        self.up, self.down, self.odd = nn.Linear(width, 2 * width), nn.Linear(2 * width, width), nn.Linear(width, odd)


def _model(width=32):
    model = nn.Module()
    model.blocks = nn.ModuleList([_Block(width, 10), nn.Linear(width, width)])  # a block may be a Linear itself
    model.head = nn.Linear(width, 64)
    return model


def test_the_blocks_linears_with_dims_of_16_become_float8_and_nothing_else():
    torchao_float8()
    from torchao.float8.float8_linear import Float8Linear

    model = _model()
    assert convert_blocks(model, list(model.blocks)) == (3, 4, 0)  # up, down and the Linear block; not odd (10)
    block, linear_block = model.blocks
    assert isinstance(block.up, Float8Linear) and isinstance(block.down, Float8Linear)
    assert isinstance(linear_block, Float8Linear)  # replaced in its parent, not only returned
    assert type(block.odd) is nn.Linear and type(model.head) is nn.Linear  # the head stays as planned


def test_moe_routers_stay_unconverted():
    """A router with 16 experts has dims of 16 too; top-k on e4m3 scores would pick other experts."""
    from smplan.planner.model_file import load_model_file
    from torchao.float8.float8_linear import Float8Linear

    from smplan.model.structure import find_layout, owned_blocks

    model = load_model_file(str(EXAMPLES / "moe.py:tiny")).build({"experts": 16, "top_k": 2}, device="meta")
    blocks = [b for _, b in owned_blocks(model, find_layout(model))]
    converted, linears, banks = convert_blocks(model, blocks)
    assert converted == linears > 0 and banks == 3  # tiny: 3 MoE blocks, each one bank left in bf16
    routers = [m for n, m in model.named_modules() if n.endswith("mlp.router")]
    assert routers and not any(isinstance(m, Float8Linear) for r in routers for m in r.modules())


def test_a_float8_linear_computes_close_to_but_not_exactly_the_linear():
    torch.manual_seed(0)
    model = _model()
    reference = _model()
    reference.load_state_dict(model.state_dict())
    convert_blocks(model, list(model.blocks))
    x = torch.randn(64, 32)
    out, ref = model.blocks[0].up(x), reference.blocks[0].up(x)
    assert not torch.equal(out, ref)  # e4m3 has 3 mantissa bits: the result moves
    assert torch.allclose(out, ref, rtol=0.1, atol=0.1)


def test_convertible_needs_both_dims_a_multiple_of_16():
    assert convertible(nn.Linear(32, 48)) and not convertible(nn.Linear(32, 40))
    assert not convertible(nn.Linear(8, 32)) and not convertible(nn.Conv1d(16, 16, 1))


def test_what_the_executor_cannot_run_in_fp8_is_said_with_the_fix():
    assert fp8_plan_problem("tensor") is None
    assert "use fp8_scaling=tensor" in fp8_plan_problem("block")
    assert fp8_device_problem(None) is None and fp8_device_problem((9, 0)) is None and fp8_device_problem((8, 9)) is None
    assert "this one has 8.0: use dtype=bf16" in fp8_device_problem((8, 0))  # A100: no FP8 units
    assert "nothing runs in float8" in fp8_line(0, 4)
    assert fp8_line(3, 4).startswith("fp8: 3 of the 4 linears") and "expert bank" not in fp8_line(3, 4)
    assert "the 2 expert banks too, although the plan priced them in fp8" in fp8_line(3, 4, expert_banks=2)


def test_a_torch_without_cpu_scaled_mm_is_refused_in_one_line(monkeypatch):
    def missing(*args, **kwargs):
        raise RuntimeError('"_scaled_mm" not implemented for \'CPU\'')

    monkeypatch.setattr(torch, "_scaled_mm", missing)
    problem = fp8_device_problem(None)
    assert problem.startswith("dtype=fp8 on CPU needs torch._scaled_mm for CPU, which torch ")
    assert problem.endswith("run it on a GPU with FP8 units, or use dtype=bf16")


def test_without_torchao_the_fix_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import raises ImportError
    with pytest.raises(Float8Unavailable, match=r"pip install 'smplan\[fp8\]'"):
        torchao_float8()


def test_execute_refuses_fp8_it_cannot_run_in_one_line(tmp_path):
    result = run_execute("dp=1,mbs=1,gbs=2,dtype=fp8,fp8_scaling=block", tmp_path / "run", "--steps", "1", timeout=60)
    assert result.returncode == 2, result.stdout
    assert result.stdout.strip().splitlines() == [
        "error: fp8_scaling=block has no torchao float8 training recipe this executor runs (it runs tensor); "
        "use fp8_scaling=tensor"]
    assert not (tmp_path / "run").exists()


def test_an_fp8_run_trains_in_float8_and_ends_near_the_full_precision_loss(tmp_path):
    """FSDP2 (zero=3) over 2 ranks in fp8 against plain DDP in fp32: the same data and initial
    weights, so the losses differ only by float8's rounding."""
    fp8, full = tmp_path / "fp8", tmp_path / "fp32"
    result = run_execute("dp=2,zero=3,mbs=2,gbs=4,dtype=fp8", fp8, "--steps", "6")
    assert result.returncode == 0, result.stdout
    assert "fp8: 16 of the 16 linears in this rank's blocks run in float8 (torchao, tensorwise scaling)" in result.stdout
    assert "Failed to load" not in result.stdout  # torchao's import noise is silenced
    assert json.loads((fp8 / "summary.json").read_text())["compute_dtype"] == "fp8"
    assert run_execute("dp=2,mbs=2,gbs=4", full, "--steps", "6").returncode == 0
    got, want = [r["loss"] for r in metrics(fp8)], [r["loss"] for r in metrics(full)]
    assert got[0] != want[0]  # float8 GEMMs ran
    assert got == pytest.approx(want, rel=5e-3)


@pytest.mark.slow  # CI time: a second layout of fp8 (FSDP above)
def test_fp8_under_tp_and_sp_rounds_as_fsdp_does(tmp_path):
    """tensor parallel with sequence parallel: torchao takes each scale's amax over the whole
    DTensor, so the sharded run rounds as the unsharded one does."""
    fsdp, tp = tmp_path / "fp8", tmp_path / "tp"
    assert run_execute("dp=2,zero=3,mbs=2,gbs=4,dtype=fp8", fsdp, "--steps", "6").returncode == 0
    assert run_execute("tp=2,sp=true,mbs=2,gbs=4,dtype=fp8", tp, "--steps", "6").returncode == 0
    assert [r["loss"] for r in metrics(tp)] == pytest.approx([r["loss"] for r in metrics(fsdp)], rel=1e-4)


@pytest.mark.parametrize("breaks, says", [
    ("torchao", "dtype=fp8 trains with torchao's float8 linears, which are not installed: pip install 'smplan[fp8]'"),
    ("scaled_mm", "dtype=fp8 on CPU needs torch._scaled_mm for CPU, which torch "),
])
def test_execute_without_what_fp8_needs_is_one_line_exit_2(cli_runner, tmp_path, monkeypatch, breaks, says):
    """Through the CLI: refused before anything is written, in one line, exit 2."""
    from smplan.cli.main import cli

    if breaks == "torchao":
        monkeypatch.setitem(sys.modules, "torchao.float8", None)
    else:
        monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no CPU kernel")))
    out = tmp_path / "run"
    result = cli_runner.invoke(cli, ["execute", "dp=2,mbs=1,gbs=2,dtype=fp8", "--model", str(EXAMPLES / "gpt.py:tiny"),
                                     "--steps", "1", "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {says}") and "Traceback" not in result.output
    assert not out.exists()
