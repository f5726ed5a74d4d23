"""Per-GPU memory of one pipeline stage: model states, activations, buffers, reserve.

Every figure is affine in the stage's block count `n` and recomputed-block count `r`
(identical blocks are interchangeable), which is what lets the ILP in `smplan.planner.ilp`
decide the partition and the recomputation exactly: `ChunkMemory.breakdown(n, r)` is the
one formula both the estimate and the ILP use.

Sources:
- Model states, mixed-precision Adam: 2 (weights) + 2 (grads) + 12 (fp32 master, m, v)
  bytes per parameter; ZeRO-1/2/3 shard the 12, then the grads, then the weights over the
  data-parallel group (Rajbhandari et al. 2020: the 2+2+12 in section 3, the stages P_os, P_os+g,
  P_os+g+p in section 5). fp32 training: 4 + 4 + 8. A stack
  that reduces gradients in fp32 (`efficiency.grad_reduce_dtype`) keeps them in an fp32 buffer
  below ZeRO-3: 6 + 12/d with Megatron's distributed optimizer (Megatron-Core
  docs/source/api-guide/dist_optimizer.md, "bf16 param, fp32 grads"); FSDP2's fp32 gradient
  shards replace its bf16 weight shards (the fp32 master is the sharded parameter), so ZeRO-3
  stays at 16/d.
- Activations per block per sample from the ModelProfile (`saved_bytes_per_gpu`, the
  Korthikanti et al. 2022 split), times the micro-batches in flight: 1F1B holds up to
  pp - stage of them (stage 0 holds pp), GPipe all m, the interleaved schedule
  ((pp - d - 1)·2 + (v - 1)·pp + 1) model-chunk micro-batches on device d (Megatron-LM's
  warm-up count; the schedule: Narayanan et al. 2021, section 2.2.2; its 1 + (p-1)/(pv) of
  1F1B's activation memory: Korthikanti et al. 2022, section 4.2.3;
  all m·v when m == pp, where Megatron-LM runs every forward before the first backward),
  spread evenly over its chunks' blocks. Not so the parts around the blocks: when device d
  holds the most, its first chunk holds up to 2·pp of them (it starts the next round of
  micro-batches first) and the last rank's last chunk one (its backward follows its forward),
  so the embedding and the head with its loss count those (`chunk_in_flight`: the
  schedule's own order replayed).
- Parameters per GPU: the tp-sharded ones / tp, the replicated ones whole (as the profile
  says: `BlockProfile.params_per_gpu`; an embedding or head the model file's TP plan does
  not shard is held whole by every tp rank).
- Fused kernels (`efficiency.elementwise_fusion`) recompute in backward the element-wise outputs
  that only element-wise ops keep and that are made of tensors kept anyway (SwiGLU's silu(gate):
  Megatron-Core's bias_swiglu saves its input only; `BlockProfile.saved_bytes_refusable_*`).
- Sequence parallelism divides the replicated activations by tp (Korthikanti et al. 2022,
  section 4.2.2), but for the inputs column-parallel linears gather to full length where the
  stack keeps them gathered (`efficiency.sp_saved_input = "gathered"`: DTensor's autograd saves
  the redistributed tensor; Megatron saves its shard and gathers it again in backward).
- Buffers: the loss's peak on the last stage beyond what it saves (`loss_buffer_bytes`: by the
  stack's `cross_entropy`, Megatron's in-place loss or the file's loss as measured; / tp only
  when the head is vocab-parallel); under full or op-level selective (`sac`) recomputation the
  re-materialised activations of one block during its backward (on a device that recomputes
  at least one block with full or sac: the ILP's one binary per device), which on a chunk that
  also runs the loss come after its peak and after its saved tensors are freed, so count only
  beyond those two; under ZeRO-3 the
  gathered parameters of the unit in use and of the next block prefetched, and the unit's
  unsharded gradients before their reduce-scatter (with an fp32 copy where the stack reduces
  in fp32: FSDP2's reduce_dtype), the unit being the largest of a block and the parts around
  the blocks (an embedding or head is an FSDP unit of its own, often larger than a block:
  Llama 3 8B's head holds 525M parameters to a block's 218M); at most
  `efficiency.zero3_max_live_params` gathered (DeepSpeed gathers module by module); FSDP's
  ZeRO-2 (`zero_granularity` "block") holds that unit's unsharded gradients too.
- Recomputation covers the parts before the blocks that do matmul work too (DeepSeek-V3's dense
  layers; not an embedding) on a device that recomputes a block with full or sac: Megatron-Core's
  full recomputation takes every transformer layer, dense ones included; they keep their input
  only (`ChunkMemory.pre_recompute_saved`, `pre_recompute`; the executor checkpoints them so).
- Reserve: `efficiency.memory_reserve_gib` (CUDA context, allocator fragmentation, NCCL).
- Context parallelism: activations, the logits buffer and the recompute buffer / cp (each
  rank keeps its share of the sequence); the dense model states are replicated over cp and
  ZeRO shards them over dp x cp (Megatron-Core's distributed optimizer uses the data-parallel
  group with context parallelism).
- Expert parallelism (ep > 1): a block's routed-expert parameters / ep on each GPU, their
  states sharded by ZeRO over the expert-data-parallel group edp = tp*cp*dp / ep
  (Megatron-Core MoE parallel folding, Liu et al. 2025, section 3); ep = 1 keeps them with
  the dense parameters (replicated on the tp ranks, as the model file's tp_plan does).
- FP8 (dtype fp8): bf16 weights, grads and the fp32 Adam states as bf16 training, plus the
  FP8 copies of every weight that Transformer Engine caches for the step's micro-batches
  (`fp8_weight_copies`: the weight and its transpose on Hopper, 1 B/param each; TE
  `is_first_microbatch`; torchao float8 keeps none but we take the larger); the linears keep
  their inputs' FP8 cast (`BlockProfile.saved_bytes_fp8_input_*`);
  plus the delayed-scaling amax history: 1024 fp32 values for each of the input, weight and
  gradient of every FP8 GEMM (TE `DelayedScaling(amax_history_len=1024)`). Block-scaled FP8
  (`fp8_scaling=block`, MXFP8) keeps a row-wise and a column-wise copy with their per-32-element
  scales instead, and no amax history.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from smplan.hwprofiles import Cluster

from .costs import MemoryBreakdown
from .model_profile import BlockProfile, ModelProfile
from .schedules import device_arrays

GIB = 2.0**30
# The kinds that re-materialise a whole block's activations inside its backward (see Buffers above).
RECOMPUTE_BUFFER_KINDS = ("full", "sac")


# FP8 training's extra weight bytes: one cached FP8 copy (see the module docstring), 1 B/param;
# `fp8_weight_copies` says how many a GPU needs.
FP8_WEIGHT_COPY_BYTES_PER_PARAM = 1.0
# The FP8 cast a linear GEMM keeps of its input under per-tensor and block scaling (one E8M0 scale
# byte per 32 elements: OCP Microscaling Formats spec v1.0), bytes an element.
FP8_INPUT_BYTES = {"tensor": 1.0, "block": 1.0 + 1.0 / 32}
# TE DelayedScaling: amax_history_len=1024 fp32 entries x (input, weight, grad) per FP8 GEMM.
FP8_AMAX_BYTES_PER_GEMM = 1024 * 4 * 3
# Block-scaled FP8 (fp8_scaling=block, MXFP8): TE's MXFP8Tensor keeps a row-wise and a
# column-wise FP8 copy (its scales run along the reduction dimension, so backward's transposed
# use is a second quantisation), each with one E8M0 scale byte per 32 elements (OCP
# Microscaling Formats spec v1.0); no amax history (scales come from each block on the fly).
FP8_BLOCK_WEIGHT_BYTES_PER_PARAM = 2.0 * (1.0 + 1.0 / 32)


def state_bytes_per_param(dtype: str) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes per parameter of Adam training at `dtype` (fp8:
    bf16 weights and grads, fp32 states; the FP8 copies are `fp8_extra_bytes`)."""
    if dtype in ("bf16", "fp16", "fp8"):
        return 2.0, 2.0, 12.0  # Rajbhandari et al. 2020: fp16 w + g, fp32 master w, m, v
    return 4.0, 4.0, 8.0  # fp32: weights, grads, m, v


