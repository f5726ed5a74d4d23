"""One model part's passes for one micro-batch on one GPU: forward, backward, recompute.

The per-part half of the cost model (smplan.planner.cost_model composes parts into stages):
- GEMMs from the profile's matmul shapes with the tensor-parallel dimension divided by
  tp, timed by `smplan.hwprofiles.perf.matmul_time_s`; backward = 2x forward (input and weight
  gradients, same shapes; Narayanan et al. 2021, appendix: 4 of the 6 per-parameter FLOPs).
- Fused attention kernels (SDPA flash / memory-efficient / cuDNN) at bf16/fp16 are not GEMMs:
  `perf.flash_attention_time_s` times them from queries, keys, head dim and the causal mask,
  with a backward of 2.5x the forward FLOPs (the kernel recomputes the scores). They save no
  scores, so selective recompute re-runs nothing of them.
- Element-wise HBM traffic (`memory_bound_time_s`): the tp-sharded share / tp, the rest
  / tp too under sequence parallelism, less what the framework's fused kernels keep on
  chip (efficiency.elementwise_fusion); backward moves twice the forward traffic (chosen: an
  element-wise backward reads the saved input and the output gradient and writes the input
  gradient, against the forward's one read and one write; GeLU, dropout and softmax backward
  move about 1.5x, a norm's about 2x).
- TP collectives over the tp group (all-reduce; reduce-scatter + all-gather under
  sequence parallelism, Korthikanti et al. 2022 section 4.2.2); under sequence parallelism the
  stack's `tp_comm_overlap` share of a block's collectives hides under its linear GEMMs
  (Transformer Engine userbuffers), never the head's.
- Host launch overhead per layer pass overlaps GPU work: a pass takes max(GPU, host); a
  routed-expert block's host time adds the stack's MoE-layer share. The CPU
  launches asynchronously and runs ahead of GPU-bound blocks, so a non-repeated part beside them
  (embedding, head, loss) waits only for the launch time those blocks' slack has not covered
  (`host_slack_s`; CUDA's asynchronous launch queue, CUDA C Programming Guide 3.2.8.1).
- ZeRO-2/3 per-micro-batch collectives overlap the pass (max) or add to it.
- Context parallelism (cp > 1): every GEMM's token rows (m), the element-wise traffic, the
  TP collectives and the saved activations are / cp; attention keeps its full K/V length
  (each rank's queries attend to all keys; causal load balancing gives every rank the same
  share, Megatron-Core's 2*cp chunks). K/V move as the stack's `efficiency.cp_comm` says:
  "p2p", Megatron-Core / Transformer Engine's ring of send/recv steps overlapped with the
  attention of the previous step (TE `AttnFuncWithCPAndKVP2P`), K/V again with their gradients in
  backward, each step across nodes on one GPU's NIC (`ring_p2p_time_s`); or "all_gather", an NCCL
  all-gather forward and reduce-scatter backward on the multi-rail rings (torchtitan's default,
  Llama 3, Dubey et al. 2024, section 3.3.2, and smplan execute). The ring's exposed time is
  max(0, comm - attention core time); the all-gather hides under the local chunk's attention
  only, 1/cp of it (torch's allgather rotater; smplan execute's gather hides nothing, a
  difference of that 1/cp).
- Expert parallelism (ep > 1): the routed experts' batched GEMMs run E/ep experts, each on
  the tokens of the ep ranks that chose it; tokens are split over tp as well (Megatron-Core
  runs MoE with tp > 1 under sequence parallelism, so each tp rank routes its own shard),
  so one GPU's expert work is the replica's / (tp * cp). Each MoE block all-to-alls its
  dispatch and combine buffers in forward and again in backward (4 per block), over the ep
  group's span, as the stack's dispatcher sends them (`efficiency.ep_dispatcher`: NCCL's
  all-to-all, or DeepEP / HybridEP's one copy per destination node); the stack's
  `ep_a2a_overlap` share of them hides behind the compute of the paired micro-batch
  (Megatron-Core's EP A2A overlap; the cost model scales it by the share of passes that have a
  partner micro-batch, and full recompute gives it back), the rest is exposed. ep = 1 keeps
  the experts replicated on the tp ranks (as the model file's tp_plan does).
- capacity_factor multiplies the expert GEMM rows and the all-to-all bytes (the busiest
  expert sets the pace; GShard, Lepikhin et al. 2020).
- Recompute: full re-runs the forward inside backward; selective the attention core
  (Korthikanti et al. 2022 section 5); sac (torchtitan's op-level selective AC) the GEMMs it
  does not save (`BlockProfile.sac_recompute_matmuls`), all element-wise work and the TP
  collectives whose outputs it does not keep.
- dtype fp8: the blocks' linear (and expert) GEMMs at the fp8 peak (the output head stays
  bf16), attention-core GEMMs and
  element-wise work at bf16 (Transformer Engine / torchao float8: FP8 linears only), plus the
  HBM traffic of casting each FP8 GEMM's input (forward) and output gradient (backward);
  block-scaled FP8 (MXFP8) also writes the scales, at the same GEMM rate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from smplan.hwprofiles import Cluster
from smplan.hwprofiles.perf import (
    collective_time_s,
    expert_dispatch_time_s,
    flash_attention_time_s,
    matmul_time_s,
    memory_bound_time_s,
    ring_p2p_time_s,
)
from smplan.hwprofiles.topology import GroupSpan

from .model_profile import BlockProfile

# Below this a pass's host wait is float rounding of two equal sums (a nanosecond: three orders
# under the microseconds a kernel launch takes).
HOST_WAIT_TOLERANCE_S = 1e-9


@dataclass(frozen=True)
class PassTimes:
    """One part, one micro-batch, on one GPU: seconds of each pass (host overhead applied)."""

    forward_s: float
    backward_s: float
    tp_forward_s: float
    tp_backward_s: float
    selective_extra_s: float  # added inside backward when the attention core is recomputed
    full_extra_s: float  # added inside backward when the whole forward is re-run
    recompute_flops: dict  # kind -> FLOPs per sample re-run
    ep_forward_s: float = 0.0  # of forward_s: the expert all-to-alls (dispatch + combine)
    ep_backward_s: float = 0.0  # of backward_s: the same in backward
    cp_forward_s: float = 0.0  # of forward_s: the exposed K/V traffic (all-gather or ring, efficiency.cp_comm)
    cp_backward_s: float = 0.0  # of backward_s: the exposed K/V gradient traffic
    # The rest of those collectives, hidden under the compute (not in forward_s / backward_s):
    # the simulator runs them on their group's links beside the compute, where they share the
    # links with the DP and pipeline traffic.
    ep_hidden_forward_s: float = 0.0
    ep_hidden_backward_s: float = 0.0
    ep_full_exposed_s: float = 0.0  # of full_extra_s: the hidden all-to-alls full recompute exposes again
    cp_hidden_forward_s: float = 0.0
    cp_hidden_backward_s: float = 0.0
    sac_extra_s: float = 0.0  # added inside backward by op-level selective recompute
    sac_tp_s: float = 0.0  # of sac_extra_s: TP collectives it re-runs
    # ZeRO-2/3's per-micro-batch collectives issued in each pass (parameter all-gathers, gradient
    # reduce-scatters; whole, not the exposed part) and the passes without them (the cost model
    # sets both; the simulator runs them block by block on the links).
    zero_forward_s: float = 0.0
    zero_backward_s: float = 0.0
    without_zero: PassTimes | None = None
    # Of forward_s / backward_s: what the host's kernel launches add to the GPU's own time (the
    # pass with the stack's host overheads less the pass without them, `with_host_wait`);
    # `host_wait_recompute_s` is what each recompute kind takes off that in backward (<= 0: the
    # recomputed work fills time the GPU would have waited for the host; what a recompute adds,
    # its own launches included, is its recompute time).
    host_wait_forward_s: float = 0.0
    host_wait_backward_s: float = 0.0
    host_wait_recompute_s: dict | None = None

    def backward_with(self, recompute: str) -> tuple[float, float, float]:
        """(backward seconds, of which recompute, of which TP comm) under `recompute`."""
        if recompute == "full":
            return self.backward_s + self.full_extra_s, self.full_extra_s, self.tp_backward_s + self.tp_forward_s
        if recompute == "selective":
            return self.backward_s + self.selective_extra_s, self.selective_extra_s, self.tp_backward_s
        if recompute == "sac":
            return self.backward_s + self.sac_extra_s, self.sac_extra_s, self.tp_backward_s + self.sac_tp_s
        return self.backward_s, 0.0, self.tp_backward_s

    def with_host_wait(self, gpu_only: PassTimes) -> PassTimes:
        """These times with their host-wait shares set from `gpu_only`, the same passes priced
        without the stack's host overheads."""
        def seconds(x: float) -> float:  # a difference of equal sums is rounding, not waiting
            return x if abs(x) > HOST_WAIT_TOLERANCE_S else 0.0

        hw_b = seconds(self.backward_s - gpu_only.backward_s)
        rec = {kind: seconds(min(0.0, self.backward_with(kind)[0] - gpu_only.backward_with(kind)[0] - hw_b))
               for kind in ("selective", "full", "sac")}
        return dataclasses.replace(self, host_wait_forward_s=seconds(self.forward_s - gpu_only.forward_s),
                                   host_wait_backward_s=hw_b, host_wait_recompute_s=rec)


