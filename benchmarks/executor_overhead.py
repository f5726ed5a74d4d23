"""smplan execute's step time for a DDP plan next to a plain torchrun DDP script.

    python benchmarks/executor_overhead.py [--steps 30] [--repeats 2]

Both run the same model (examples/gpt.py, a small GPT that takes ~0.1 s a step on two CPU
cores), the same batches, AdamW and clipping, with 2 gloo processes. Target: ratio <= 1.05.
The runs alternate and each side's best median counts, so a noisy neighbour on a shared
machine hurts both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "examples" / "gpt.py")
ARGS = ["layers=4", "hidden=256", "heads=8", "seq_len=128", "vocab=1024", "dropout=0.0"]
MBS, GBS = 4, 16


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def run_smplan(steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-c", "from smplan.cli.main import main; main()", "execute",
               f"dp=2,zero=0,mbs={MBS},gbs={GBS}", "--model", MODEL, "--steps", str(steps), "--out", tmp]
        for a in ARGS:
            cmd += ["--arg", a]
        subprocess.run(cmd, check=True, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, timeout=900)
        return json.loads((Path(tmp) / "summary.json").read_text())["measured"]["step_time_s"]


def run_plain(steps: int) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "benchmarks" / "plain_ddp.py"), "--model", MODEL, "--steps", str(steps),
           "--mbs", str(MBS), "--gbs", str(GBS)]
    for a in ARGS:
        cmd += ["--arg", a]
    out = subprocess.run(cmd, check=True, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=900)
    line = next(line for line in out.stdout.splitlines() if line.startswith("{"))
    return json.loads(line)["median_step_time_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    ours, plain = [], []
    for _ in range(args.repeats):
        plain.append(run_plain(args.steps))
        ours.append(run_smplan(args.steps))
    best_ours, best_plain = min(ours), min(plain)
    print(f"model: examples/gpt.py {' '.join(ARGS)}  dp=2 mbs={MBS} gbs={GBS}, gloo, 2 processes")
    print(f"plain torchrun DDP : {best_plain * 1e3:8.1f} ms/step  (medians {[round(t * 1e3, 1) for t in plain]})")
    print(f"smplan execute     : {best_ours * 1e3:8.1f} ms/step  (medians {[round(t * 1e3, 1) for t in ours]})")
    ratio = best_ours / best_plain
    print(f"ratio smplan/plain : {ratio:.3f}  (target <= 1.05: {'met' if ratio <= 1.05 else 'NOT met'})")


if __name__ == "__main__":
    main()