def held_grad_bytes_per_param(dtype: str, zero: int, grad_reduce_dtype: str = "weights") -> float:
    """Bytes per parameter of the gradient a GPU holds (before ZeRO-2/3 shard it): fp32 where the
    stack reduces in fp32 below ZeRO-3 (Megatron's `grad_reduce_in_fp32` main-grad buffer), else
    the weights' dtype (see the module docstring for ZeRO-3)."""
    g = state_bytes_per_param(dtype)[1]
    return 4.0 if grad_reduce_dtype == "fp32" and zero < 3 else g


def model_state_bytes(params_per_gpu: float, dtype: str, zero: int, dp: int,
                      grad_reduce_dtype: str = "weights") -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes on one GPU holding `params_per_gpu` (already / tp)."""
    w, _, o = state_bytes_per_param(dtype)
    g = held_grad_bytes_per_param(dtype, zero, grad_reduce_dtype)
    return (
        params_per_gpu * w / (dp if zero >= 3 else 1),
        params_per_gpu * g / (dp if zero >= 2 else 1),
        params_per_gpu * o / (dp if zero >= 1 else 1),
    )


@functools.lru_cache(maxsize=64)
def _orders(schedule: str, pp: int, m: int, v: int) -> list:
    """The schedule's per-device task arrays, once per shape (every device's counts read them)."""
    return device_arrays(schedule, pp, m, v)


@functools.lru_cache(maxsize=4096)
def in_flight(schedule: str, pp: int, v: int, m: int, device: int) -> float:
    """Micro-batches whose activations one model chunk on `device` holds at its peak."""
    if schedule == "gpipe":
        return float(m)
    if schedule == "interleaved" and v > 1:
        # Megatron-LM's warm-up + 1, or all m*v when m == pp (it then runs every forward first)
        forward = _orders(schedule, pp, m, v)[device][0]
        return float(np.cumsum(np.where(forward, 1, -1)).max()) / v
    return float(min(pp - device, m))  # 1F1B: device d warms up pp - d forwards (Narayanan et al. 2021, 2.2.1)


@functools.lru_cache(maxsize=4096)
def chunk_in_flight(schedule: str, pp: int, v: int, m: int, device: int, local_chunk: int) -> float:
    """Micro-batches model chunk `local_chunk` (0 .. v-1) of `device` holds at the device's peak:
    the most it holds at any moment the device holds `in_flight` x v of them, replaying the
    schedule's task order (planner.schedules.device_arrays). in_flight itself without interleaving."""
    if schedule != "interleaved" or v <= 1:
        return in_flight(schedule, pp, v, m, device)
    held = _held_by_chunk(schedule, pp, v, m, device)
    total = held.sum(axis=0)
    return float(held[local_chunk][total == total.max()].max())


