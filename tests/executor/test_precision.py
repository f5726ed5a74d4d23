"""Mixed precision as a plan's dtype runs (executor/precision.py): fp32 master weights, autocast
and FSDP2's casts on a GPU only, and GPU dtypes that cannot train as priced refused in one line."""

from __future__ import annotations

import pytest
import torch
from smplan.executor import precision
from smplan.executor.run import check_this_machine
from smplan.executor.validate import PlanMismatchError
from smplan.planner import Plan
from smplan.planner.grad_compress import parse as parse_grad_compress

NONE, BF16_REDUCE = parse_grad_compress("none"), parse_grad_compress("bf16")


@pytest.mark.parametrize(("dtype", "device", "computes"), [
    ("bf16", "cuda", torch.bfloat16), ("fp16", "cuda", torch.float16), ("fp8", "cuda", torch.bfloat16),
    ("fp32", "cuda", None), ("bf16", "cpu", None), ("fp8", "cpu", None),
])
def test_autocast_runs_on_a_gpu_in_the_plans_half_dtype(dtype, device, computes):
    assert precision.autocast_dtype(dtype, device) == computes


def test_master_weights_are_fp32_wherever_autocast_computes():
    """An hf: config saved in bf16 trained pure bf16 on a GPU, optimizer moments too, while the
    planner priced fp32 master weights and moments (a review)."""
    assert precision.keeps_fp32_master("bf16", "cuda") and precision.keeps_fp32_master("fp8", "cuda")
    assert precision.keeps_fp32_master("fp32", "cpu")
    assert not precision.keeps_fp32_master("bf16", "cpu")  # no autocast: the built dtype computes, and says so


def test_fsdp_gathers_half_parameters_and_reduces_fp32_on_a_gpu():
    """FSDP2's default policy all-gathered fp32 parameters: twice the bytes the cost model counts."""
    policy = precision.fsdp_policy("bf16", "cuda", NONE)
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
    assert precision.fsdp_policy("bf16", "cuda", BF16_REDUCE).reduce_dtype == torch.bfloat16
    assert precision.fsdp_policy("bf16", "cpu", NONE) is None  # CPU: FSDP2's default, as before
    cpu = precision.fsdp_policy("fp32", "cpu", BF16_REDUCE)
    assert cpu.param_dtype is None and cpu.reduce_dtype == torch.bfloat16


def test_gpu_dtypes_that_cannot_train_as_priced_say_what_to_plan_instead():
    assert "needs loss scaling" in precision.gpu_dtype_problem("fp16", bf16_supported=True)
    assert precision.gpu_dtype_problem("fp16", bf16_supported=True).endswith("--fix dtype=bf16")
    assert precision.gpu_dtype_problem("fp16", bf16_supported=False).endswith("--fix dtype=fp32")  # V100
    assert "not V100" in precision.gpu_dtype_problem("bf16", bf16_supported=False)
    assert precision.gpu_dtype_problem("bf16", bf16_supported=True) is None
    assert precision.gpu_dtype_problem("fp32", bf16_supported=False) is None


def test_execute_refuses_an_fp16_plan_on_gpus_before_launch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    plan = Plan(model="m.py", hw="v100x8", nodes=1, dp=8, global_batch=8, dtype="fp16")
    with pytest.raises(PlanMismatchError, match="dtype=fp16 needs loss scaling.*--fix dtype=fp32$"):
        check_this_machine(8, 1, 10**6, plan)


def test_the_cli_refuses_an_fp16_plan_on_a_gpu_in_one_line(cli_runner, monkeypatch, tmp_path):
    """Through `smplan execute`: one line, exit 2, no run folder made (nothing started)."""
    from smplan.cli.main import cli
    from tests.conftest import EXAMPLES

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    out = tmp_path / "run"
    result = cli_runner.invoke(cli, ["execute", "dp=2,mbs=1,gbs=2,dtype=fp16", "--model", f"{EXAMPLES}/gpt.py:tiny",
                                     "-o", str(out)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert lines[-1] == ("error: dtype=fp16 needs loss scaling, which smplan execute does not run (gradients would "
                         "underflow); plan again with --fix dtype=bf16"), result.output
    assert not (out / "metrics.jsonl").exists()
