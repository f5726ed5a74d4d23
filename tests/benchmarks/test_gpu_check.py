"""benchmarks/gpu_check: the table and JSON assembly (fake measurements: formatting only), the
plan file it writes (a real `smplan simulate` of the ~1B model, on the meta device), and the
one-line refusal on a machine without a GPU (this CI machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from smplan.planner.plan import Plan

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402

PLAN = gpu_check.PLANS[0][1]


def _record(fp8=None):
    predicted = {"step_time_s": 0.30, "peak_memory_gib": 40.0}
    summary = {"device": "cuda:0", "compute_dtype": "bf16",
               "measured": {"step_time_s": 0.25, "peak_memory_gib": 50.0, "final_loss": 9.1}}
    rows = [gpu_check.plan_row("a", PLAN, predicted, summary),
            gpu_check.plan_row("b", "dp=1,mbs=8,gbs=8", None, None, skipped="skipped: budget")]
    fp8 = fp8 or {"bf16_ms": 10.0, "fp8_ms": 6.0, "speedup": 10 / 6, "predicted_speedup": 1.9, "shape": [1, 2, 3]}
    env = {"gpu": "NVIDIA H200", "torch": "2.11.0"}
    return gpu_check.assemble(rows, fp8, env, elapsed_s=123.4)


def test_rows_and_record():
    record = _record()
    a, b = record["plans"]
    assert a["step_time_error_pct"] == pytest.approx(20.0)  # predicted 0.30 vs measured 0.25: +20%
    assert a["peak_memory_error_pct"] == pytest.approx(-20.0)
    assert b["step_time_error_pct"] is None and b["skipped"] == "skipped: budget"
    assert record["mean_abs_step_time_error_pct"] == pytest.approx(20.0)  # skipped rows left out
    assert json.loads(json.dumps(record)) == record
    reserved = gpu_check.plan_row("c", PLAN, {"step_time_s": 0.3, "peak_memory_gib": 42.0,
                                              "memory_breakdown_gib": {"reserve": 2.0}},
                                  {"measured": {"step_time_s": 0.25, "peak_memory_gib": 50.0}})
    assert reserved["predicted_peak_memory_gib"] == 40.0 and reserved["peak_memory_error_pct"] == pytest.approx(-20.0)


def test_table_has_one_line_per_plan_and_the_fp8_row():
    text = gpu_check.format_table(_record())
    lines = text.splitlines()
    assert lines[0].split()[0] == "plan" and set(lines[1]) <= {"-", " "}
    assert len(lines) == 2 + 2 + 1 + 1  # header, rule, two plans, fp8, mean line
    assert PLAN in lines[2] and "+20.0" in lines[2] and "-20.0" in lines[2] and "cuda:0 bf16" in lines[2]
    assert lines[3].count(" - ") >= 3 and "skipped: budget" in lines[3]
    assert "1.90x" in lines[4] and "1.67x" in lines[4] and "bf16 10.00 ms, fp8 6.00 ms" in lines[4]
    assert lines[5].startswith("mean |error|: step time 20.0%, peak memory 20.0%")
    skipped = gpu_check.format_table(_record(fp8={"skipped": "torchao is not installed"}))
    assert "torchao is not installed" in skipped.splitlines()[4]


def test_predict_writes_a_plan_with_its_prediction(tmp_path):
    path, predicted = gpu_check.predict(PLAN, tmp_path, timeout_s=300)
    plan = Plan.load(path)
    assert plan.predicted is not None and plan.predicted.step_time_s == pytest.approx(predicted["step_time_s"])
    assert (plan.dp, plan.micro_batch, plan.global_batch, plan.world_size) == (1, 4, 8, 1)
    assert plan.model_args["hidden"] == 2048 and plan.hw == gpu_check.HW
    assert 0 < predicted["peak_memory_gib"] < 141  # fits the H200
    assert gpu_check.predicted_fp8_speedup() > 1.0


def _one_line_exit_2(proc):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no CUDA GPU" in lines[0] and not proc.stdout


@pytest.mark.skipif(gpu_check.gpu_problem() is None, reason="a GPU is visible here")
def test_no_gpu_is_one_line(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    _one_line_exit_2(subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "-o", str(tmp_path / "r.json")],
                                    capture_output=True, text=True, env=env, timeout=120))
    _one_line_exit_2(subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "-o",
                                     str(tmp_path / "r.json")], capture_output=True, text=True, timeout=120))
    assert not (tmp_path / "r.json").exists()