def _gemm_dims(mm, tp: int, b: int, cp: int = 1, ep: int = 1, capacity_factor: float = 1.0
               ) -> tuple[int, int, int, int]:
    m, n, k, batch = mm.m, mm.n, mm.k, mm.batch * mm.count
    if mm.tp_dim == "expert":
        # [E, tokens per expert, h]: the micro-batch's tokens (/ cp, / tp when ep folds tp in)
        # fill the rows; E/ep experts per GPU, each with the tokens of ep ranks.
        split = cp * (tp if ep > 1 else 1)
        rows = max(1, round(m * b * ep * capacity_factor / split))
        return rows, n, k, max(1, mm.count * -(-mm.batch // ep))
    if mm.batch > 1:
        batch *= b  # per-head GEMMs: more sequences -> more independent GEMMs
        m = max(1, -(-m // cp))  # this rank's queries; keys and values stay whole
    else:
        m = max(1, -(-m * b // cp))  # linear layers: the micro-batch stacks into the rows
    if mm.tp_dim == "n":
        n = max(1, -(-n // tp))
    elif mm.tp_dim == "k":
        k = max(1, -(-k // tp))
    elif mm.tp_dim == "batch":
        batch = max(1, -(-batch // tp))
    return m, n, k, batch


def _exposed_all_to_alls(ep_f: float, ep_b: float, compute_f: float, compute_b: float, overlap: float
                         ) -> tuple[float, float]:
    """The expert all-to-all seconds (forward, backward) left on the critical path.

    Megatron-Core's EP A2A overlap runs the forward of one micro-batch with the backward of
    another and puts each one's dispatch / combine on a second stream under the other's
    GEMMs (Megatron-Bridge changelog: "EP A2A communication overlap with computation in both
    1F1B pipelining and non-pipelined training"; `overlap_moe_expert_parallel_comm`): the pair
    takes max(compute, all-to-all) instead of their sum. `overlap` is the share of the
    all-to-alls that may hide; what stays exposed is split as the two passes' all-to-alls are.
    The warm-up and cool-down passes of a pipeline have no partner: the cost model scales
    `overlap` by the share of passes that have one (cost_model.a2a_paired_share).
    """
    total = ep_f + ep_b
    if overlap <= 0.0 or total <= 0.0:
        return ep_f, ep_b
    exposed = total - min(overlap * total, compute_f + compute_b)
    return ep_f * exposed / total, ep_b * exposed / total


def _link_share(zero_crosses_node: bool, ep_span: GroupSpan | None, cp_span: GroupSpan | None) -> tuple[int, int]:
    """(ep, cp): 1 where that group's collectives run on the links ZeRO's collectives use,
    the NIC when both cross nodes, NVLink when neither does (the simulator's link keys). Those
    links carry both in the same pass, one after the other at full bandwidth or side by side at
    a share of it: the pass lasts at least their sum (the simulator's processor sharing)."""
    def same(span: GroupSpan | None) -> int:
        return int(span is not None and span.size > 1 and span.crosses_nodes == zero_crosses_node)
    return same(ep_span), same(cp_span)


def _userbuffers_reach(tp_span: GroupSpan, cluster: Cluster) -> bool:
    """Whether TE's userbuffers can run the TP group's overlap: they map peer buffers through
    CUDA multicast or IPC handles, which need one NVLink domain (TransformerEngine issue #1071;
    multi-node NVLink since TE 2.2, PR #1470): not over PCIe, not across the domain's edge."""
    return cluster.intra_node.fabric != "pcie" and not tp_span.crosses_nodes


# Kernels one forward of the layer the stacks' host_overhead_us_per_layer was fitted on launches,
# as the profiler traces them: examples/gpt.py's GPT-3 layer, which the vTrain and Megatron SC21
# rows profile (hwprofiles.cluster.Efficiency), traces 20. Transformer layers keep the fitted
# figure whatever their count (it was fitted as one figure over layers of 20 to 27); a repeated
# block with no attention (a conv stage, a plain MLP) launching fewer kernels takes that share
# of it: the host's cost is per launch (PyTorch eager dispatches each op on the CPU).
FITTED_LAYER_KERNELS = 20


def _has_attention(part: BlockProfile) -> bool:
    """Whether the profiler saw attention in `part`: a fused attention kernel, the batched GEMMs
    of its core (per head: batch > 1; tagged "batch" under a TP plan), K/V it reads or s x s
    scores it keeps. Attention run through an op it cannot see (a custom extension) is not found:
    such a block's host time then follows its kernel count."""
    return (any(mm.kernel != "gemm" or mm.tp_dim == "batch" or mm.batch > 1 for mm in part.matmuls)
            or part.attention_kv_bytes_per_sample > 0 or part.saved_bytes_attention_core_per_sample > 0)


def host_launch_s(cluster: Cluster, part: BlockProfile | None = None) -> float:
    """Seconds the host takes to launch one layer pass's kernels (the stack's keys): a routed-
    expert part (`part.num_experts > 1`) adds the stack's MoE-layer host time, and a repeated
    block without attention that launches fewer kernels takes its share (FITTED_LAYER_KERNELS)."""
    e = cluster.efficiency
    moe = e.host_overhead_us_per_moe_layer if part is not None and part.num_experts > 1 else 0.0
    share = 1.0
    attention = part is not None and _has_attention(part)
    if part is not None and part.kind == "block" and not attention and 0 < part.forward_kernels < FITTED_LAYER_KERNELS:
        share = part.forward_kernels / FITTED_LAYER_KERNELS
    return (e.host_overhead_us_per_layer * share + moe) * 1e-6


def launch_slack_s(block: PassTimes, cluster: Cluster, part: BlockProfile | None = None) -> tuple[float, float]:
    """(forward, backward) seconds `block`'s passes (of the profile part `part`) keep the GPU
    busy beyond their own launches: how far ahead the host is when a part beside the block
    starts launching (0 when the block is bound by the host). `pass_times(host_slack_s=...)`
    takes it."""
    host = host_launch_s(cluster, part)
    return block.forward_s - host, block.backward_s - host


def _tp_comm_s(part: BlockProfile, phase: str, tp_span: GroupSpan, sp: bool, b: float, cluster: Cluster) -> float:
    total = 0.0
    for c in part.tp_collectives:
        if c.phase != phase:
            continue
        size = c.bytes_per_sample * b
        if sp and c.kind == "all_reduce":
            total += collective_time_s("reduce_scatter", size, tp_span, cluster)
            total += collective_time_s("all_gather", size, tp_span, cluster)
        else:
            total += collective_time_s(c.kind, size, tp_span, cluster)
    return total


# Fused attention kernels run in half precision (torch SDPA's flash and cuDNN backends take
# fp16/bf16 only); an fp32 plan runs the math path, timed as its GEMMs.
FLASH_DTYPES = ("bf16", "fp16", "fp8")
# An FP8 linear quantises its bf16 input (forward) and output gradient (backward) with one fused
# cast-transpose kernel: read 2 bytes, write the fp8 copy and its transpose, 1 + 1 (Transformer
# Engine `fp8_cast_transpose_fused`, FP8 primer); the weights' cast is cached across micro-batches.
FP8_CAST_BYTES_PER_ELEMENT = 4
# Block-scaled FP8 (MXFP8) writes the row-wise and column-wise copies' E8M0 scales too, one byte
# per 32 elements each (OCP Microscaling Formats spec v1.0; TE's MXFP8 quantize kernel).
FP8_BLOCK_SCALE_BYTES_PER_ELEMENT = 2.0 / 32


def _gemm_dtype(mm, dtype: str, kind: str = "block") -> str:
    """FP8 runs the blocks' linears (and experts) in FP8; attention's per-head GEMMs and the
    output head stay bf16 (Megatron-Core's output_layer is a tensor_parallel.ColumnParallelLinear,
    not a Transformer Engine module, so fp8_autocast leaves it alone; torchtitan's float8
    converter skips the "output" module, its `filter_fqns` default)."""
    if dtype != "fp8":
        return dtype
    return "bf16" if mm.tp_dim == "batch" or kind != "block" else "fp8"


def pass_times(
    part: BlockProfile, tp_span: GroupSpan, sp: bool, b: int, cluster: Cluster, dtype: str,
    zero_comm: tuple = (0.0, 0.0, True), *, cp_span: GroupSpan | None = None, ep_span: GroupSpan | None = None,
    capacity_factor: float = 1.0, ep_a2a_overlap: float | None = None, fp8_scaling: str = "tensor",
    host_slack_s: tuple[float, float] = (0.0, 0.0), zero_crosses_node: bool = False,
) -> PassTimes:
    """Seconds of one part's forward and backward passes for a micro-batch of `b`.

    `zero_comm` = (forward seconds, backward seconds, overlapped) of the part's ZeRO-2/3
    per-micro-batch collectives; `cp_span` / `ep_span` the context- and expert-parallel groups.
    `ep_a2a_overlap`: the share of the all-to-alls that may hide (None: the stack's
    efficiency.ep_a2a_overlap; the cost model passes it times the share of passes with a partner).
    `host_slack_s` = (forward, backward) seconds the host is already ahead when this part's
    launches start (a GPU-bound block's time beyond its own launches); 0 for the blocks.
    `zero_crosses_node`: whether the ZeRO collectives run on the NIC (else NVLink); the expert and
    CP collectives on the same links share them (`_link_share`).
    """
    tp = tp_span.size
    cp = cp_span.size if cp_span is not None else 1
    ep = ep_span.size if ep_span is not None else 1
    gemm = core_gemm = flash_f = flash_b = cast_f = cast_b = 0.0
    for mm in part.matmuls:
        m, n, k, batch = _gemm_dims(mm, tp, b, cp, ep, capacity_factor)
        if mm.kernel != "gemm" and dtype in FLASH_DTYPES:
            causal = mm.kernel == "flash_causal"  # a fused attention call: queries, keys, head dim
            half = "fp16" if dtype == "fp16" else "bf16"  # an fp8 plan's attention runs in bf16
            # Context parallelism runs a rank's attention as cp kernel calls, one per ring step, each
            # on a chunk pair: its s/cp queries against half a rank's keys under causal load
            # balancing (s / 2cp), the diagonal step's causal block the same work, or all of them
            # without a mask (s / cp) (TE AttnFuncWithCPAndKVP2P; torch's _templated_ring_attention):
            # shorter rows, a lower rate.
            call = (n / (2.0 * cp) if causal else n / cp) if cp > 1 else None
            flash_f += flash_attention_time_s(m, n, k, batch, causal, cluster, dtype=half, keys_per_call=call)
            flash_b += flash_attention_time_s(m, n, k, batch, causal, cluster, backward=True, dtype=half,
                                              keys_per_call=call)
            continue
        t = matmul_time_s(m, n, k, cluster, dtype=_gemm_dtype(mm, dtype, part.kind), batch=batch, launches=mm.count)
        gemm += t
        if mm.tp_dim == "batch":
            core_gemm += t
        if _gemm_dtype(mm, dtype, part.kind) == "fp8":
            per = FP8_CAST_BYTES_PER_ELEMENT + (FP8_BLOCK_SCALE_BYTES_PER_ELEMENT if fp8_scaling == "block" else 0.0)
            cast_f += m * k * batch * per  # the GEMM's input
            cast_b += m * n * batch * per  # its output gradient
    frac = part.elementwise_tp_sharded_fraction
    share = (frac / tp + (1.0 - frac) / (tp if sp else 1)) / cp
    # The framework's fused kernels keep `elementwise_fusion` of the fusible traffic on chip.
    ew_bytes = part.elementwise_bytes_per_sample - cluster.efficiency.elementwise_fusion * part.elementwise_fusible_bytes_per_sample
    elem = memory_bound_time_s(ew_bytes * b * share, cluster)
    tp_f = _tp_comm_s(part, "forward", tp_span, sp, b / cp, cluster)
    tp_b = _tp_comm_s(part, "backward", tp_span, sp, b / cp, cluster)
    ep_f = ep_b = cp_f = cp_b = cp_raw_f = cp_raw_b = 0.0
    if ep > 1 and part.all_to_all_bytes_per_sample:
        # one GPU's dispatch buffer: its tokens (/ cp, / tp) x hidden x top_k, times the capacity factor
        a2a = part.all_to_all_bytes_per_sample * b * capacity_factor / (cp * tp)
        # dispatch + combine, as the stack's dispatcher sends them (efficiency.ep_dispatcher)
        ep_f = ep_b = 2.0 * expert_dispatch_time_s(a2a, ep_span, cluster, part.top_k, part.num_experts)
    if cp > 1 and part.attention_kv_bytes_per_sample:
        # all of K and V (the gathered size; heads / tp), as the stack moves them (efficiency.cp_comm):
        # TE's ring passes K/V round forward and, keeping only its own chunk, K/V with their
        # accumulating gradients backward (AttnFuncWithCPAndKVP2P): twice the bytes
        kv = part.attention_kv_bytes_per_sample * b / tp
        if cluster.efficiency.cp_comm == "p2p":  # each step's send/recv under the previous step's attention
            cp_raw_f = ring_p2p_time_s(kv, cp_span, cluster)
            cp_raw_b = ring_p2p_time_s(2.0 * kv, cp_span, cluster)
            cp_f = max(0.0, cp_raw_f - core_gemm - flash_f)
            cp_b = max(0.0, cp_raw_b - 2.0 * core_gemm - flash_b)
        else:  # an NCCL all-gather of K/V, a reduce-scatter of their gradients: torch's allgather
            # rotater (torchtitan's default) issues the gather before the local chunk's attention and
            # waits for it before the next chunk's, so at most 1/cp of the attention hides it
            # (torch/distributed/tensor/experimental/_attention.py, _templated_ring_attention)
            cp_raw_f = collective_time_s("all_gather", kv, cp_span, cluster)
            cp_raw_b = collective_time_s("reduce_scatter", kv, cp_span, cluster)
            cp_f = max(0.0, cp_raw_f - (core_gemm + flash_f) / cp)
            cp_b = max(0.0, cp_raw_b - (2.0 * core_gemm + flash_b) / cp)
    # Like the TP collectives these sit on the critical path (inside the pass), less what the
    # stack hides (below).
    host = host_launch_s(cluster, part)
    host_f, host_b = max(0.0, host - host_slack_s[0]), max(0.0, host - host_slack_s[1])
    z_f, z_b, overlapped = zero_comm

    def busy(compute: float, comm: float) -> float:
        return max(compute, comm) if overlapped else compute + comm

    cast_f, cast_b = memory_bound_time_s(cast_f, cluster), memory_bound_time_s(cast_b, cluster)
    tp_hidden_f = tp_hidden_b = 0.0
    if sp and part.kind == "block" and cluster.efficiency.tp_comm_overlap > 0.0 and _userbuffers_reach(tp_span, cluster):
        # Transformer Engine's userbuffers split each block linear's GEMM into chunks and pipeline
        # the sequence-parallel all-gather / reduce-scatter under them (TE `ub_overlap_ag/rs`;
        # NeMo and Megatron-Bridge `tp_comm_overlap`): up to the linears' GEMM time hides. The
        # output head is not a TE module and keeps waiting.
        o = cluster.efficiency.tp_comm_overlap
        linear = gemm - core_gemm
        tp_hidden_f, tp_hidden_b = min(o * tp_f, linear), min(o * tp_b, 2.0 * linear)
        tp_f, tp_b = tp_f - tp_hidden_f, tp_b - tp_hidden_b
    # The share of the all-to-alls the stack hides behind the paired micro-batch's compute (what
    # the TP collectives already hide under is not free for them).
    raw_f, raw_b = ep_f, ep_b
    overlap = cluster.efficiency.ep_a2a_overlap if ep_a2a_overlap is None else ep_a2a_overlap
    ep_f, ep_b = _exposed_all_to_alls(ep_f, ep_b, gemm + flash_f + cast_f + elem - tp_hidden_f,
                                      2.0 * (gemm + elem) + flash_b + cast_b - tp_hidden_b, overlap)
    hid_f, hid_b = raw_f - ep_f, raw_b - ep_b  # what the overlap hid
    # The links' work in each pass (`_link_share`): ZeRO's collectives and, where they run on the
    # same links, the expert and CP collectives, exposed or hidden; the pass lasts at least that.
    # (Without overlap ZeRO's collectives wait for the compute: they add to it, as before.)
    shared = _link_share(zero_crosses_node, ep_span, cp_span) if overlapped else (0, 0)
    link_f = z_f + (shared[0] * raw_f + shared[1] * cp_raw_f if z_f else 0.0)
    link_b = z_b + (shared[0] * raw_b + shared[1] * cp_raw_b if z_b else 0.0)
    fwd_gpu = gemm + flash_f + cast_f + elem + tp_f + ep_f + cp_f
    fwd = max(busy(fwd_gpu, link_f), host_f)
    bwd_gpu = 2.0 * (gemm + elem) + flash_b + cast_b + tp_b + ep_b + cp_b
    bwd = max(busy(bwd_gpu, link_b), host_b)
    # Full recompute re-runs the forward inside the backward pass, on the parameters that
    # pass already gathered (FSDP and DeepSpeed ZeRO-3 gather a block once for both); each
    # of the two sub-passes is still bounded by its own kernel launches on the host.
    # Megatron-Core refuses the EP A2A overlap with full recompute: those blocks wait for all
    # their all-to-alls, the forward's, the recomputed forward's and the backward's (what the
    # overlap hid comes back here, in the backward pass; nothing where the host set the pass).
    # The recomputed forward's collectives also go on the backward's shared links.
    rerun_link = shared[0] * raw_f + shared[1] * cp_raw_f if z_b else 0.0
    # The all-to-alls it exposes again sit inside the backward's busy(): where the links bound the
    # pass they already carried them, and the overlap setting must not change the block's time.
    hidden = busy(max(fwd_gpu, host_f) + max(bwd_gpu, host_b), link_b + rerun_link)
    exposed = busy(max(fwd_gpu + hid_f, host_f) + max(bwd_gpu + hid_b, host_b), link_b + rerun_link)
    back = exposed - hidden + max(busy(fwd_gpu + hid_f, link_f), host_f) - fwd  # + the first forward's
    full_extra = hidden - bwd + back
    saved = part.saved_bytes_per_sample
    core_share = part.saved_bytes_attention_core_per_sample / saved if saved else 0.0
    # Megatron's selective recompute checkpoints the core attention whatever its kernel
    # (Megatron-Core attention.py, _checkpointed_attention_forward): a fused kernel's forward,
    # and under context parallelism its K/V ring, run again in backward; they free only the
    # kernel's log-sum-exp (Korthikanti et al. 2022's saving is the unfused s x s scores).
    sel_extra = core_gemm + elem * core_share + flash_f + cp_f
    # Selective recompute runs inside the backward pass: its extra time is what it adds to
    # that pass once the pass is longer than the host's launch time.
    sel_extra = max(busy(bwd_gpu + sel_extra, link_b), host_b) - bwd
    # Op-level selective recompute (torchtitan's policy, see BlockProfile): the GEMMs it does
    # not save and all the element-wise work re-run inside backward; of the TP collectives,
    # the reduce-scatters under SP are saved (half of each all-reduce point), the rest re-run.
    # The attention kernels' and all-to-alls' outputs are saved: no K/V gather or dispatch re-runs.
    sac_gemm = 0.0
    for mm in part.sac_recompute_matmuls:
        m, n, k, batch = _gemm_dims(mm, tp, b, cp, ep, capacity_factor)
        sac_gemm += matmul_time_s(m, n, k, cluster, dtype=_gemm_dtype(mm, dtype, part.kind), batch=batch,
                                  launches=mm.count)
    sac_tp = tp_f * (0.5 if sp else 1.0)
    sac_extra = max(busy(bwd_gpu + sac_gemm + elem + sac_tp, link_b), host_b) - bwd
    # the FLOPs a re-run forward executes: a causal flash kernel skips its masked half
    masked = part.causal_masked_flops_per_sample if dtype in FLASH_DTYPES else 0.0
    # selective re-runs the core attention: its batched GEMMs, or the fused kernel
    core_flops = sum(mm.flops for mm in part.matmuls if mm.tp_dim == "batch" or mm.kernel != "gemm") - masked
    flops = {"none": 0.0, "selective": core_flops, "full": part.forward_flops_per_sample - masked,
             "sac": sum(mm.flops for mm in part.sac_recompute_matmuls)}
    return PassTimes(fwd, bwd, tp_f, tp_b, sel_extra, full_extra, flops, ep_f, ep_b, cp_f, cp_b,
                     ep_hidden_forward_s=hid_f, ep_hidden_backward_s=hid_b, ep_full_exposed_s=back,
                     cp_hidden_forward_s=cp_raw_f - cp_f,
                     cp_hidden_backward_s=cp_raw_b - cp_b, sac_extra_s=sac_extra, sac_tp_s=sac_tp)
