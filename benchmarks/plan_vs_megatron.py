"""`smplan plan` for GPT-3 175B on 128 a100x8 nodes vs Megatron's hand-tuned configs.

    python benchmarks/plan_vs_megatron.py
Megatron-LM (Narayanan et al. 2021, Table 1 / section 5): tp=8 with pp=8 or pp=16,
interleaved schedule, mbs=1, full recompute, global batch 1536. Both are predicted with
the same cost model; the planner's pick must be at least as fast, and the whole command
(profiling included) must finish in under 10 s.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from smplan.hwprofiles import load_cluster  # noqa: E402
from smplan.planner import Plan, estimate, even_stages, profile_model  # noqa: E402

REF = "examples/gpt.py:gpt3_175b"


def main() -> None:
    t0 = time.perf_counter()
    cmd = [str(Path(sys.executable).parent / "smplan"), "plan", REF, "--hw", "a100x8", "--nodes", "128",
           "--global-batch", "1536", "--top", "3"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    print(out.stdout + out.stderr)
    print(f"`smplan plan` wall time: {wall:.2f} s (target < 10 s)")
    profile = profile_model(str(ROOT / REF.split(":")[0]) + ":gpt3_175b")
    cluster = load_cluster("a100x8", nodes=128)
    from smplan.planner import plan_search

    best = plan_search(profile, cluster, global_batch=1536, top=1)[0]
    print(f"planner pick: dp={best.dp} tp={best.tp} pp={best.pp} mbs={best.micro_batch} {best.schedule} "
          f"v={best.virtual_stages} zero={best.zero} recompute={best.recompute}: "
          f"{best.predicted.tokens_per_s:,.0f} tokens/s, MFU {100 * best.predicted.mfu:.1f}%")
    for pp, v in ((8, 1), (8, 2), (8, 3), (16, 1), (16, 2)):
        dp = 1024 // (8 * pp)
        sched = "interleaved" if v > 1 else "1f1b"
        plan = Plan(model=REF, hw="a100x8", nodes=128, dp=dp, tp=8, pp=pp, micro_batch=1, global_batch=1536,
                    schedule=sched, virtual_stages=v, zero=0, stages=even_stages(96, pp * v, "full"))
        f = estimate(plan, profile, cluster)
        ratio = best.predicted.tokens_per_s / f.tokens_per_s
        print(f"Megatron tp=8 pp={pp:<2} {sched:11s} v={v}: {f.tokens_per_s:,.0f} tokens/s, MFU {100 * f.mfu:.1f}%, "
              f"mem {f.peak_memory_gib:.1f} GiB -> planner/Megatron = {ratio:.3f} (target >= 1)")


if __name__ == "__main__":
    main()
