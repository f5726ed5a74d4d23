"""Rules a plan must meet to run, shared by the planner (which never offers a plan that breaks
them) and the executor (which rejects such a plan before launch), and the default dtype of a GPU.

Each rule returns None or one line naming the value, the limit and a change that satisfies it.
"""

from __future__ import annotations

import math

from smplan.hwprofiles import PROBED_CPU_NAME

# The executor's sequence parallelism: blocks take sequence shards and the parts around them
# split and gather the sequence (executor/parallelize.py apply_tp), so it needs both plans.
SP_UNSUPPORTED = ("sequence parallelism needs the model file's tp_plan(block, sequence_parallel) and "
                  "tp_plan_outer(model, sequence_parallel) (the sequence split around the blocks); use sp=0")


def sp_unsupported(unsupported: dict | None) -> str:
    """Why sp=1 is refused: the profile's recorded reason (its TP hooks refused or failed under
    sequence_parallel=True) where it has one, else the hooks it lacks."""
    why = (unsupported or {}).get("sp")
    if not why:
        return SP_UNSUPPORTED
    return f"sequence parallelism: {why}" + ("" if "sp=0" in why else "; use sp=0")


def fp8_scaling_problem(scaling: str, dtype: str, block_scaled_fp8: bool | None = None, hw: str = "") -> str | None:
    """Why `fp8_scaling` does not fit the plan, or None ("block" is a way to run dtype=fp8, on
    GPUs whose tensor cores take block-scaled FP8: `block_scaled_fp8`, None when not known yet)."""
    from .plan import FP8_SCALINGS

    if scaling not in FP8_SCALINGS:
        return f"fp8_scaling must be one of {', '.join(FP8_SCALINGS)}, got {scaling!r}"
    if scaling == "block" and dtype != "fp8":
        return (f"fp8_scaling=block scales FP8 tensors; it needs dtype=fp8 (the plan has dtype={dtype}): "
                "add dtype=fp8 (smplan plan: --dtype fp8) or drop fp8_scaling")
    if scaling == "block" and block_scaled_fp8 is False:
        return (f"fp8_scaling=block (MXFP8) needs tensor cores that take block-scaled FP8 (Blackwell: b200x8, "
                f"b300x8, gb200nvl72, gb300nvl72); {hw or 'this GPU'} has none: use fp8_scaling=tensor")
    return None


def effective_zero(zero: int, pp: int) -> int:
    """The ZeRO stage a plan runs at. With pipeline stages torch.distributed.pipelining keeps
    FSDP2's gradients unsharded and skips its reduce-scatter until the last micro-batch's
    backward (torch/distributed/pipelining/stage.py: set_requires_gradient_sync(False),
    set_reshard_after_backward(False)), and torchtitan keeps the parameters gathered from the
    first forward (its reshard_after_forward = not pp): ZeRO-2/3 then hold and move what ZeRO-1
    does (sharded optimizer states; one reduce-scatter and one all-gather per step). DeepSpeed
    refuses ZeRO-2/3 with pipeline parallelism."""
    return 1 if pp > 1 and zero >= 2 else zero


def zero_with_pp_problem(zero: int, pp: int) -> str | None:
    """Why `zero` does not run as itself with `pp` pipeline stages (`effective_zero`), or None."""
    if effective_zero(zero, pp) == zero:
        return None
    return (f"zero={zero} runs as ZeRO-1 with pipeline stages (pp={pp}: the gradients and gathered parameters "
            "stay until the last micro-batch)")


def fsdp_zero1_problem(zero: int, pp: int, shard_ranks: int, zero_granularity: str) -> str | None:
    """Why zero=1 does not run as itself under a stack whose ZeRO is FSDP's (zero_granularity
    "block"), or None: without pipeline stages FSDP shards the gradients with the optimizer states
    (FSDP has no ZeRO-1), so it runs as ZeRO-2. `shard_ranks`: dp x cp, what it shards over."""
    if zero == 1 and pp == 1 and zero_granularity == "block" and shard_ranks > 1:
        return ("zero=1 without pipeline stages is not FSDP's: this stack's ZeRO (zero_granularity = block) "
                "shards the gradients with the optimizer states, so it would run as ZeRO-2")
    return None


