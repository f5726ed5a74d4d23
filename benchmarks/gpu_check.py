"""Measured vs predicted on one lent GPU (an H200): four plans of a ~1B GPT (one in FP8) and an FP8 linear.

    benchmarks/gpu_check.sh [-o results.json] [--force] [--steps 8] [--budget-s 450]

For each plan (dp=1 on one GPU; micro-batch, recomputation, ZeRO stage and dtype differ) it asks
`smplan simulate --json` for the predicted step time and peak memory (bundled h200x8 profile),
writes the plan with that prediction, runs it with `smplan execute` (torchrun, one process,
nccl, bf16 autocast) and reads from summary.json the medians of the steps after the first and the run's peak memory.
Then one FP8 training step of a stack of linears through torchao's float8 (skipped, with a
line saying why, where torchao is not installed), next to bf16 and to the speed-up the cost
model predicts for those GEMMs. Prints one table and writes JSON to -o PATH or $OUT/gpu_check.json.

Without a GPU it stops at once with one line (exit 2). The whole check keeps under
`--budget-s` (default 450 s, inside the 8-minute target): a plan that would start past it is
reported as skipped. `assemble` and `format_table` are pure (unit-tested on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "examples" / "gpt.py")
# ~1.0 billion parameters (embedding 107M + 16 blocks x 50M + head 103M, `smplan profile`);
# GPT-2-style vocabulary padded to a multiple of 128; flash attention (sdpa), no dropout.
MODEL_ARGS = {"layers": 16, "hidden": 2048, "heads": 16, "seq_len": 2048, "vocab": 50304,
              "attention": "sdpa", "dropout": 0.0}
HW = "h200x8"
# dp=1 on one GPU: ZeRO has no group to shard over there, so zero only labels the plan.
PLANS = (
    ("mbs4", "dp=1,mbs=4,gbs=8,recompute=none,zero=0"),
    ("mbs8-full", "dp=1,mbs=8,gbs=8,recompute=full,zero=0"),
    ("mbs2-selective", "dp=1,mbs=2,gbs=8,recompute=selective,zero=1"),
    # the first plan with its blocks' linears in float8 (torchao, executor/float8.py); the
    # executor does not torch.compile, so torchao's casts run unfused (a gap, not an error)
    ("mbs4-fp8", "dp=1,mbs=4,gbs=8,recompute=none,zero=0,dtype=fp8"),
)
# FP8 check: a stack of square linears (Llama-3-8B-like width) on tokens x hidden inputs.
FP8_TOKENS, FP8_HIDDEN, FP8_LAYERS = 16384, 4096, 4
CLI = [sys.executable, "-c", "from smplan.cli.main import main; main()"]
FIGURE_KEYS = ("step_time_s", "tokens_per_s", "samples_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu",
               "mfu", "peak_memory_gib", "bubble_fraction", "breakdown", "usd_per_step", "memory_breakdown_gib")


class CheckError(Exception):
    """A reason to stop before measuring: one line, exit 2."""


# -- pure: rows, record, table ---------------------------------------------------------------
def error_pct(measured: float | None, predicted: float | None) -> float | None:
    """(predicted - measured) / measured in percent: > 0 means predicted too high."""
    if not measured or predicted is None:
        return None
    return 100.0 * (predicted - measured) / measured


def plan_row(name: str, plan: str, predicted: dict | None, summary: dict | None, skipped: str | None = None) -> dict:
    """One plan's result from the simulate figures and execute's summary.json."""
    pred = predicted or {}
    meas = (summary or {}).get("measured") or {}
    # torch.cuda.max_memory_allocated never sees the plan's reserve (CUDA context, fragmentation):
    # compare it with the predicted peak less that reserve, as `smplan execute`'s summary does.
    peak = pred.get("peak_memory_gib")
    if peak is not None:
        peak -= (pred.get("memory_breakdown_gib") or {}).get("reserve", 0.0)
    return {
        "name": name, "plan": plan, "skipped": skipped,
        "device": (summary or {}).get("device"), "compute_dtype": (summary or {}).get("compute_dtype"),
        "predicted_step_time_s": pred.get("step_time_s"), "measured_step_time_s": meas.get("step_time_s"),
        "step_time_error_pct": error_pct(meas.get("step_time_s"), pred.get("step_time_s")),
        "predicted_peak_memory_gib": peak, "measured_peak_memory_gib": meas.get("peak_memory_gib"),
        "peak_memory_error_pct": error_pct(meas.get("peak_memory_gib"), peak),
        "final_loss": meas.get("final_loss"),
    }


def assemble(rows: list[dict], fp8: dict, env: dict, elapsed_s: float) -> dict:
    """The JSON record: environment, one row per plan, the FP8 check and summary errors."""
    def mean_abs(key: str) -> float | None:
        done = [abs(r[key]) for r in rows if r[key] is not None]  # skipped plans left out
        return sum(done) / len(done) if done else None

    return {"check": "gpu_check", "model": MODEL_ARGS, "hw_profile": HW, "env": env, "elapsed_s": elapsed_s,
            "plans": rows, "fp8": fp8,
            "mean_abs_step_time_error_pct": mean_abs("step_time_error_pct"),
            "mean_abs_peak_memory_error_pct": mean_abs("peak_memory_error_pct")}


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(record: dict) -> str:
    """The one table gpu_check prints."""
    head = ("plan", "step s pred", "step s meas", "err %", "mem GiB pred", "mem GiB meas", "err %", "note")
    lines = [head]
    for r in record["plans"]:
        lines.append((r["plan"], _num(r["predicted_step_time_s"], ".3f"), _num(r["measured_step_time_s"], ".3f"),
                      _num(r["step_time_error_pct"], "+.1f"), _num(r["predicted_peak_memory_gib"], ".1f"),
                      _num(r["measured_peak_memory_gib"], ".1f"), _num(r["peak_memory_error_pct"], "+.1f"),
                      r["skipped"] or f"{r['device']} {r['compute_dtype']}"))
    fp8 = record["fp8"]
    if fp8.get("skipped"):
        lines.append(("fp8 linear", "-", "-", "-", "-", "-", "-", fp8["skipped"]))
    else:
        lines.append(("fp8 linear step", _num(fp8["predicted_speedup"], ".2f") + "x", _num(fp8["speedup"], ".2f") + "x",
                      _num(error_pct(fp8["speedup"], fp8["predicted_speedup"]), "+.1f"), "-", "-", "-",
                      f"bf16 {fp8['bf16_ms']:.2f} ms, fp8 {fp8['fp8_ms']:.2f} ms"))
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(head))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    errs = record["mean_abs_step_time_error_pct"], record["mean_abs_peak_memory_error_pct"]
    out.append(f"mean |error|: step time {_num(errs[0], '.1f')}%, peak memory {_num(errs[1], '.1f')}%"
               f"  ({record['env'].get('gpu', '?')}, torch {record['env'].get('torch', '?')}, {record['elapsed_s']:.0f} s)")
    return "\n".join(out)


# -- measuring (needs the GPU) -----------------------------------------------------------------
def gpu_problem() -> str | None:
    try:
        import torch
    except ImportError:
        return "gpu_check: torch is not importable; run it with the python that has PyTorch"
    if not torch.cuda.is_available():
        return "gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False); run it on a GPU machine"
    return None


def output_path(arg: str | None, force: bool) -> Path:
    if arg is None and not os.environ.get("OUT"):
        raise CheckError("gpu_check: give -o PATH for the JSON (or set OUT to a folder)")
    path = Path(arg) if arg else Path(os.environ["OUT"]) / "gpu_check.json"
    if not path.parent.is_dir():
        raise CheckError(f"gpu_check: folder {path.parent} does not exist; create it or choose another -o")
    if path.exists() and not force:
        raise CheckError(f"gpu_check: {path} exists; pass --force to overwrite it or choose another -o")
    return path


def _model_flags() -> list[str]:
    return [f for k, v in MODEL_ARGS.items() for f in ("--arg", f"{k}={v}")]


def predict(plan: str, workdir: Path, timeout_s: float) -> tuple[Path, dict]:
    """`smplan simulate --json` of the inline plan; the plan file with its prediction."""
    cmd = [*CLI, "simulate", MODEL, *_model_flags(), "--hw", HW, "--nodes", "1", "--plan", plan, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, check=False)
    if out.returncode:
        raise RuntimeError(f"smplan simulate failed: {out.stderr.strip().splitlines()[-1:]}")
    sim = json.loads(out.stdout)
    data = dict(sim["plan"])
    data["predicted"] = {k: sim[k] for k in FIGURE_KEYS if k in sim}
    path = workdir / "plan.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path, data["predicted"]


def measure(plan_path: Path, run_dir: Path, steps: int, timeout_s: float) -> dict:
    """`smplan execute PLAN.json` on this GPU; its summary.json."""
    cmd = [*CLI, "execute", str(plan_path), "--steps", str(steps), "-o", str(run_dir), "--grad-norms-every", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, check=False)
    if out.returncode:
        raise RuntimeError(f"smplan execute failed (exit {out.returncode}): {(out.stdout + out.stderr)[-600:]}")
    return json.loads((run_dir / "summary.json").read_text())


def fp8_check(iters: int = 10) -> dict:
    """Forward + backward of FP8_LAYERS bf16 linears, then the same converted by torchao's
    convert_to_float8_training (tensorwise scaling), both under torch.compile as torchao
    recommends; the cost model's predicted speed-up is that of the same GEMMs at fp8 vs bf16."""
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError:
        return {"skipped": "torchao is not installed (pip install torchao): FP8 linear check skipped"}
    import torch

    if torch.cuda.get_device_capability() < (8, 9):
        return {"skipped": "this GPU has no FP8 tensor cores (compute capability < 8.9): FP8 check skipped"}

    def build():
        layers = [torch.nn.Linear(FP8_HIDDEN, FP8_HIDDEN, bias=False) for _ in range(FP8_LAYERS)]
        return torch.nn.Sequential(*layers).to("cuda", torch.bfloat16)

    x = torch.randn(FP8_TOKENS, FP8_HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def time_ms(model) -> float:
        step = torch.compile(model)
        for _ in range(3):
            step(x).float().square().mean().backward()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            step(x).float().square().mean().backward()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters

    bf16_ms = time_ms(build())
    fp8_ms = time_ms(convert_to_float8_training(build()))
    return {"bf16_ms": bf16_ms, "fp8_ms": fp8_ms, "speedup": bf16_ms / fp8_ms,
            "predicted_speedup": predicted_fp8_speedup(), "shape": [FP8_TOKENS, FP8_HIDDEN, FP8_LAYERS]}


def predicted_fp8_speedup() -> float:
    """The cost model's bf16 / fp8 time of one linear's forward, data-gradient and weight-gradient GEMMs."""
    from smplan.hwprofiles import load_cluster
    from smplan.hwprofiles.perf import matmul_time_s

    cluster = load_cluster(HW)
    t, h = FP8_TOKENS, FP8_HIDDEN
    shapes = ((t, h, h), (t, h, h), (h, h, t))  # y = x W, dx = dy W^T, dW = x^T dy
    return (sum(matmul_time_s(m, n, k, cluster, "bf16") for m, n, k in shapes)
            / sum(matmul_time_s(m, n, k, cluster, "fp8") for m, n, k in shapes))


def environment() -> dict:
    import torch

    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())), "hostname": os.uname().nodename}


