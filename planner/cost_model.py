"""The analytical cost model: a Plan -> PlanCosts (per stage); `closed_form` turns them into Figures.

Per model part and micro-batch, smplan.planner.pass_model times the passes (GEMMs, element-wise
traffic with fusion, TP collectives, host overhead, ZeRO-2/3 per-micro-batch collectives).
This module composes parts into pipeline stages and a step (DESIGN.md "How the parts
should think"):
- Recomputation: full re-runs the forward pass (with its TP collectives) inside backward;
  selective re-runs the attention core (batched per-head GEMMs and its share of the
  element-wise work, Korthikanti et al. 2022 section 5; a fused kernel's forward and its CP ring,
  as Megatron-Core checkpoints core_attn whatever the kernel); sac (torchtitan's op-level selective
  activation checkpointing) re-runs every other linear GEMM and the element-wise work.
- ZeRO-2 reduce-scatters each block's gradients in every micro-batch's backward, ZeRO-3
  also all-gathers each block's parameters in forward and in backward (Rajbhandari et al.
  2020); with `overlap_dp` they overlap the pass (max), else they add to it.
- Pipeline sends: each TP rank sends the stage output whole (Megatron-Core), its 1/tp slice
  under sequence parallelism or where the stack scatters it (`pp_send = "tp_slice"`:
  Narayanan et al. 2021, section 4.1 scatter/gather; `pp_send_bytes`).
- DP gradients once per step (all-reduce; ZeRO-1 reduce-scatter + all-gather; ZeRO-2 the
  parameter all-gather), overlapping the last backward when `overlap_dp`.
- Optimizer: Adam streams its local states through HBM (memory-bound).

Every stage figure is affine in its block count n and recomputed count r; `ChunkModel`
holds the coefficients, so the ILP (smplan.planner.ilp) and this estimate use the same numbers.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from smplan.hwprofiles import Cluster
from smplan.hwprofiles.perf import (
    collective_time_s,
    memory_bound_time_s,
    p2p_time_s,
    sharded_dp_collective_time_s,
)
from smplan.hwprofiles.topology import GroupSpan, ParallelLayout, strided_span

from . import grad_compress
from .chunk_model import ChunkModel, PassSeconds
from .closed_form import estimate_from_costs
from .costs import PlanCosts, StageCosts, ZeroUnit
from .feasibility import (
    context_parallel_problem,
    effective_zero,
    expert_parallel_problem,
    fp8_problem,
    fp8_scaling_problem,
    sp_unsupported,
)
from .memory_model import (
    RECOMPUTE_BUFFER_KINDS,
    block_flights,
    capacity_bytes,
    chunk_in_flight,
    chunk_memory,
    device_recompute_kind,
    in_flight,
    pre_recompute,
    split_params,
    state_bytes_per_param,
)
from .model_profile import BlockProfile, ModelProfile
from .pass_model import FLASH_DTYPES, PassTimes, launch_slack_s, pass_times
from .plan import Figures, Plan, PlanError, no_blocks_reason

# Adam step per parameter, derived from one fused kernel's traffic (apex FusedAdam, torch's
# AdamW(fused=True): each tensor read and written once): read+write fp32 master, m, v (24 B),
# read the grad twice (norm clipping + update, 4 B), write the bf16 weight (2 B) -> ~30 B of HBM
# traffic (an fp32 main grad adds ~4 B; not modelled).
OPTIMIZER_BYTES_PER_PARAM = 30.0


@dataclass(frozen=True)
class MeshKey:
    """Everything a chunk's coefficients depend on besides its position."""

    tp: int
    dp: int
    pp: int
    v: int
    micro_batch: int
    num_microbatches: int
    sp: bool
    zero: int
    overlap_dp: bool
    schedule: str
    dtype: str
    ep: int = 1
    cp: int = 1
    capacity_factor: float = 1.0
    grad_compress: str = "none"
    fp8_scaling: str = "tensor"