def pipeline_fill_problem(pp: int, schedule: str, num_microbatches: int, dp: int, micro_batch: int,
                          pp_given: bool = True) -> str | None:
    """Why `num_microbatches` per replica cannot drive a `pp`-stage pipeline, or None.
    `pp_given`: the user chose pp (else the GPU count did, and "a smaller pp" is no fix of theirs).

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
        return f"{m} micro-batches cannot fill {pp} pipeline stages; {fix}" + (" or a smaller pp" if pp_given else "")
    if schedule == "interleaved" and m % pp:
        lower = m // pp * pp * per
        return (
            f"the interleaved schedule needs micro-batches ({m}) divisible by pp={pp}; "
            f"use gbs={lower} or {lower + pp * per}, or schedule=1f1b"
        )
    return None


def default_dtype(peak_tflops, gpu_name: str = "") -> str:
    """bf16 where the GPU has a bf16 peak, else fp16 (e.g. V100), else fp32 (`PeakTflops`);
    fp32 on a probed CPU (gpu name PROBED_CPU_NAME), as `smplan execute` and
    `smplan calibrate` run there (calibrate.measure.device_dtype)."""
    if gpu_name == PROBED_CPU_NAME:
        return "fp32"
    for dtype in ("bf16", "fp16"):
        if getattr(peak_tflops, dtype, 0.0) > 0:
            return dtype
    return "fp32"


# Largest capacity factor accepted (chosen): GShard trains at 2.0 (Lepikhin et al. 2020, section
# 2.2: capacity 2N/E) and Switch Transformer's tables reach 2.0 (Fedus et al. 2021, section 2.2);
# 16, far beyond them, where every expert would hold most tokens, is taken for a typo.
MAX_CAPACITY_FACTOR = 16.0


def expert_grid_problem(ep: int, tp: int, cp: int, dp: int) -> str | None:
    """Why `ep` cannot fold into a stage's tp x cp x dp ranks, or None.

    Megatron-Core's MoE parallel folding (Liu et al. 2025, section 3; megatron/core/parallel_state.py
    `expert_model_parallel_size`): the expert layers lay their own grid ep x edp over the same
    tp x cp x dp ranks of a pipeline stage, so ep must divide tp*cp*dp (no expert tensor parallelism).
    """
    grid = tp * cp * dp
    if grid % ep:
        near = max(d for d in range(1, grid + 1) if grid % d == 0 and d <= ep)
        step = ep // math.gcd(tp * cp, ep)  # dp must be a multiple of it for ep to divide tp*cp*dp
        wider = -(-dp // step) * step  # the next such dp
        return (f"ep={ep} must divide tp*cp*dp={grid} (the expert grid ep x edp folds into it); use ep={near}, "
                f"or dp={wider} to keep ep={ep}")
    return None


def capacity_factor_problem(capacity_factor) -> str | None:
    ok = isinstance(capacity_factor, int | float) and not isinstance(capacity_factor, bool)
    # below 1 the busiest expert would run fewer tokens than the average one: tokens dropped,
    # which neither the cost model (its MFU counts every token) nor `smplan execute` (dropless) does
    if not ok or not 1 <= capacity_factor <= MAX_CAPACITY_FACTOR:
        return (f"capacity_factor must be a number in [1, {MAX_CAPACITY_FACTOR:g}], got {capacity_factor!r}; "
                "1.0 is balanced routing, 1.2 lets the busiest expert take 20% more tokens than the average")
    return None


def expert_parallel_problem(ep: int, num_experts: int) -> str | None:
    """Why a model with `num_experts` routed experts per MoE block cannot run `ep`, or None."""
    if ep <= 1:
        return None
    if num_experts <= 0:
        return (f"ep={ep} needs routed experts, but the model has none (no module with integer num_experts "
                "and top_k attributes); use ep=1")
    if num_experts % ep:
        return f"ep={ep} does not divide the model's {num_experts} experts per MoE block; pick a divisor"
    return None


def context_parallel_problem(cp: int, seq_len: int) -> str | None:
    """Why sequences of `seq_len` tokens cannot be split over `cp` ranks, or None.

    Megatron-Core's causal load balancing cuts the sequence into 2*cp chunks and gives rank i
    chunks i and 2cp-1-i (megatron/training/utils.py get_batch_on_this_cp_rank), so 2*cp
    must divide seq_len.
    """
    if cp <= 1:
        return None
    if seq_len <= 0:
        return f"cp={cp} splits the sequence, but the model has none (profile seq_len 0); use cp=1"
    if seq_len % (2 * cp):
        return (f"cp={cp} needs seq_len divisible by 2*cp={2 * cp} (causal load balancing), "
                f"but seq_len is {seq_len}; pick a smaller cp or a sequence length that {2 * cp} divides")
    return None


def fp8_problem(dtype: str, fp8_peak_tflops: float, profile_name: str = "the GPU", gpu_name: str = "") -> str | None:
    """Why dtype=fp8 cannot run on a GPU whose profile (`profile_name`) gives `fp8_peak_tflops`, or None."""
    if dtype == "fp8" and not fp8_peak_tflops > 0:
        # a probed CPU's plans run in fp32 (default_dtype); an inline fp8 plan still runs there with execute
        instead = "dtype=fp32" if gpu_name == PROBED_CPU_NAME else "dtype=bf16 or a GPU with FP8 (H100, B200)"
        return f"dtype=fp8 needs FP8 tensor cores, but {profile_name} has no gpu.peak_tflops.fp8; use {instead}"
    return None


def profile_dtype(plan_dtype: str) -> str:
    """The dtype a plan's model is profiled at: fp8 plans keep activations in bf16
    (Transformer Engine / torchao float8: only the GEMM inputs are cast to FP8)."""
    return "bf16" if plan_dtype == "fp8" else plan_dtype