def run(args) -> dict:
    import tempfile

    start = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        for name, plan in PLANS:
            left = args.budget_s - (time.monotonic() - start)
            if left < 60:
                rows.append(plan_row(name, plan, None, None, skipped=f"skipped: under 60 s of --budget-s {args.budget_s:g} left"))
                continue
            work = Path(tmp) / name
            work.mkdir()
            predicted = summary = None
            try:
                path, predicted = predict(plan, work, timeout_s=min(left, 120))
                summary = measure(path, work / "run", args.steps, timeout_s=left - 30)
                rows.append(plan_row(name, plan, predicted, summary))
            except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as err:
                rows.append(plan_row(name, plan, predicted, summary, skipped=f"failed: {str(err).splitlines()[-1][:200]}"))
            print(f"[gpu_check] {name}: {rows[-1]['skipped'] or 'done'} ({time.monotonic() - start:.0f} s)",
                  file=sys.stderr, flush=True)
        fp8 = fp8_check() if args.budget_s - (time.monotonic() - start) > 45 else {
            "skipped": "skipped: the time budget is spent"}
    return assemble(rows, fp8, environment(), time.monotonic() - start)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=None, help="JSON file (default $OUT/gpu_check.json)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing -o file")
    ap.add_argument("--steps", type=int, default=8, help="training steps per plan (the first is warm-up)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop starting plans past this many seconds")
    args = ap.parse_args(argv)
    try:
        problem = gpu_problem()
        if problem:
            raise CheckError(problem)
        out = output_path(args.output, args.force)
    except CheckError as err:
        print(err, file=sys.stderr)
        return 2
    record = run(args)
    print(format_table(record))
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
