"""Wall time of the simulator's two hot paths (targets from issue 4).

1. One step of gpt3_175b on 1024 A100s (tp8 pp16 dp8, 1F1B, 96 micro-batches per
   replica), contention on: target < 1 s (profiling and costing excluded, reported apart).
2. A 30-day run of 16,384 GPUs with failures, 100 seeds, checkpoint interval swept: < 2 s.

    python benchmarks/sim_speed.py
"""

from __future__ import annotations

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def step_benchmark() -> float:
    from smplan.hwprofiles import load_cluster
    from smplan.hwprofiles.topology import ParallelLayout
    from smplan.planner import plan_from_inline, profile_model
    from smplan.planner.cost_model import plan_costs
    from smplan.simulator import simulate_step

    ref = f"{ROOT / 'examples' / 'gpt.py'}:gpt3_175b"
    cluster = load_cluster("a100x8", nodes=128)
    t0 = time.perf_counter()
    profile = profile_model(ref)
    plan = plan_from_inline("tp=8,pp=16,dp=8,mbs=1,gbs=768,recompute=full,schedule=1f1b", model=ref, hw="a100x8",
                            nodes=128, gpus_per_node=8, num_blocks=profile.num_blocks)
    costs = plan_costs(plan, profile, cluster)
    prep = time.perf_counter() - t0
    layout = ParallelLayout(pp=plan.pp, dp=plan.dp, tp=plan.tp, gpus_per_node=cluster.gpus_per_node)
    assert costs.num_microbatches == 96
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        result = simulate_step(costs, layout, cluster, contention=True)
        best = min(best, time.perf_counter() - t0)
    f = result.figures
    print(f"step simulation, gpt3_175b tp8 pp16 dp8 1f1b m=96 (1024 GPUs): {best:.3f} s wall "
          f"(target < 1 s; profile + cost model {prep:.2f} s apart)")
    print(f"  simulated step {f.step_time_s:.2f} s, MFU {f.mfu:.3f}, {len(result.events)} events; "
          f"closed form {result.closed_form_step_time_s:.2f} s")
    return best


def failures_benchmark() -> float:
    from smplan.simulator.failures import RunSpec, analyse_run

    spec = RunSpec(work_s=30 * 86400.0, num_gpus=16384, gpu_mtbf_hours=50000.0, restart_s=15 * 60.0,
                   checkpoint_s=5 * 60.0)
    analyse_run(spec, seeds=5)  # warm numpy
    t0 = time.perf_counter()
    report = analyse_run(spec, seeds=100)
    wall = time.perf_counter() - t0
    print(f"failure simulation, 30 days x 16,384 GPUs x 100 seeds (sweep of "
          f"{len(report.sweep)} intervals + the best): {wall:.3f} s wall (target < 2 s)")
    print(f"  goodput {report.goodput_mean:.3f} (p10 {report.goodput_p10:.3f}, p90 {report.goodput_p90:.3f}), "
          f"{report.failures_mean:.0f} failures, best interval {report.best_interval_s / 60:.1f} min "
          f"(Young {report.young_interval_s / 60:.1f}, Daly {report.daly_interval_s / 60:.1f})")
    return wall


if __name__ == "__main__":
    failures_benchmark()
    step_benchmark()