@functools.lru_cache(maxsize=4096)
def _held_by_chunk(schedule: str, pp: int, v: int, m: int, device: int) -> np.ndarray:
    """[v, tasks]: micro-batches each local chunk of `device` holds after each of its tasks."""
    forward, chunk, _ = _orders(schedule, pp, m, v)[device]
    step = np.where(forward, 1, -1)
    held = np.stack([np.cumsum(np.where(chunk == c * pp + device, step, 0)) for c in range(v)])
    held.flags.writeable = False  # cached: shared by every caller
    return held


def block_flights(schedule: str, pp: int, v: int, m: int, device: int, bytes_per_flight) -> list[float]:
    """Micro-batches each local chunk of `device` holds at the moment its chunks hold the most
    bytes (`bytes_per_flight`: each chunk's activations per micro-batch held). Equal chunks peak
    when the device holds the most micro-batches, `in_flight` x v of them, which `chunk_memory`
    spreads evenly over the blocks; unequal ones where the chunks that hold more weigh more (the
    first chunk holds most during the warm-up): 45 block-micro-batches where the even spread
    counts 40 on device 0 of 32 blocks in chunks of 3,3,3,3,3,3,3,3,2,2,2,2 (pp=4, v=3; a review),
    and fewer where the extra blocks sit on the last chunks."""
    if schedule != "interleaved" or v <= 1:
        return [in_flight(schedule, pp, v, m, device)] * v
    held = _held_by_chunk(schedule, pp, v, m, device)
    peak = int(np.argmax(np.asarray(bytes_per_flight, dtype=float) @ held))
    return [float(x) for x in held[:, peak]]


