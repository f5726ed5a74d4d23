"""One-line notes the commands print after their results: what a figure means for the user."""

from __future__ import annotations

import math

from smplan.display import memory_need_text
from smplan.hwprofiles import Cluster, Efficiency, bundled_stacks, load_stack, matmul_efficiency
from smplan.planner import Figures

# Below this share of the step, waiting for the host is not worth a line.
HOST_WAIT_NOTE_SHARE = 0.10


def host_time_from_stack(efficiency: Efficiency, stack: str | None = None) -> bool:
    """Whether the host time per layer pass is a stack's figure: not one the hardware file states
    (`smplan calibrate` fits it there) or --hw-set gives. Under the default stack a file's own
    value stands, any other stack replaces it (hwprofiles/stack.py), so the figure is the stack's
    exactly when it equals that stack's. `stack`: the --stack in effect; None: any bundled one."""
    if stack and stack not in bundled_stacks():  # a --stack file's own figure (`smplan calibrate --stack-output` writes one)
        return False
    names = [stack] if stack else bundled_stacks()
    value = efficiency.host_overhead_us_per_layer
    return any(load_stack(name).host_overhead_us_per_layer == value for name in names)


def host_wait_note(figures: Figures, efficiency: Efficiency, moe: bool = False, on_cpu: bool = False,
                   stack_figure: bool | None = None, stack: str | None = None) -> str | None:
    """One line when the GPU waits for the host's kernel launches for a tenth of the step or more
    (the breakdown's `host_wait`): what sets that time and what shortens it. `on_cpu`: a profile
    from `smplan hw probe` on a CPU, where no GPU waits and no CUDA graph helps, and the host
    time is a GPU stack's until `smplan calibrate` fits it. `stack_figure`: whether the host time
    is the stack's (`host_time_from_stack`; None: worked out from its value and `stack`, the
    --stack in effect)."""
    wait = figures.breakdown.get("host_wait", 0.0)
    if not figures.step_time_s or wait < HOST_WAIT_NOTE_SHARE * figures.step_time_s:
        return None
    if stack_figure is None:
        stack_figure = host_time_from_stack(efficiency, stack)
    per_layer = f"{efficiency.host_overhead_us_per_layer:g} us per layer pass"
    if moe and efficiency.host_overhead_us_per_moe_layer:
        per_layer += f", {efficiency.host_overhead_us_per_moe_layer:g} us more per MoE layer"
    if on_cpu:
        where = ("the stack's figure for a GPU cluster): `smplan calibrate` fits it to runs on this machine; "
                 if stack_figure else "as the profile, a --stack file or --hw-set sets it): ")
        return (f"note: {100 * wait / figures.step_time_s:.0f}% of the step is the host's time per layer pass "
                f"({per_layer}, {where}a bigger micro-batch shortens its share")
    where = (f"the stack's {per_layer}; `smplan stack show`" if stack_figure
             else f"{per_layer}, as the profile, a --stack file or --hw-set sets it")
    return (f"note: the GPU waits {100 * wait / figures.step_time_s:.0f}% of the step for the host to launch kernels "
            f"({where}): a bigger micro-batch shortens it, and so do CUDA "
            "graphs (a --stack file or --hw-set efficiency.host_overhead_us_per_layer=... with less host time); "
            "a faster GPU does not")


def mfu_counts_masked_half(mfu: float, cluster: Cluster, dtype: str) -> bool:
    """Whether an MFU is above what the GPU's largest GEMMs reach (hwprofiles.perf): at long
    sequences it counts causal attention's masked half, which the kernels skip, as work (PaLM's
    convention, torch's flop counter)."""
    huge = 1 << 20  # a GEMM this large runs at the profile's ceiling for the dtype
    return mfu > matmul_efficiency(huge, huge, huge, cluster, dtype=dtype)


