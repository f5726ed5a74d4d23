"""Hand-made PlanCosts for simulator tests (no profiler, no cost model)."""

from __future__ import annotations

from smplan.hwprofiles import load_cluster
from smplan.hwprofiles.topology import ParallelLayout
from smplan.planner.costs import MemoryBreakdown, PlanCosts, StageCosts


def uniform_costs(schedule="1f1b", pp=4, m=8, v=1, tf=1.0, tb=2.0, send_s=0.0, crosses=False, dp_s=0.0, overlap=True,
                  opt_s=0.0, recompute_s=0.0):
    """Every chunk alike; tf, tb are per full stage (a device's v chunks together)."""
    chunks = pp * v
    stages = tuple(
        StageCosts(
            forward_s=tf / v,
            backward_s=tb / v,
            recompute_s=recompute_s / v,
            send_bytes=1e6 if send_s and c < chunks - 1 else 0.0,
            send_s=send_s if c < chunks - 1 else 0.0,
            send_crosses_node=crosses,
            dp_comm_bytes=1e8 if dp_s else 0.0,
            dp_comm_s=dp_s / v,
            dp_overlappable=overlap,
            optimizer_s=opt_s / v,
            memory=MemoryBreakdown(1e9, 1e9, 4e9, 2e9, 1e8, 2**31),
        )
        for c in range(chunks)
    )
    return PlanCosts(stages=stages, num_microbatches=m, pp=pp, virtual_stages=v, schedule=schedule,
                     model_flops_per_step=1e15, hardware_flops_per_step=1.2e15, tokens_per_step=4096 * m,
                     samples_per_step=m, num_gpus=pp * 2, peak_tflops_per_gpu=312.0, usd_per_gpu_hour=2.0,
                     capacity_bytes=80 * 2**30)


def cluster(nodes=16):
    return load_cluster("a100x8", nodes=nodes)


def layout(pp, dp=2, tp=1, gpus_per_node=8):
    return ParallelLayout(pp=pp, dp=dp, tp=tp, gpus_per_node=gpus_per_node)