def device_recompute_kind(stages, device: int, pp: int) -> str | None:
    """The full / sac kind device `device` recomputes its blocks with (that of its first chunk
    recomputing a block so), or None: what holds the re-materialisation buffer and, on device 0,
    recomputes the parts before the blocks (`pre_recompute`; the executor does the same)."""
    return next((s.recompute for s in stages[device::pp] if s.num_recomputed and s.recompute in RECOMPUTE_BUFFER_KINDS),
                None)


def pre_recompute(part: BlockProfile, recompute: str) -> str:
    """The kind a part before the blocks recomputes with on a device recomputing with `recompute`:
    none for a part without matmul work (an embedding lookup keeps nothing a rerun would free;
    Megatron's recomputation leaves it out too, and so does the executor: smplan.model
    .structure.recomputable_parts); full as the blocks; sac where the profile says what sac
    keeps of it."""
    if part.forward_flops_per_sample <= 0:
        return "none"
    return recompute if recompute == "full" or (recompute == "sac" and part.supports_sac) else "none"


def part_saved_bytes(part: BlockProfile, tp: int, sp: bool, recompute: str = "none", cp: int = 1, ep: int = 1,
                     capacity_factor: float = 1.0, sp_keeps_gathered: bool = False, fp8_input_bytes: float = 0.0,
                     fusion: float = 0.0) -> float:
    """Activation bytes per sample `part` keeps on one GPU: / cp; the routed experts' share
    times the capacity factor (the busiest expert's buffer; GShard) and / tp under ep > 1
    (each tp rank routes its own tokens, as the expert compute in pass_model).
    `sp_keeps_gathered`: the stack's sequence parallelism keeps column-parallel inputs whole;
    `fp8_input_bytes` (FP8 training, blocks only: the embedding and head stay bf16) and `fusion`
    as `BlockProfile.saved_bytes_per_gpu` takes them."""
    fp8 = fp8_input_bytes if part.kind == "block" else 0.0
    base = part.saved_bytes_per_gpu(tp=tp, sequence_parallel=sp, recompute=recompute, sp_keeps_gathered=sp_keeps_gathered,
                                    fp8_input_bytes=fp8, fusion=fusion) / cp
    expert = part.saved_bytes_expert_per_sample
    if recompute in ("full", "sac") or not expert:
        return base  # sac: the expert GEMMs are batched (not aten.mm): recomputed, as full
    held = expert / (tp if sp else 1) / cp  # as saved_bytes_per_gpu counts it: replicated
    return base - held + expert * capacity_factor / (cp * (tp if (sp or ep > 1) else 1))