def causal_mfu_note(figures: Figures, cluster: Cluster, dtype: str) -> str | None:
    """One line when the MFU counts causal attention's masked half (`mfu_counts_masked_half`); the
    FLOPs executed (hardware TFLOP/s) say what the GPU does."""
    if not mfu_counts_masked_half(figures.mfu, cluster, dtype):
        return None
    peak = cluster.gpu.peak_tflops.for_dtype(dtype)
    return (f"note: MFU {100 * figures.mfu:.1f}% counts causal attention's masked half as work (PaLM's convention); "
            f"the GPUs execute {figures.hardware_tflops_per_gpu:.0f} TFLOP/s each, "
            f"{100 * figures.hardware_tflops_per_gpu / peak:.0f}% of the {dtype} peak, recompute included")


# A nearby global batch is worth naming when it lets dp grow this many times or more.
BATCH_NOTE_DP_GAIN = 4
# How far from the asked global batch a suggestion may go (a share of it).
BATCH_NOTE_REACH = 0.05


def _widest_dp(global_batch: int, num_gpus: int) -> int:
    """The largest data-parallel degree `global_batch` allows on `num_gpus`: dp divides the global
    batch (each replica takes whole sequences, dp x micro-batch x micro-batches) and the GPUs
    (dp x tp x pp x cp of them, search_space), so at most their greatest common divisor."""
    return math.gcd(global_batch, num_gpus)


