"""What a command costs before its own work: the wall time of the CLI as a user runs it.

    python benchmarks/cli_startup.py [--repeats 2]

Prints the wall time and the CPU time (of the command and every process it waited for, its
workers included), each the best of --repeats runs in a fresh process and an empty profile cache
unless said:
- `smplan --help` (target: under 1.5 s; it lists the commands without importing torch) and
  `smplan execute --help` (its defaults are read from the executor's torch-free modules);
- `smplan execute` of examples/gpt.py:tiny, dp=2, one step: the first launch of a model and a
  second launch with the cache the first left (its checks before the launch are not run again);
- `smplan plan examples/gpt.py:llama3_8b --arg attention=sdpa --hw a100x8 --global-batch 64`:
  profiling (with the TP equivalence check of its 218M-parameter block), search and ranking.
The test suite launches hundreds of such processes, so these times are most of its 20 minutes;
its two workers keep both cores busy, so there the CPU time is what a launch costs.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from smplan.cli.main import main; main()"]
TINY = f"{ROOT}/examples/gpt.py:tiny"


def _children_cpu_s() -> float:
    # the CPU time of every process this one waited for, and of those they waited for in turn
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(args: list[str], cache_dir: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of `smplan ARGS`."""
    env = {**os.environ, "SMPLAN_CACHE_DIR": cache_dir, "OMP_NUM_THREADS": "1"}
    start, cpu_start = time.perf_counter(), _children_cpu_s()
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    elapsed, cpu = time.perf_counter() - start, _children_cpu_s() - cpu_start
    if result.returncode:
        sys.exit(f"smplan {' '.join(args)} failed:\n{result.stderr[-2000:]}")
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    repeats = parser.parse_args().repeats
    rows = {"smplan --help": [], "smplan execute --help": [], "execute, first launch": [], "execute, second launch": [],
            "plan llama3_8b (empty cache)": []}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            rows["smplan --help"].append(timed(["--help"], f"{tmp}/cache"))
            rows["smplan execute --help"].append(timed(["execute", "--help"], f"{tmp}/cache"))
            run = ["execute", "dp=2,mbs=1,gbs=2", "--model", TINY, "--steps", "1"]
            rows["execute, first launch"].append(timed([*run, "-o", f"{tmp}/a"], f"{tmp}/cache"))
            rows["execute, second launch"].append(timed([*run, "-o", f"{tmp}/b"], f"{tmp}/cache"))
            rows["plan llama3_8b (empty cache)"].append(timed(
                ["plan", f"{ROOT}/examples/gpt.py:llama3_8b", "--arg", "attention=sdpa", "--hw", "a100x8",
                 "--global-batch", "64", "--json"], f"{tmp}/plan-cache"))
    for name, times in rows.items():
        walls, cpus = [wall for wall, _ in times], [cpu for _, cpu in times]
        print(f"{name:32s} wall {min(walls):6.2f} s  CPU {min(cpus):6.2f} s  "
              f"(best of {len(times)}; wall {', '.join(f'{t:.2f}' for t in walls)})")
    for name in ("smplan --help", "smplan execute --help"):
        help_s = min(wall for wall, _ in rows[name])
        print(f"{name} under 1.5 s: {'met' if help_s < 1.5 else 'not met'} ({help_s:.2f} s)")


if __name__ == "__main__":
    main()