def blocks_problem(profile: ModelProfile) -> str | None:
    """Why no plan can place `profile`'s model (it has no repeated blocks), or None."""
    if profile.blocks:
        return None
    return no_blocks_reason(f"model {profile.model!r}")


class CostModel:
    """Coefficients of one (profile, cluster), cached per mesh and micro-batch."""

    def __init__(self, profile: ModelProfile, cluster: Cluster):
        problem = blocks_problem(profile)
        if problem:
            raise PlanError(problem)
        self.profile = profile
        self.cluster = cluster
        # The same GPUs with nothing to wait for on the host: its passes less the real ones are
        # the host-wait shares of the breakdowns (PassTimes.with_host_wait).
        eff = dataclasses.replace(cluster.efficiency, host_overhead_us_per_layer=0.0, host_overhead_us_per_moe_layer=0.0)
        self._gpu_only = dataclasses.replace(cluster, efficiency=eff)
        self._parts: dict[int, BlockProfile] = {}  # cache by identity: hashing a profile is slow
        self._pass = functools.lru_cache(maxsize=None)(self._pass_uncached)
        # the search re-costs partitions of one mesh many times (solve.polish): most of an estimate
        self.chunk = functools.lru_cache(maxsize=None)(self.chunk)

    def _layout(self, key: MeshKey) -> ParallelLayout:
        return ParallelLayout.folded(key.pp, key.dp, key.cp, key.tp, self.cluster.fast_domain_gpus)

    def spans(self, tp: int, dp: int, cp: int, ep: int) -> dict[str, GroupSpan]:
        """The groups of one pipeline stage: tp, dense gradients (dp x cp), cp, ep and edp."""
        gpn = self.cluster.fast_domain_gpus
        layout = ParallelLayout.folded(1, dp, cp, tp, gpn)
        edp = max(1, tp * cp * dp // ep)
        return {"tp": layout.span("tp"), "dp": layout.span("dp"), "cp": strided_span(cp, tp, gpn),
                "ep": strided_span(ep, 1, gpn), "edp": strided_span(edp, ep, gpn)}

    def pass_of(self, part: BlockProfile, key: MeshKey) -> PassTimes:
        """Pass times of `part`; they depend on tp, dp, cp, ep, sp, mbs, zero, overlap, dtype, the
        FP8 scaling and whether gradients are compressed to bf16 (ZeRO-2/3's reduce-scatters) only."""
        sharded = key.dp * key.cp > 1 or (key.ep > 1 and key.tp * key.cp * key.dp > key.ep)  # a group to shard over
        zk = key.zero if key.zero >= 2 and sharded else 0
        self._parts[id(part)] = part
        a2a_share = a2a_paired_share(key.pp, key.v, key.num_microbatches)
        bf16_grads = grad_compress.parse(key.grad_compress).kind == "bf16"
        return self._pass(id(part), key.tp, key.dp, key.sp, key.micro_batch, zk, key.overlap_dp, key.dtype,
                          key.cp, key.ep, key.capacity_factor, a2a_share, bf16_grads, key.fp8_scaling)

    def _pass_uncached(self, part_id, tp, dp, sp, b, zero, overlap, dtype, cp=1, ep=1, cf=1.0,
                       a2a_share=1.0, bf16_grads=False, fp8_scaling="tensor") -> PassTimes:
        part = self._parts[part_id]
        spans = self.spans(tp, dp, cp, ep)
        zc = (0.0, 0.0, overlap)
        expert = split_params(part, tp, ep)[1]
        zero_nic = spans["dp"].crosses_nodes or (expert > 0 and spans["edp"].crosses_nodes)  # as ChunkModel's
        if zero >= 2:
            # ZeRO-2/3 per micro-batch: reduce-scatter the part's gradients in backward;
            # ZeRO-3 also all-gathers its parameters in forward and again in backward
            # (dense ones over dp x cp, routed experts over edp).
            w = state_bytes_per_param(dtype)[0]
            g = grad_reduce_bytes_per_param(dtype, self.cluster)
            if bf16_grads:  # FSDP2's MixedPrecisionPolicy(reduce_dtype=bf16), grad_compress.py
                g = min(g, grad_compress.BF16_BYTES)
            rs = ag = 0.0
            for params, span in zip(split_params(part, tp, ep), (spans["dp"], spans["edp"]), strict=True):
                if params and span.size > 1:
                    rs += sharded_dp_collective_time_s("reduce_scatter", params * g, span, self.cluster)
                    if zero >= 3:
                        ag += sharded_dp_collective_time_s("all_gather", params * w, span, self.cluster)
            zc = (ag, ag + rs, overlap)

        slack = (0.0, 0.0)
        if part.kind != "block":
            # The chunk's blocks sit beside this part: what of their time the GPU spends beyond
            # their own launches, the host is ahead by (their passes without ZeRO's collectives:
            # the smaller, so the safer, lead).
            block = self.profile.blocks[0]
            self._parts[id(block)] = block
            bp = self._pass(id(block), tp, dp, sp, b, zero, overlap, dtype, cp, ep, cf, a2a_share, bf16_grads,
                            fp8_scaling)
            slack = launch_slack_s(bp.without_zero or bp, self.cluster, block)

        def passes(zero_comm, cluster=self.cluster) -> PassTimes:
            return pass_times(part, spans["tp"], sp, b, cluster, dtype, zero_comm, cp_span=spans["cp"],
                              ep_span=spans["ep"], capacity_factor=cf, ep_a2a_overlap=self.cluster.efficiency.ep_a2a_overlap * a2a_share,
                              fp8_scaling=fp8_scaling, host_slack_s=slack, zero_crosses_node=zero_nic)

        out = passes(zc).with_host_wait(passes(zc, self._gpu_only))
        if zc[0] or zc[1]:
            out = dataclasses.replace(out, zero_forward_s=zc[0], zero_backward_s=zc[1],
                                      without_zero=passes((0.0, 0.0, overlap)))
        return out

    def chunk(self, key: MeshKey, chunk: int, recompute: str, holds_recompute_buffer: bool | None = None,
              pre_kind: str | None = None) -> ChunkModel:
        """Coefficients of model chunk `chunk` (0 .. pp*v-1) recomputing with `recompute`
        (`holds_recompute_buffer`: memory_model.chunk_memory's). `pre_kind`: the first chunk's
        parts before the blocks are recomputed with it (a plan whose device 0 recomputes a block
        with full / sac); None: not applied, only offered to the ILP (`pre_rec_s`,
        `ChunkMemory.pre_recompute_saved`) for the candidate's `recompute`."""
        prof, cl = self.profile, self.cluster
        chunks = key.pp * key.v
        first, last = chunk == 0, chunk == chunks - 1
        device = chunk % key.pp
        parts = (prof.pre if first else ()) + (prof.post if last else ())
        block = prof.blocks[0]
        layout = self._layout(key)
        bp = self.pass_of(block, key)
        pts = [self.pass_of(p, key) for p in parts]
        b_rec, rec_s, tp_rec = bp.backward_with(recompute)
        full = recompute == "full"
        send_bytes = 0.0 if last else pp_send_bytes(block, key.micro_batch, key.tp, key.cp, key.sp, cl)
        crosses = False if last else layout.stage_boundary_crosses_node(device)
        send_s = p2p_time_s(send_bytes, crosses, cl) if send_bytes else 0.0
        # DP: gradient bytes of the chunk's local parameters, once per step; under gradient
        # compression the dense ones send fewer elements or bytes (grad_compress.py).
        spec = grad_compress.parse(key.grad_compress)
        gbytes = grad_compress.grad_bytes(grad_reduce_bytes_per_param(key.dtype, cl), spec)
        wbytes = state_bytes_per_param(key.dtype)[0]  # ZeRO's parameter all-gather after the step
        split0 = [split_params(p, key.tp, key.ep) for p in parts]
        d0 = sum(grad_compress.sent_elements(p, x[0], key.tp, spec) for p, x in zip(parts, split0, strict=True))
        e0 = sum(x[1] for x in split0)
        db, eb = split_params(block, key.tp, key.ep)
        comp0 = sum(grad_compress.compress_time_s(p, x[0], key.tp, spec, cl, key.dtype)
                    for p, x in zip(parts, split0, strict=True))
        comp_blk = grad_compress.compress_time_s(block, db, key.tp, spec, cl, key.dtype)
        residual = (sum(x[0] for x in split0), db)  # dense local params: what the optimizer updates, PowerSGD's error feedback
        db = grad_compress.sent_elements(block, db, key.tp, spec)
        spans = self.spans(key.tp, key.dp, key.cp, key.ep)

        def group_time(local_params: float, span) -> float:
            size = local_params * gbytes
            if span.size == 1 or key.zero >= 3 or not local_params:
                return 0.0
            if key.zero == 0:
                return collective_time_s("all_reduce", size, span, cl)
            ag = collective_time_s("all_gather", local_params * wbytes, span, cl)
            if key.zero == 2:
                return ag  # the reduce-scatters ran inside every backward
            return collective_time_s("reduce_scatter", size, span, cl) + ag

        def dp_time(dense: float, expert: float) -> float:
            # dense gradients over dp x cp, routed-expert gradients over edp (parallel folding)
            return group_time(dense, spans["dp"]) + group_time(expert, spans["edp"])

        dp_s0 = dp_time(d0, e0)
        # FSDP shards each block on its own (ZeRO >= 1), and the executor's DP under tp or pp is
        # FSDP2's `replicate` per block (executor.parallelize.apply_replicate): each block its own
        # collectives, its own latency. DDP alone buckets.
        per_block = key.zero >= 1 or key.tp > 1 or key.pp > 1
        if per_block and cl.efficiency.zero_granularity == "block":
            dp_s_blk = dp_time(db, eb)
        else:
            dp_s_blk = dp_time(d0 + db, e0 + eb) - dp_s0  # buckets: exact, ring alpha-beta is affine in bytes
        if spans["dp"].size > 1:  # PowerSGD's GEMMs sit between the bucket's all-reduces
            dp_s0, dp_s_blk = dp_s0 + comp0, dp_s_blk + comp_blk

        def bytes_factor(span) -> float:
            if span.size == 1:
                return 0.0
            return {0: gbytes, 1: gbytes + wbytes}.get(key.zero, wbytes)

        def opt_time(span) -> float:  # per local param
            share = 1.0 / (span.size if key.zero >= 1 else 1)
            return memory_bound_time_s(OPTIMIZER_BYTES_PER_PARAM * share, cl)
        mem = chunk_memory(
            prof,
            cl,
            tp=key.tp,
            dp=key.dp,
            sp=key.sp,
            zero=key.zero,
            micro_batch=key.micro_batch,
            flight=in_flight(key.schedule, key.pp, key.v, key.num_microbatches, device),
            parts_flight=chunk_in_flight(key.schedule, key.pp, key.v, key.num_microbatches, device, chunk // key.pp),
            recompute=recompute,
            first=first,
            last=last,
            device_first_chunk=chunk < key.pp,
            dtype=key.dtype,
            cp=key.cp,
            ep=key.ep,
            capacity_factor=key.capacity_factor,
            fp8_scaling=key.fp8_scaling,
            holds_recompute_buffer=holds_recompute_buffer,
            pre_kind=pre_kind,
        )
        kind = recompute if pre_kind is None else pre_kind
        pre_kinds = [pre_recompute(p, kind) if first else "none" for p in prof.pre]
        pre_rec = [self.pass_of(p, key).backward_with(k)[1] for p, k in zip(prof.pre, pre_kinds, strict=True)]
        if pre_kind is not None:
            mem = dataclasses.replace(mem, act0=mem.act0 - mem.pre_recompute_saved)
        if spec.kind == "powersgd" and spans["dp"].size > 1:
            # torch's hook keeps an error-feedback residual of every bucket (Vogels et al. 2019,
            # Algorithm 2, e): the local dense gradients once more, counted with them
            g = state_bytes_per_param(key.dtype)[1]
            mem = dataclasses.replace(mem, grads0=mem.grads0 + residual[0] * g, grads_blk=mem.grads_blk + residual[1] * g)
        return ChunkModel(
            f0=sum(p.forward_s for p in pts),
            f_blk=bp.forward_s,
            b0=sum(p.backward_s for p in pts),
            b_blk=bp.backward_s,
            r_blk=rec_s,
            tp=PassSeconds.of(pts, bp, "tp_forward_s", "tp_backward_s", rb_blk=tp_rec - bp.tp_backward_s),
            send_bytes=send_bytes,
            send_s=send_s,
            send_crosses_node=crosses,
            dp_bytes0=d0 * bytes_factor(spans["dp"]) + e0 * bytes_factor(spans["edp"]),
            dp_bytes_blk=db * bytes_factor(spans["dp"]) + eb * bytes_factor(spans["edp"]),
            dp_s0=dp_s0,
            dp_s_blk=dp_s_blk,
            dp_overlappable=key.overlap_dp,
            # the optimizer updates every local parameter, whatever the gradients' all-reduce sent
            opt0=opt_time(spans["dp"]) * residual[0] + opt_time(spans["edp"]) * e0,
            opt_blk=opt_time(spans["dp"]) * residual[1] + opt_time(spans["edp"]) * eb,
            rec_flops_blk=bp.recompute_flops[recompute],
            memory=mem,
            # Megatron-Core refuses the EP A2A overlap under full recompute: a recomputed block's
            # hidden all-to-alls (its forward's twice, its backward's) come back exposed in its
            # backward (PassTimes.ep_full_exposed_s), with the recomputed forward's exposed part;
            # what stays hidden is what the host's launches cover. It re-runs its K/V gather too.
            ep=PassSeconds.of(pts, bp, "ep_forward_s", "ep_backward_s",
                              rb_blk=bp.ep_forward_s + bp.ep_full_exposed_s if full else 0.0),
            cp=PassSeconds.of(pts, bp, "cp_forward_s", "cp_backward_s", rb_blk=bp.cp_forward_s if full else 0.0),
            ep_hidden=PassSeconds.of(pts, bp, "ep_hidden_forward_s", "ep_hidden_backward_s",
                                     rf_blk=-bp.ep_hidden_forward_s if full else 0.0,
                                     rb_blk=2.0 * bp.ep_hidden_forward_s - bp.ep_full_exposed_s if full else 0.0),
            cp_hidden=PassSeconds.of(pts, bp, "cp_hidden_forward_s", "cp_hidden_backward_s",
                                     rb_blk=bp.cp_hidden_forward_s if full else 0.0),
            ep_crosses_node=spans["ep"].crosses_nodes,
            cp_crosses_node=spans["cp"].crosses_nodes,
            host_wait=PassSeconds.of(pts, bp, "host_wait_forward_s", "host_wait_backward_s",
                                     rb_blk=(bp.host_wait_recompute_s or {}).get(recompute, 0.0)),
            **_zero_fields(bp, [self.pass_of(p, key) for p in prof.pre] if first else [],
                           [self.pass_of(p, key) for p in prof.post] if last else [],
                           recompute, key.overlap_dp,
                           spans["dp"].crosses_nodes or (eb > 0 and spans["edp"].crosses_nodes),
                           pre_kinds if pre_kind is not None else ()),
            rec0_s=sum(pre_rec) if pre_kind is not None else 0.0,
            rec0_flops=sum(self.pass_of(p, key).recompute_flops[k] for p, k in zip(prof.pre, pre_kinds, strict=True))
            if pre_kind is not None else 0.0,
            pre_rec_s=sum(pre_rec) if kind in RECOMPUTE_BUFFER_KINDS else 0.0,
        )

    def plan_costs(self, plan: Plan) -> PlanCosts:
        key = mesh_key(plan)
        check_plan(plan, self.profile, self.cluster)
        stages = plan.stages or _default_stages(plan, self.profile)
        out, block_bytes, rec_flops = [], [], 0.0
        for i, st in enumerate(stages):
            # A stage recomputing no block is costed as its plan file records it, `none`; a device's
            # first chunk holds the device's re-materialisation buffer if any of its chunks needs one.
            kind = device_recompute_kind(stages, i % key.pp, key.pp)
            # device 0 recomputing a block with full / sac recomputes the parts before the blocks too
            cm = self.chunk(key, i, st.recompute if st.num_recomputed else "none",
                            kind is not None if i < key.pp else None, kind if i == 0 else None)
            out.append(cm.stage_costs(st.num_blocks, st.num_recomputed))
            mem = cm.memory
            block_bytes.append(mem.act_blk * (st.num_blocks - st.num_recomputed) + mem.act_rec_blk * st.num_recomputed)
            rec_flops += cm.rec_flops_blk * st.num_recomputed + cm.rec0_flops
        if key.schedule == "interleaved" and key.v > 1:
            out = _activations_at_device_peak(out, block_bytes, key)
        return self._assemble(plan, tuple(out), rec_flops)

    def _assemble(self, plan: Plan, stages: tuple[StageCosts, ...], rec_flops_per_sample: float) -> PlanCosts:
        prof, cl = self.profile, self.cluster
        gbs = plan.global_batch
        model_flops = prof.train_flops_per_sample * gbs
        # Model FLOPs count causal attention's whole square (PaLM's MFU convention, the flop
        # counter's); the kernels skip its masked half, so the FLOPs executed (hardware TFLOP/s)
        # leave it out of the forward and the backward (2x), as the time does (pass_model)
        masked = sum(p.causal_masked_flops_per_sample for p in prof.parts) if plan.dtype in FLASH_DTYPES else 0.0
        return PlanCosts(
            stages=stages,
            num_microbatches=plan.num_microbatches,
            pp=plan.pp,
            virtual_stages=plan.virtual_stages,
            schedule=plan.schedule,
            model_flops_per_step=model_flops,
            hardware_flops_per_step=model_flops - 3.0 * masked * gbs + rec_flops_per_sample * gbs,
            tokens_per_step=gbs * prof.tokens_per_sample,
            samples_per_step=gbs,
            num_gpus=plan.world_size,
            peak_tflops_per_gpu=cl.gpu.peak_tflops.for_dtype(plan.dtype),
            usd_per_gpu_hour=cl.cost.usd_per_gpu_hour,
            capacity_bytes=capacity_bytes(cl),
            expert_or_context_parallel=plan.ep > 1 or plan.cp > 1,
        )


def _zero_unit(p: PassTimes, overlapped: bool) -> ZeroUnit:
    """A part's passes without its ZeRO collectives, and the collectives. Overlapped, the closed
    form took max(compute, collectives): the compute is the pass run without them. Not overlapped
    it took max(compute + collectives, host): the compute is that less the collectives, so the
    unit-by-unit pass adds back up to the closed form."""
    if overlapped:
        bare = p.without_zero or p
        return ZeroUnit(bare.forward_s, p.zero_forward_s, bare.backward_s, p.zero_backward_s)
    return ZeroUnit(p.forward_s - p.zero_forward_s, p.zero_forward_s, p.backward_s - p.zero_backward_s,
                    p.zero_backward_s)


def _zero_fields(block: PassTimes, pre: list[PassTimes], post: list[PassTimes], recompute: str,
                 overlapped: bool, crosses_node: bool, pre_kinds: tuple | list = ()) -> dict:
    """ChunkModel's ZeRO-2/3 units: each part's passes without its collectives, and the collectives
    (`pre_kinds`: the recomputation each part before the blocks runs in its backward, if any)."""
    if block.without_zero is None:
        return {}
    recompute_s = (block.without_zero if overlapped else block).backward_with(recompute)[1]
    units = [_zero_unit(p, overlapped) for p in pre]
    if pre_kinds:  # on the units' own base: the passes without their collectives where they overlap
        recs = [(p.without_zero if overlapped and p.without_zero else p).backward_with(k)[1]
                for p, k in zip(pre, pre_kinds, strict=True)]
        units = [dataclasses.replace(u, backward_s=u.backward_s + s, recompute_s=s) for u, s in zip(units, recs, strict=True)]
    return dict(zero_pre=tuple(units), zero_blk=_zero_unit(block, overlapped),
                zero_rec_s=recompute_s, zero_post=tuple(_zero_unit(p, overlapped) for p in post),
                zero_crosses_node=crosses_node)


def pp_send_bytes(block: BlockProfile, micro_batch: int, tp: int, cp: int, sp: bool, cluster: Cluster) -> float:
    """Bytes one GPU sends to the next pipeline stage per micro-batch: its cp rank's share of a
    block's output, / tp under sequence parallelism or where the stack slices it
    (efficiency.pp_send "tp_slice"); else each tp rank sends its whole replicated copy."""
    split = tp if (sp or cluster.efficiency.pp_send == "tp_slice") else 1
    return block.output_bytes_per_sample * micro_batch / (split * cp)


def grad_reduce_bytes_per_param(dtype: str, cluster: Cluster) -> float:
    """Bytes per gradient element crossing the DP group: the weights' dtype, or fp32 where the
    stack reduces in fp32 (efficiency.grad_reduce_dtype; torchtitan's FSDP2 reduce_dtype)."""
    if cluster.efficiency.grad_reduce_dtype == "fp32":
        return 4.0
    return state_bytes_per_param(dtype)[1]


def a2a_paired_share(pp: int, v: int, num_microbatches: int) -> float:
    """Share of a device's forward passes that run beside another micro-batch's backward, which
    Megatron-Core's EP A2A overlap (`overlap_moe_expert_parallel_comm`) needs to hide the
    expert all-to-alls: without a pipeline, every forward but the first; with one, the
    interleaved schedule's steady-state 1F1B passes only (its config refuses plain 1F1B), after
    a warm-up of (pp - 1) * 2 + (v - 1) * pp forwards plus the one the overlap adds
    (Megatron-Core schedules.py, get_pp_rank_microbatches, first stage): a step that is all
    warm-up and cool-down hides nothing. The first stage's share, the smallest, is charged to
    every stage (later stages warm up less): a conservative price of the overlap."""
    m = num_microbatches
    if m <= 1:
        return 0.0
    if pp == 1:
        return (m - 1) / m
    if v <= 1:
        return 0.0
    passes = m * v
    return (passes - min(passes, (pp - 1) * 2 + (v - 1) * pp + 1)) / passes


def mesh_key(plan: Plan) -> MeshKey:
    return MeshKey(
        tp=plan.tp,
        dp=plan.dp,
        pp=plan.pp,
        v=plan.virtual_stages,
        micro_batch=plan.micro_batch,
        num_microbatches=plan.num_microbatches,
        sp=bool(plan.sequence_parallel and plan.tp > 1),
        zero=effective_zero(plan.zero, plan.pp),
        overlap_dp=plan.overlap_dp,
        schedule=plan.schedule,
        dtype=plan.dtype,
        ep=plan.ep,
        cp=plan.cp,
        capacity_factor=plan.capacity_factor,
        grad_compress=plan.grad_compress,
        fp8_scaling=plan.fp8_scaling,
    )


def _activations_at_device_peak(stages: list[StageCosts], block_bytes: list[float], key: MeshKey) -> list[StageCosts]:
    """Interleaved stages with each chunk's activations at the one moment its device holds the
    most bytes: `chunk_memory` spreads the device's in-flight micro-batches evenly over its chunks'
    blocks (affine in the blocks, as the ILP needs), which an uneven split of blocks over the chunks
    miscounts (`memory_model.block_flights`), and counts the embedding and head at their own chunk's
    count (`chunk_in_flight`). `block_bytes`: each chunk's block activations as chunk_memory counted them."""
    m = key.num_microbatches
    out = list(stages)
    for d in range(key.pp):
        flight = in_flight(key.schedule, key.pp, key.v, m, d)
        chunks = list(range(d, len(stages), key.pp))
        parts = [stages[c].memory.activations_bytes - block_bytes[c] for c in chunks]
        parts_flight = [chunk_in_flight(key.schedule, key.pp, key.v, m, d, c // key.pp) for c in chunks]
        per_microbatch = [block_bytes[c] / flight + (p / f if f else 0.0)
                          for c, p, f in zip(chunks, parts, parts_flight, strict=True)]
        held = block_flights(key.schedule, key.pp, key.v, m, d, tuple(per_microbatch))
        for c, p, f, unit, n in zip(chunks, parts, parts_flight, per_microbatch, held, strict=True):
            mem = stages[c].memory
            out[c] = dataclasses.replace(stages[c], memory=dataclasses.replace(
                mem, activations_bytes=unit * n + (0.0 if f else p)))
    return out


def _default_stages(plan: Plan, profile: ModelProfile):
    from .plan import even_stages

    return even_stages(profile.num_blocks, plan.num_model_chunks)


def check_plan(plan: Plan, profile: ModelProfile, cluster: Cluster) -> None:
    """Checks that need the model and the hardware; each error names the fix. What the model
    cannot run comes first: a hint on the cluster's size must not lead into that refusal."""
    # what the model cannot run (capabilities): refused here as `plan --fix` and `execute` refuse it
    problem = profile.degree_problem(tp=plan.tp, pp=plan.pp, cp=plan.cp, ep=plan.ep)
    if problem:
        raise PlanError(problem)
    if plan.world_size > cluster.num_gpus:
        raise PlanError(
            f"dp*tp*pp*cp={plan.world_size} GPUs but the cluster has {cluster.num_gpus}; "
            f"use --nodes {-(-plan.world_size // cluster.gpus_per_node)} or lower a degree"
        )
    # tp > gpus_per_node is evaluated (its collectives cross nodes) though the search never offers it.
    if plan.tp > 1 and profile.num_heads and profile.num_heads % plan.tp:
        raise PlanError(f"tp={plan.tp} does not divide the model's {profile.num_heads} key/value heads (tp splits attention by them); pick a divisor")
    if plan.tp > 1 and plan.sequence_parallel and profile.supports_sequence_parallel is False:
        raise PlanError(sp_unsupported(profile.unsupported))
    problem = (expert_parallel_problem(plan.ep, profile.num_experts)
               or context_parallel_problem(plan.cp, profile.seq_len)
               or fp8_problem(plan.dtype, cluster.gpu.peak_tflops.fp8, repr(cluster.name), cluster.gpu.name)
               or fp8_scaling_problem(plan.fp8_scaling, plan.dtype, cluster.gpu.block_scaled_fp8, repr(cluster.name)))
    if problem:
        raise PlanError(problem)
    if plan.num_model_chunks > profile.num_blocks:
        raise PlanError(
            f"pp*v={plan.num_model_chunks} stages need at least that many blocks but the model has "
            f"{profile.num_blocks}; lower pp or v"
        )
    if plan.stages and plan.stages[-1].last_block != profile.num_blocks:
        raise PlanError(
            f"the plan's stages cover {plan.stages[-1].last_block} blocks but {plan.model} has {profile.num_blocks} "
            "(a plan made for another model or other --arg values?); make one for it with `smplan plan`, or fix the "
            "stage list"
        )


def plan_costs(plan: Plan, profile: ModelProfile, cluster: Cluster) -> PlanCosts:
    """Per-stage costs of `plan` (the contract the simulator starts from)."""
    return CostModel(profile, cluster).plan_costs(plan)


def estimate(plan: Plan, profile: ModelProfile, cluster: Cluster) -> Figures:
    """The closed-form figures of `plan`."""
    return estimate_from_costs(plan_costs(plan, profile, cluster))