def batch_divisors_note(global_batch: int, num_gpus: int) -> str | None:
    """One line when the global batch's divisors leave little data parallelism (a prime batch on
    many GPUs) and a batch within BATCH_NOTE_REACH of it allows BATCH_NOTE_DP_GAIN times more."""
    widest = _widest_dp(global_batch, num_gpus)
    reach = max(1, int(BATCH_NOTE_REACH * global_batch))
    # A batch allows dp=d when d divides it and the GPUs: the nearest such batches are the nearest
    # multiples of the GPUs' divisors d (sqrt(GPUs) steps, not one per batch in reach).
    small = [d for d in range(1, math.isqrt(num_gpus) + 1) if num_gpus % d == 0]
    wide = [d for d in {*small, *(num_gpus // d for d in small)} if d >= BATCH_NOTE_DP_GAIN * widest]
    nearby = [(abs(other - global_batch), other) for d in wide for other in (global_batch // d * d, -(-global_batch // d) * d)
              if other >= 1 and abs(other - global_batch) <= reach]
    if not nearby:
        return None
    other = min(nearby)[1]
    return (f"note: global batch {global_batch} allows dp of at most {widest} on {num_gpus} GPUs (dp divides "
            f"the batch and the GPUs); --global-batch {other} allows dp={_widest_dp(other, num_gpus)}")


# Stacks whose activation checkpointing is torch's op-level policy, as `sac` prices it.
SAC_STACKS = ("torchtitan",)


def sac_stack_note(plan, stack: str) -> str | None:
    """One line when the best plan recomputes with `sac` (torchtitan's op-level selective
    checkpointing, which `smplan execute` runs) under a stack without that policy: Megatron-Core's
    nearest setting is module-level selective recompute (--recompute-granularity selective
    --recompute-modules, megatron/core/transformer/transformer_config.py)."""
    if plan.recompute != "sac" or not plan.recomputed_blocks[0] or stack in SAC_STACKS:
        return None
    return (f"note: sac is torchtitan's op-level selective checkpointing (smplan execute runs it); {stack} has no "
            "such policy: its nearest is --recompute-granularity selective with --recompute-modules (e.g. mlp, "
            "moe_act, layernorm), which saves and re-runs other tensors; --fix recompute=full or selective plans "
            "with what it has")


def a2a_overlap_note(plan, cluster: Cluster, stack: str) -> str | None:
    """One line when the best plan's expert all-to-alls are priced hidden behind the paired
    micro-batch (the megatron-core stack's ep_a2a_overlap, as Megatron-Bridge's perf configs set
    it), which Megatron-Core runs only when asked: its overlap_moe_expert_parallel_comm is off by
    default (megatron/core/transformer/transformer_config.py). Without it a plan with ep across
    nodes can be much slower (GPT-OSS-120B on 8 H100 nodes: 3.28 s vs 5.16 s a step, a reviewer's);
    inside an NVLink domain little is at stake, so the note is left out there."""
    from smplan.planner.cost_model import a2a_paired_share

    if plan.ep <= cluster.fast_domain_gpus or cluster.efficiency.ep_a2a_overlap <= 0 or stack != "megatron-core":
        return None
    every_block_full = all(s.recompute == "full" and s.num_recomputed == s.num_blocks for s in plan.stages)
    if a2a_paired_share(plan.pp, plan.virtual_stages, plan.num_microbatches) <= 0 or every_block_full:
        # the cost model hid nothing: no partner micro-batch, or Megatron-Core refuses under full recompute
        return None
    return ("note: this plan hides the expert all-to-alls across nodes behind the paired micro-batch's compute, as "
            "Megatron-Core does with --overlap-moe-expert-parallel-comm --delay-wgrad-compute (off by default "
            "there): turn them on, "
            "or plan without it: --hw-set efficiency.ep_a2a_overlap=0")


def capped_context_note(ref: str, seq_len: int, args: dict | None = None, given_seq_len: int | None = None) -> str | None:
    """One line when an hf: model plans at the default cap (planner/hf_model.py DEFAULT_SEQ_CAP)
    below the context its config states: a long-context user would otherwise not see it."""
    from smplan.planner.hf_model import capped_context

    context = capped_context(ref, args, given_seq_len)
    if context is None or seq_len >= context:
        return None
    return (f"note: {ref}'s config states a {context:,}-token context; these are {seq_len:,}-token sequences (the "
            f"hf: default caps the batch length at {seq_len:,} to keep profiling cheap); --seq-len {context} takes "
            "the full context")


def gemm_tile_note(cluster: Cluster) -> str | None:
    """One line when wave quantisation is asked for (efficiency.gemm_tile) on a GPU whose profile
    states no SM count: it would silently do nothing."""
    if cluster.efficiency.gemm_tile <= 0 or cluster.gpu.sm_count > 0:
        return None
    return (f"warning: efficiency.gemm_tile={cluster.efficiency.gemm_tile} does nothing here: the {cluster.gpu.name} "
            "profile states no gpu.sm_count; add --hw-set gpu.sm_count=N (the GPU's multiprocessors)")


def out_of_memory_warning(peak_memory_gib: float, capacity_gib: float, gpu_name: str, plan=None) -> str:
    """The line `simulate` and `reliability` print for a plan whose fullest GPU does not fit, with
    the changes that free memory which the plan (a planner Plan, if given) does not make yet."""
    changes = []
    n, total = plan.recomputed_blocks if plan is not None else (0, 1)
    if plan is None or plan.recompute != "full" or n < total:
        changes.append("recompute=full or selective" if plan is None or n == 0 else "recompute=full on more blocks")
    if plan is None or plan.zero < 3:
        changes.append("zero=1..3" if plan is None else f"zero={plan.zero + 1}..3" if plan.zero < 2 else "zero=3")
    changes.append("more tp/pp")
    # the peak holds efficiency.memory_reserve_gib (CUDA context, allocator slack); the capacity is the GPU's
    return (f"warning: the fullest GPU needs {memory_need_text(peak_memory_gib)} GiB (its memory reserve included) but "
            f"{gpu_name} has {capacity_gib:g} GiB; this plan would run out of memory. Add {', '.join(changes[:-1])}"
            f"{' or ' if len(changes) > 1 else ''}{changes[-1]} (or let `smplan plan` choose).")


# Sequences from which context parallelism is worth a word when a model cannot take it: Llama 3
# trained its 8K-token pre-training without cp and used it for the longer stages (Dubey et al. 2024,
# section 3.3.2 and Table 4), so from 8K on a search without cp may miss the better plan.
LONG_CONTEXT_TOKENS = 8192


def not_offered_note(unsupported: dict, num_experts: int, seq_len: int | None, model: str) -> str | None:
    """One line when the search left out a dimension this model's run would use: ep for an MoE
    model, cp for long sequences (`unsupported`: the profile's {dim: why}; --explain prints why)."""
    dims = [dim for dim, wanted in (("ep", num_experts > 1), ("cp", (seq_len or 0) >= LONG_CONTEXT_TOKENS))
            if wanted and dim in unsupported]
    if not dims:
        return None
    names = " and ".join(dims)
    return (f"note: {model} cannot take {names}, so every plan keeps {'them' if len(dims) > 1 else 'it'} at 1 "
            "(--explain says why)")
