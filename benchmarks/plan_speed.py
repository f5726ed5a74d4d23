"""Wall time of plan_search over every dimension (tp, pp, dp, mbs, schedule, v, ZeRO, recompute).

    python benchmarks/plan_speed.py
Targets: under 2 s each on a 2-core machine (GPT-3 175B on 128 a100x8 nodes, 1T on 384);
DeepSeek-V3 on 128 h100x8 nodes (ep and cp searched too, issue 17): under 20 s with profiling.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from smplan.hwprofiles import load_cluster  # noqa: E402
from smplan.planner import profile_model, search  # noqa: E402

CASES = [("gpt3_175b", 128, 1536), ("gpt3_1t", 384, 3072)]
# (model, hardware, nodes, global batch, seq_len): the MoE target of issue 17
MOE_CASES = [("moe.py:deepseek_v3", "h100x8", 128, 8192, 4096)]


def main() -> None:
    for preset, nodes, gbs in CASES:
        profile = profile_model(f"{ROOT}/examples/gpt.py:{preset}")  # profiled (and cached) outside the timing
        cluster = load_cluster("a100x8", nodes=nodes)
        search(profile, cluster, global_batch=gbs, top=1)  # warm the solver (HiGHS loads once per process)
        # top 10 with runner-ups: what `smplan plan` searches before its simulated ranking
        for top, alternates in ((1, False), (5, False), (10, True)):
            t0 = time.perf_counter()
            result = search(profile, cluster, global_batch=gbs, top=top, alternates=alternates)
            wall = time.perf_counter() - t0
            best = result.plans[0]
            what = f"top={top}" + (f" +{len(result.alternates)} runner-ups" if alternates else "")
            print(f"{preset:10s} {cluster.num_gpus:5d} GPUs {what}: {wall:5.2f} s wall "
                  f"({result.candidates} candidates, {result.solved} ILPs) -> dp={best.dp} tp={best.tp} "
                  f"pp={best.pp} mbs={best.micro_batch} {best.schedule} v={best.virtual_stages} zero={best.zero} "
                  f"recompute={best.recompute}, {best.predicted.step_time_s:.2f} s/step, MFU {100 * best.predicted.mfu:.1f}%"
                  f"  [target < 2 s]")
    for ref, hw, nodes, gbs, seq_len in MOE_CASES:
        t0 = time.perf_counter()
        profile = profile_model(f"{ROOT}/examples/{ref}", seq_len=seq_len)
        cluster = load_cluster(hw, nodes=nodes)
        result = search(profile, cluster, global_batch=gbs, top=5)
        wall = time.perf_counter() - t0
        best = result.plans[0]
        print(f"{ref:10s} {cluster.num_gpus:5d} GPUs top=5: {wall:5.2f} s wall with profiling "
              f"({result.candidates} candidates, {result.solved} ILPs) -> dp={best.dp} tp={best.tp} pp={best.pp} "
              f"ep={best.ep} cp={best.cp} mbs={best.micro_batch} zero={best.zero} recompute={best.recompute}, "
              f"{best.predicted.step_time_s:.2f} s/step, {best.predicted.peak_memory_gib:.1f} GiB  [target < 20 s]")


if __name__ == "__main__":
    main()
