"""Rules a plan must meet to run, shared by the planner (which never offers a plan that breaks
them) and the executor (which rejects such a plan before launch), and the default dtype of a GPU.

Each rule returns None or one line naming the value, the limit and a change that satisfies it.
"""

from __future__ import annotations

# The executor's sequence parallelism: blocks take sequence shards and the parts around them
# split and gather the sequence (executor/parallelize.py apply_tp), so it needs both plans.
SP_UNSUPPORTED = ("sequence parallelism needs the model file's tp_plan(block, sequence_parallel) and "
                  "tp_plan_outer(model, sequence_parallel) (the sequence split around the blocks); use sp=0")


def pipeline_fill_problem(pp: int, schedule: str, num_microbatches: int, dp: int, micro_batch: int) -> str | None:
    """Why `num_microbatches` per replica cannot drive a `pp`-stage pipeline, or None.

    1F1B: torch's Schedule1F1B raises unless micro-batches >= stages (torch 2.x,
    torch/distributed/pipelining/schedules.py); GPipe is held to the same rule, since with fewer
    micro-batches than stages some stage idles the whole step. Interleaved: Megatron-LM's
    interleaved 1F1B (Narayanan et al. 2021, sec. 2.2) runs micro-batches in groups of pp, so
    their number must be a multiple of pp.
    """
    if pp <= 1:
        return None
    m, per = num_microbatches, dp * micro_batch
    if m < pp:
        fix = f"use gbs >= {pp * per} (a multiple of dp*mbs={per})"
        samples = m * micro_batch  # per replica
        smaller = [b for b in range(micro_batch - 1, 0, -1) if samples % b == 0 and samples // b >= pp
                   and (schedule != "interleaved" or (samples // b) % pp == 0)]
        if smaller:
            fix += f", mbs={smaller[0]}"
        return f"{m} micro-batches cannot fill {pp} pipeline stages; {fix} or a smaller pp"
    if schedule == "interleaved" and m % pp:
        lower = m // pp * pp * per
        return (
            f"the interleaved schedule needs micro-batches ({m}) divisible by pp={pp}; "
            f"use gbs={lower} or {lower + pp * per}, or schedule=1f1b"
        )
    return None


def default_dtype(peak_tflops) -> str:
    """bf16 where the GPU has a bf16 peak, else fp16 (e.g. V100), else fp32 (`PeakTflops`)."""
    for dtype in ("bf16", "fp16"):
        if getattr(peak_tflops, dtype, 0.0) > 0:
            return dtype
    return "fp32"
