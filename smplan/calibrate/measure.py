"""Run plans for real with the executor and read back their measured step times."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from smplan.planner.plan import Plan


@dataclass(frozen=True)
class Measured:
    plan: Plan
    label: str
    step_time_s: float | None  # fastest step after the first (see `steady_step_s`); None: failed
    run_dir: str
    error: str = ""
    median_step_time_s: float | None = None  # the executor's summary figure


@contextlib.contextmanager
def output_to(path: Path):
    """Send this process's stdout/stderr file descriptors (and so the workers') to `path`.

    The workers print a line per step; under `--json` the command's stdout must stay one
    JSON object, so their output goes to the run's log instead of the terminal.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def device_dtype() -> tuple[str, str]:
    """("cpu", "fp32"), ("cuda", "bf16"), or ("cuda", "fp32") on GPUs without bf16 (V100): the
    dtype the executor really computes in.

    The executor runs fp32 on CPU whatever the plan says (executor/train.py), so a
    prediction for a CPU run must be made for fp32 too; it refuses fp16, which would need
    loss scaling (executor/precision.py).
    """
    import torch

    if not torch.cuda.is_available():
        return ("cpu", "fp32")
    return ("cuda", "bf16" if torch.cuda.is_bf16_supported() else "fp32")


def run_plan(plan: Plan, label: str, model_file, steps: int, nproc: int, run_dir: Path) -> Measured:
    """Execute `plan` for `steps` steps on `nproc` local processes (gloo on CPU, nccl on GPU)."""
    from smplan.executor import ExecuteOptions, LaunchError, execute

    run_dir.mkdir(parents=True, exist_ok=True)
    opts = ExecuteOptions(steps=steps, nproc_per_node=nproc, out=str(run_dir))
    try:
        with output_to(run_dir / "workers.log"):
            result = execute(plan, model_file, opts)
    except LaunchError as err:
        return Measured(plan, label, None, str(run_dir), failure_line(str(err), run_dir))
    median_s = (result.summary or {}).get("measured", {}).get("step_time_s")
    fastest = steady_step_s(run_dir)
    if fastest is None:
        return Measured(plan, label, None, str(run_dir), f"no steps in {run_dir}/metrics.jsonl; see workers.log")
    return Measured(plan, label, fastest, str(run_dir), median_step_time_s=median_s)


def steady_step_s(run_dir: Path) -> float | None:
    """The fastest step after the first (warm-up: allocator, gloo connections, autograd).

    The minimum, not the median: other processes on a shared machine only ever add time,
    so the fastest repeat is the best estimate of the plan's own cost (Python `timeit`
    docs, "Note": take the min; Chen & Revels 2016, "Robust benchmarking in noisy
    environments").
    """
    from smplan.executor.metrics import read_metrics

    try:
        records = read_metrics(run_dir)
    except (OSError, ValueError):
        return None
    steady = records[1:] or records
    return min(r["step_time_s"] for r in steady) if steady else None


def failure_line(report: str, run_dir: Path) -> str:
    """One line of execute's failure report for calibrate's progress: which rank failed and its
    exception (the report's last `  | ` line), not the traceback's lines nor execute's advice on
    resuming a run folder calibrate made for itself."""
    lines = [line for line in report.splitlines() if line.strip()]
    head = (lines[0] if lines else "the run failed").rstrip(":")
    body = [line.strip().removeprefix("|").strip() for line in lines[1:] if line.lstrip().startswith("|")]
    return f"{head}: {body[-1]}; see {run_dir}/workers.log" if body else f"{head}; see {run_dir}/workers.log"