def split_params(part: BlockProfile, tp: int, ep: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters one GPU holds: expert parallelism takes the routed
    experts out of the replicated share and divides them by ep; ep = 1 leaves them dense."""
    local = part.params_per_gpu(tp)
    if ep <= 1 or not part.params_expert:
        return local, 0.0
    return local - part.params_expert, part.params_expert / ep


def fp8_weight_copies(cluster: Cluster) -> int:
    """Per-tensor FP8 weight copies Transformer Engine caches: the weight and its transpose on GPUs
    whose FP8 GEMMs take only the TN layout (Hopper, Ada: TE 1.x `weight_t_fp8`, TE 2.x a
    Float8Tensor's transpose, kept where `is_non_tn_fp8_gemm_supported()` is false, below compute
    capability 10.0); one on Blackwell, whose 5th-generation tensor cores (`gpu.block_scaled_fp8`
    marks them) take either layout."""
    return 1 if cluster.gpu.block_scaled_fp8 else 2


def fp8_extra_bytes(part: BlockProfile, local_params: float, dtype: str, fp8_scaling: str = "tensor",
                    copies: int = 1) -> float:
    """FP8 weight copies (`copies` per-tensor ones: `fp8_weight_copies`) and amax histories of
    `local_params` on one GPU (0 unless fp8; 0 for the embedding and the output head, which stay
    bf16: pass_model._gemm_dtype)."""
    if dtype != "fp8" or part.kind != "block":
        return 0.0
    if fp8_scaling == "block":
        return local_params * FP8_BLOCK_WEIGHT_BYTES_PER_PARAM
    gemms = sum(mm.count for mm in part.matmuls if mm.tp_dim != "batch")
    return local_params * copies * FP8_WEIGHT_COPY_BYTES_PER_PARAM + gemms * FP8_AMAX_BYTES_PER_GEMM


def part_state_bytes(part: BlockProfile, *, tp: int, dp: int, cp: int, ep: int, zero: int, dtype: str,
                     fp8_scaling: str = "tensor", grad_reduce_dtype: str = "weights",
                     fp8_copies: int = 1) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes of `part` on one GPU: dense states over dp*cp, expert
    states over edp = tp*cp*dp/ep, plus FP8 copies (ZeRO-3 shards them with the weights)."""
    dense, expert = split_params(part, tp, ep)
    edp = max(1, tp * cp * dp // ep)
    wd, gd, od = model_state_bytes(dense, dtype, zero, dp * cp, grad_reduce_dtype)
    we, ge, oe = model_state_bytes(expert, dtype, zero, edp, grad_reduce_dtype)
    fp8 = fp8_extra_bytes(part, dense, dtype, fp8_scaling, fp8_copies) / (dp * cp if zero >= 3 else 1) \
        + fp8_extra_bytes(part, expert, dtype, fp8_scaling, fp8_copies) * (expert > 0) / (edp if zero >= 3 else 1)
    return wd + we + fp8, gd + ge, od + oe


@dataclass(frozen=True)
class ChunkMemory:
    """Memory of one model chunk as an affine function of (n blocks, r recomputed)."""

    weights0: float
    weights_blk: float
    grads0: float
    grads_blk: float
    optimizer0: float
    optimizer_blk: float
    act0: float  # per GPU, all in-flight micro-batches, non-repeated parts
    act_blk: float  # per kept block
    act_rec_blk: float  # per recomputed block
    buffers: float
    reserve: float
    # of the buffers: the one block full / sac recomputation re-materialises during its backward,
    # held on a device's first chunk; the ILP counts it only where the device recomputes a block
    recompute_buffer: float = 0.0
    # of act0: what recomputing the parts before the blocks frees (the cost model subtracts it
    # where the device recomputes a block with full / sac, as the executor then does)
    pre_recompute_saved: float = 0.0
    # the chunk is its device's first and the device re-materialises whole blocks (full / sac): the
    # ILP's binary for it, which the buffer's size cannot tell (0 beside the loss's larger peak)
    rebuilds_blocks: bool = False

    def breakdown(self, n: int, r: int) -> MemoryBreakdown:
        return MemoryBreakdown(
            weights_bytes=self.weights0 + self.weights_blk * n,
            gradients_bytes=self.grads0 + self.grads_blk * n,
            optimizer_bytes=self.optimizer0 + self.optimizer_blk * n,
            activations_bytes=self.act0 + self.act_blk * (n - r) + self.act_rec_blk * r,
            buffers_bytes=self.buffers,
            reserve_bytes=self.reserve,
        )

    def const(self) -> float:
        """The bytes that do not grow with n or r (the recompute buffer, which comes with r > 0, aside)."""
        return self.weights0 + self.grads0 + self.optimizer0 + self.act0 + self.buffers - self.recompute_buffer + self.reserve

    def per_block(self) -> float:
        return self.weights_blk + self.grads_blk + self.optimizer_blk + self.act_blk

    def saved_by_recompute(self) -> float:
        return self.act_blk - self.act_rec_blk


def chunk_memory(
    profile: ModelProfile,
    cluster: Cluster,
    *,
    tp: int,
    dp: int,
    sp: bool,
    zero: int,
    micro_batch: int,
    flight: float,
    recompute: str,
    first: bool,
    last: bool,
    device_first_chunk: bool,
    dtype: str,
    cp: int = 1,
    ep: int = 1,
    capacity_factor: float = 1.0,
    fp8_scaling: str = "tensor",
    holds_recompute_buffer: bool | None = None,
    parts_flight: float | None = None,
    pre_kind: str | None = None,
) -> ChunkMemory:
    """Memory terms of one chunk; buffers and reserve sit on a device's first chunk only.
    `holds_recompute_buffer`: whether the device holds the full / sac re-materialisation buffer
    (it recomputes a block of such a kind in any of its chunks); None: as `recompute` says.
    `parts_flight`: the micro-batches the embedding / head parts are held for (`chunk_in_flight`);
    None: `flight`, as the blocks. `pre_kind`: the recomputation the device's blocks use, which
    `pre_recompute_saved` prices for the parts before them; None: `recompute`."""
    parts = (profile.pre if first else ()) + (profile.post if last else ())
    block = profile.blocks[0]
    # tp-sharded parameters / tp, replicated ones (norms, a head the model file does not shard)
    # whole, routed experts / ep; states sharded by ZeRO over dp*cp (dense) or edp (experts)
    kept = dict(dtype=dtype, fp8_scaling=fp8_scaling, grad_reduce_dtype=cluster.efficiency.grad_reduce_dtype,
                fp8_copies=fp8_weight_copies(cluster))
    states = [part_state_bytes(p, tp=tp, dp=dp, cp=cp, ep=ep, zero=zero, **kept) for p in parts]
    w0, g0, o0 = (sum(x[i] for x in states) for i in range(3))
    wb, gb, ob = part_state_bytes(block, tp=tp, dp=dp, cp=cp, ep=ep, zero=zero, **kept)
    b = micro_batch
    saved_kw = dict(cp=cp, ep=ep, capacity_factor=capacity_factor,
               sp_keeps_gathered=cluster.efficiency.sp_saved_input == "gathered",
               fp8_input_bytes=FP8_INPUT_BYTES[fp8_scaling] if dtype == "fp8" else 0.0,
               fusion=cluster.efficiency.elementwise_fusion)
    held = (flight if parts_flight is None else parts_flight) * b
    act0 = held * sum(part_saved_bytes(p, tp, sp, **saved_kw) for p in parts)
    pre_saved, kind = 0.0, recompute if pre_kind is None else pre_kind
    if first and kind in RECOMPUTE_BUFFER_KINDS:  # the embedding / dense layers then keep their input only
        pre_saved = held * sum(part_saved_bytes(p, tp, sp, **saved_kw) - part_saved_bytes(p, tp, sp, pre_recompute(p, kind), **saved_kw)
                               for p in profile.pre)
    act_blk = flight * b * part_saved_bytes(block, tp, sp, **saved_kw)
    act_rec = flight * b * part_saved_bytes(block, tp, sp, recompute, **saved_kw) if recompute != "none" else act_blk
    buffers = rec_buffer = 0.0
    holds = False
    loss_buffer = loss_buffer_bytes(profile, cluster, tp, sp, b, **saved_kw) if last else 0.0
    buffers += loss_buffer
    if device_first_chunk:
        holds = recompute in RECOMPUTE_BUFFER_KINDS if holds_recompute_buffer is None else holds_recompute_buffer
        if holds:
            rec_buffer = b * part_saved_bytes(block, tp, sp, **saved_kw)
            if last:  # the loss's peak has passed, and its saved tensors are freed, before a block recomputes
                loss_saved = b * sum(part_saved_bytes(p, tp, sp, **saved_kw) for p in profile.post if p.name == "loss")
                rec_buffer = max(0.0, rec_buffer - loss_saved - loss_buffer)
            buffers += rec_buffer
        buffers += sharded_transient_bytes(zero, block, parts, tp, ep, dtype, cluster)
    reserve = cluster.efficiency.memory_reserve_gib * GIB if device_first_chunk else 0.0
    return ChunkMemory(w0, wb, g0, gb, o0, ob, act0, act_blk, act_rec, buffers, reserve, rec_buffer, max(pre_saved, 0.0),
                       bool(holds))


def loss_buffer_bytes(profile: ModelProfile, cluster: Cluster, tp: int, sp: bool, micro_batch: int,
                    **saved_kw) -> float:
    """Bytes the last stage holds while the loss of a micro-batch runs, beyond the loss's saved
    bytes (counted with the activations; `saved_kw` as they count them): the logits (/ tp where
    the head is vocab-parallel, / cp) and the loss's own peak. Megatron's in-place vocab-parallel
    loss (`efficiency.cross_entropy = "in_place"`) peaks at 3x the bf16 logits (the logits beside
    an fp32 copy that becomes the softmax and the gradient); the file's loss as it runs ("traced")
    at its measured peak (planner/loss_memory.py: 12 B a logit for an fp32 cross-entropy, in its
    backward). A profile without the measurement (before PROFILER_VERSION 32): the logits and
    their gradient."""
    b, cp = micro_batch, saved_kw.get("cp", 1)
    logits = b * sum(p.output_bytes_per_gpu(tp) for p in profile.post) / cp
    loss = next((p for p in profile.post if p.loss_peak_bytes_per_sample), None)
    if loss is None and cluster.efficiency.cross_entropy != "in_place":
        return 2.0 * logits
    kept = b * sum(part_saved_bytes(p, tp, sp, **saved_kw) for p in profile.post if p.name == "loss")
    if cluster.efficiency.cross_entropy == "in_place":
        return max(0.0, 3.0 * logits - kept)
    head = max(profile.post, key=lambda p: p.output_bytes_per_sample)  # the logits' part
    split = head.output_bytes_per_sample / head.output_bytes_per_gpu(tp)  # tp where vocab-parallel (loss_parallel)
    peak = b * loss.loss_peak_bytes_per_sample + loss.loss_peak_fixed_bytes
    return max(0.0, peak / (split * cp) - kept)


def sharded_transient_bytes(zero: int, block: BlockProfile, parts: tuple[BlockProfile, ...], tp: int, ep: int,
                            dtype: str, cluster: Cluster) -> float:
    """Whole-size buffers of sharded data parallelism on one GPU (see the module docstring): under
    ZeRO-3 the unit in use (the largest of a block and `parts`) and the next block gathered, at
    most efficiency.zero3_max_live_params; under ZeRO-3, and FSDP's ZeRO-2 (zero_granularity
    "block": one reduce-scatter per unit), the unit's gradients before their reduce-scatter."""
    fsdp2 = zero == 2 and cluster.efficiency.zero_granularity == "block"
    if zero < 3 and not fsdp2:
        return 0.0
    w = state_bytes_per_param(dtype)[0]
    per_block = sum(split_params(block, tp, ep))
    unit = max([per_block, *(sum(split_params(p, tp, ep)) for p in parts)])
    cap = cluster.efficiency.zero3_max_live_params
    gathered = 0.0 if fsdp2 else unit + per_block
    if cap > 0:
        gathered, unit = min(gathered, cap), min(unit, cap)
    # autograd's gradients, and their fp32 copy where the stack reduces in fp32 from half precision
    grad_bytes = w + (4.0 if cluster.efficiency.grad_reduce_dtype == "fp32" and w < 4.0 else 0.0)
    return gathered * w + unit * grad_bytes


def capacity_bytes(cluster: Cluster) -> float:
    return cluster.gpu.memory_gib * GIB
