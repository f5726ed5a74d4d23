"""The hardware performance model: how long a GEMM, a memory-bound op, a collective take.

Pure functions of a `Cluster` (and, for communication, of a `GroupSpan` from
`ParallelLayout.span`). Every time is seconds. Link figures in a profile are raw per GPU
per direction; the achievable fraction (`efficiency.network`, `efficiency.memory_bound`,
`efficiency.matmul_max`) is applied here and only here, so the planner and the simulator
cannot disagree about it.

Contention between transfers that share a link is not modelled here: these are times on an
otherwise idle fabric. The simulator adds it (simulator/network.py).
"""

from __future__ import annotations

import math

from .cluster import DTYPES, REFERENCE_MATMUL_CEILING, Cluster
from .topology import GroupSpan

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv")
ALGORITHMS = ("ring", "tree", "auto")
# NCCL implements its Tree algorithm for AllReduce only (src/enqueue.cc's algorithm selection;
# Jeaugey, NCCL 2.4 blog 2019); Broadcast and the rest run as rings (pipelined chains).
TREE_COLLECTIVES = ("all_reduce",)


class PerfModelError(ValueError):
    """A request the performance model cannot answer; the message names the valid choices."""


# ---------------------------------------------------------------------------- compute


def matmul_efficiency(m: int, n: int, k: int, cluster: Cluster, dtype: str = "bf16") -> float:
    """Achievable fraction of dense peak for an (m x k) @ (k x n) GEMM at `dtype`.

    Saturating curve in the smallest dimension: small head sizes and hidden/tp slices
    under-fill the tensor cores and tiles (DESIGN.md "What decides accuracy"; the
    half-dimension was fitted to published Megatron-LM A100 runs, docs/DESIGN.md "Validation").
    Its ceiling, efficiency.matmul_max, was fitted on A100; on another GPU it scales with the
    GPU's measured matmul ceiling for the dtype (Gpu.matmul_ceiling) over A100's.
    """
    _check_dims(m, n, k)
    eff = cluster.efficiency
    d = min(m, n, k)
    scale = cluster.gpu.matmul_ceiling.for_dtype(dtype) / REFERENCE_MATMUL_CEILING
    return min(1.0, eff.matmul_max * scale) * d / (d + eff.matmul_half_dim)


def matmul_time_s(
    m: int, n: int, k: int, cluster: Cluster, dtype: str = "bf16", batch: int = 1, launches: int = 1
) -> float:
    """Seconds for `batch` independent (m x k) @ (k x n) GEMMs at `dtype`, run as `launches`
    kernels of batch / launches GEMMs each (only wave quantisation tells them apart).

    Roofline (Williams, Waterman, Patterson 2009): the slower of the tensor-core time at
    the efficiency curve and the HBM time of reading A and B and writing C once.
    """
    if dtype not in DTYPES:
        raise PerfModelError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    if batch < 1:
        raise PerfModelError(f"batch must be at least 1, got {batch}")
    peak = cluster.gpu.peak_tflops.for_dtype(dtype) * 1e12
    compute_s = 2.0 * batch * m * n * k / (peak * matmul_efficiency(m, n, k, cluster, dtype))
    compute_s /= wave_efficiency(m, n, cluster, max(1, batch // max(1, launches)))  # each launch fills its own waves
    bytes_moved = batch * (m * k + k * n + m * n) * DTYPE_BYTES[dtype]
    return max(compute_s, memory_bound_time_s(bytes_moved, cluster))


def wave_efficiency(m: int, n: int, cluster: Cluster, batch: int = 1) -> float:
    """Share of the SMs busy over the waves of `batch` (m x n)-output GEMMs: tiles / (waves x SMs).

    Each SM computes one efficiency.gemm_tile-square output tile at a time, so a GEMM of
    T = batch x ceil(m / tile) x ceil(n / tile) tiles takes ceil(T / SMs) waves (wave
    quantisation; NVIDIA Matrix Multiplication Background User's Guide, "Wave Quantization").
    1.0 when the profile states no gpu.sm_count or gemm_tile is 0 (the default). The cost model
    applies a forward GEMM's factor to its backward too (2x its time), whose dX and dW outputs
    have other tile counts.
    """
    tile, sms = cluster.efficiency.gemm_tile, cluster.gpu.sm_count
    if tile <= 0 or sms <= 0 or min(m, n, batch) <= 0:
        return 1.0
    tiles = batch * math.ceil(m / tile) * math.ceil(n / tile)
    return tiles / (math.ceil(tiles / sms) * sms)


# Shape of a fused attention kernel's rate (FlashAttention-2, Dao 2023, Fig. 4-7): at head dim
# 64 it is ~0.83x the head-dim-128 rate, and a row of L attended keys runs at L / (L + 128) of
# the long-sequence rate (causal 512 ~0.65x, 2k ~0.9x of 16k); both curves read off those figures.
ATTENTION_HALF_HEAD_DIM = 32
ATTENTION_HALF_KEYS = 128
ATTENTION_REFERENCE_HEAD_DIM = 128  # Gpu.attention figures are at this head dim
# A fused attention kernel's backward runs 2.5x its forward FLOPs (it recomputes the scores:
# 5 GEMMs vs 2; Dao 2023, benchmark_flash_attention.py counts fwd+bwd as 3.5x fwd).
FLASH_BACKWARD_FLOPS_RATIO = 2.5


def flash_attention_efficiency(head_dim: int, keys_per_query: float, cluster: Cluster) -> float:
    """Fraction of the dense bf16 peak a fused attention kernel sustains (forward + backward).

    The stack's kernel (`efficiency.attention_kernel`) at this GPU's published rate
    (`gpu.attention`), scaled by head dim and by the keys each query attends to.
    """
    rate = getattr(cluster.gpu.attention, cluster.efficiency.attention_kernel)
    h = ATTENTION_HALF_HEAD_DIM
    by_head_dim = (head_dim / (head_dim + h)) / (ATTENTION_REFERENCE_HEAD_DIM / (ATTENTION_REFERENCE_HEAD_DIM + h))
    by_length = keys_per_query / (keys_per_query + ATTENTION_HALF_KEYS)
    return min(1.0, rate * by_head_dim * by_length)


def flash_attention_time_s(
    queries: int, keys: int, head_dim: int, heads: int, causal: bool, cluster: Cluster, backward: bool = False,
    dtype: str = "bf16", keys_per_call: float | None = None,
) -> float:
    """Seconds of one fused attention call (forward, or its backward) over `heads` (batch x heads),
    in half precision `dtype` ("bf16" or "fp16": the kernels take no other).

    FLOPs: q k^T and p v, 2 x 2 x queries x keys x head_dim per head, half of it under a
    causal mask (the kernels skip masked tiles; Dao 2023); backward 2.5x that.
    `keys_per_call`: the keys per query each kernel launch sees, where the work is split over
    several (context parallelism's ring steps); None: this one call's.
    """
    _check_dims(queries, keys, head_dim)
    if dtype not in ("bf16", "fp16"):
        raise PerfModelError(f"fused attention runs in bf16 or fp16, not {dtype!r}")
    keys_per_query = keys / 2.0 if causal else float(keys)
    flops = 4.0 * queries * keys_per_query * head_dim * heads
    if backward:
        flops *= FLASH_BACKWARD_FLOPS_RATIO
    peak = cluster.gpu.peak_tflops.for_dtype(dtype) * 1e12
    rate_keys = keys_per_query if keys_per_call is None else keys_per_call
    return flops / (peak * flash_attention_efficiency(head_dim, rate_keys, cluster))


def memory_bound_time_s(bytes_moved: float, cluster: Cluster) -> float:
    """Seconds for an element-wise kernel that streams `bytes_moved` through HBM.

    Time = bytes / achievable bandwidth (STREAM-style roofline; efficiency.memory_bound is the
    reachable fraction of the datasheet HBM figure).
    """
    if bytes_moved < 0:
        raise PerfModelError(f"bytes_moved must not be negative, got {bytes_moved}")
    return bytes_moved / (cluster.gpu.memory_bandwidth_gbps * 1e9 * cluster.efficiency.memory_bound)


# ---------------------------------------------------------------------- communication


def link_for(span: GroupSpan, cluster: Cluster) -> tuple[float, float]:
    """(bytes_per_s, latency_s) that a ring over `span` sees per rank per direction.

    Inside one node: the NVLink/xGMI/PCIe share of a GPU. Across nodes with k members per
    node: NCCL runs one ring per NIC, so the k rings cross each node boundary through k
    NICs in parallel and the bottleneck is min(intra, k * inter) (NCCL docs, "rings";
    Jeaugey, NCCL 2.x talks GTC 2019); latency is the inter-node hop.
    """
    _check_span(span, cluster)
    net = cluster.efficiency.network
    intra_gbps = intra_bandwidth_gbps(min(span.ranks_per_node, span.size), cluster)
    if not span.crosses_nodes:
        return intra_gbps * 1e9 * net, cluster.intra_node.latency_us * 1e-6
    bandwidth_gbps = min(intra_gbps, span.ranks_per_node * cluster.inter_node.bandwidth_gbps)
    return bandwidth_gbps * 1e9 * net, cluster.inter_node.latency_us * 1e-6


def intra_bandwidth_gbps(members: int, cluster: Cluster) -> float:
    """GB/s per direction a GPU has towards the other `members - 1` members of its group that
    share its fast domain. On a switch (or PCIe) every group gets the GPU's whole share; on a
    mesh (`intra_node.fabric`, hwprofiles/cluster.py) the group's traffic runs over the
    direct links to those members only: (members - 1) of the domain's (n - 1) links (RCCL
    spreads a ring's channels over the direct links it has; MI300X: 7 x 64 GB/s). A group
    with one member per domain sends nothing over these links: it gets the whole share."""
    link, n = cluster.intra_node, cluster.fast_domain_gpus
    if link.fabric != "mesh" or members < 2 or n < 2:
        return link.bandwidth_gbps
    return link.bandwidth_gbps * (min(members, n) - 1) / (n - 1)


def collective_time_s(
    kind: str, bytes_per_rank: float, span: GroupSpan, cluster: Cluster, algorithm: str = "ring"
) -> float:
    """Seconds for one collective over a group laid out as `span` (alpha-beta model).

    `bytes_per_rank` is the full buffer each rank holds: the all_reduce input, the
    all_gather output, the reduce_scatter input, the all_to_all send buffer, the
    broadcast/send_recv message. `algorithm="auto"` takes the faster of ring and tree,
    as NCCL's tuner does.
    """
    if kind not in COLLECTIVES:
        raise PerfModelError(f"unknown collective {kind!r}; use one of {', '.join(COLLECTIVES)}")
    if algorithm not in ALGORITHMS:
        raise PerfModelError(f"unknown algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    if bytes_per_rank < 0:
        raise PerfModelError(f"bytes_per_rank must not be negative, got {bytes_per_rank}")
    _check_span(span, cluster)
    if span.size == 1:
        return 0.0
    if algorithm == "auto":
        times = [_ring(kind, bytes_per_rank, span, cluster)]
        if kind in TREE_COLLECTIVES:
            times.append(_tree(kind, bytes_per_rank, span, cluster))
        return min(times)
    if algorithm == "tree":
        if kind not in TREE_COLLECTIVES:
            raise PerfModelError(
                f"algorithm 'tree' is defined for {', '.join(TREE_COLLECTIVES)}, not {kind!r}; "
                f"use algorithm='ring' or 'auto'"
            )
        return _tree(kind, bytes_per_rank, span, cluster)
    return _ring(kind, bytes_per_rank, span, cluster)


def single_nic_collective_time_s(kind: str, bytes_per_rank: float, span: GroupSpan, cluster: Cluster) -> float:
    """Seconds for an all_gather or reduce_scatter whose cross-node traffic each GPU sends
    through its own NIC only, at efficiency.single_nic_network of it.

    Inside a node: the ring of `collective_time_s`. Across nodes it is not the k-NIC rate that
    `link_for` gives a large bucketed all-reduce: many small collectives issued layer by layer
    (sharded data parallelism) take the same time for the same bytes per GPU with 8 or 4
    group members per node (Narayanan et al. 2021, Table 2).
    """
    if kind not in ("all_gather", "reduce_scatter"):
        raise PerfModelError(f"single-NIC collectives are all_gather and reduce_scatter, not {kind!r}")
    if bytes_per_rank < 0:
        raise PerfModelError(f"bytes_per_rank must not be negative, got {bytes_per_rank}")
    _check_span(span, cluster)
    if not span.crosses_nodes:
        return collective_time_s(kind, bytes_per_rank, span, cluster)
    n = span.size
    bw = cluster.inter_node.bandwidth_gbps * 1e9 * cluster.efficiency.single_nic_network
    # Ring all_gather / reduce_scatter: (n-1)/n * B per rank (Thakur, Rabenseifner, Gropp 2005).
    return (n - 1) / n * bytes_per_rank / bw + (n - 1) * cluster.inter_node.latency_us * 1e-6


def sharded_dp_collective_time_s(kind: str, bytes_per_rank: float, span: GroupSpan, cluster: Cluster) -> float:
    """Seconds for one ZeRO-2/3 / FSDP per-micro-batch all_gather or reduce_scatter, as the
    stack issues them (efficiency.zero_collectives): on each GPU's own NIC ("per_nic",
    `single_nic_collective_time_s`) or as NCCL's multi-rail ring ("ring", `collective_time_s`)."""
    if cluster.efficiency.zero_collectives == "ring":
        if kind not in ("all_gather", "reduce_scatter"):
            raise PerfModelError(f"sharded-DP collectives are all_gather and reduce_scatter, not {kind!r}")
        return collective_time_s(kind, bytes_per_rank, span, cluster)
    return single_nic_collective_time_s(kind, bytes_per_rank, span, cluster)


def p2p_time_s(bytes_: float, cross_node: bool, cluster: Cluster) -> float:
    """Seconds for one GPU to send `bytes_` to one other GPU (pipeline stage boundary).

    One stream uses one GPU's share of one link class: its NVLink share inside a node, its
    own NIC across nodes (GPUDirect RDMA; NCCL p2p uses the GPU's nearest NIC). B/bw + alpha.
    """
    if bytes_ < 0:
        raise PerfModelError(f"bytes_ must not be negative, got {bytes_}")
    link = cluster.inter_node if cross_node else cluster.intra_node
    bandwidth_gbps = link.bandwidth_gbps if cross_node else intra_bandwidth_gbps(2, cluster)
    return bytes_ / (bandwidth_gbps * 1e9 * cluster.efficiency.network) + link.latency_us * 1e-6


def ring_p2p_time_s(bytes_total: float, span: GroupSpan, cluster: Cluster) -> float:
    """Seconds to pass every member's 1/n of `bytes_total` round a ring of send/recv steps
    (Transformer Engine's context-parallel attention, cp_comm_type "p2p": n-1 steps, each a
    send to the next rank). Inside a node: the ring all_gather of `collective_time_s`. Across
    nodes each step waits for the pairs at node boundaries, each on one GPU's own NIC
    (`p2p_time_s`), so a node's k NICs do not add up as NCCL's multi-rail rings do; with one
    member per node the two agree."""
    if bytes_total < 0:
        raise PerfModelError(f"bytes_total must not be negative, got {bytes_total}")
    _check_span(span, cluster)
    if not span.crosses_nodes:
        return collective_time_s("all_gather", bytes_total, span, cluster)
    return (span.size - 1) * p2p_time_s(bytes_total / span.size, True, cluster)


def _ring(kind: str, b: float, span: GroupSpan, cluster: Cluster) -> float:
    """Ring alpha-beta costs (Thakur, Rabenseifner, Gropp 2005; nccl-tests doc/PERFORMANCE.md)."""
    n = span.size
    if kind == "send_recv":
        return p2p_time_s(b, span.crosses_nodes, cluster)
    if kind == "all_to_all":
        return _all_to_all(b, span, cluster)
    bw, alpha = link_for(span, cluster)
    if kind == "all_reduce":  # reduce-scatter then all-gather: 2(n-1)/n * B
        return 2 * (n - 1) / n * b / bw + 2 * (n - 1) * alpha
    if kind in ("reduce_scatter", "all_gather"):  # (n-1)/n * B
        return (n - 1) / n * b / bw + (n - 1) * alpha
    # broadcast: pipelined ring/chain, every rank receives all of B once; n-1 hops to fill
    return b / bw + (n - 1) * alpha


def _tree(kind: str, b: float, span: GroupSpan, cluster: Cluster) -> float:
    """NCCL double binary tree (Sanders, Speck, Traeff 2009; Jeaugey, NCCL 2.4 blog 2019).

    Each rank is interior in one tree and a leaf in the other, each tree carrying B/2:
    reduce sends and receives B per rank, broadcast the same again, so all_reduce moves
    2B per rank (vs ring 2(n-1)/n B) with 2 * depth latency terms instead of 2(n-1).
    """
    bw, alpha = link_for(span, cluster)
    depth = math.ceil(math.log2(span.size))
    return 2 * b / bw + 2 * depth * alpha  # all_reduce, the one tree collective


def _all_to_all(b: float, span: GroupSpan, cluster: Cluster) -> float:
    """Direct exchange (pairwise, Thakur et al. 2005): (n-1)/n * B leaves each rank.

    Not a ring: the off-node share (n-k)/n * B goes through the rank's own NIC share, the
    on-node share (k-1)/n * B over NVLink, concurrently; n-1 messages pay alpha each.
    """
    n, k = span.size, min(span.ranks_per_node, span.size)
    if not span.crosses_nodes:
        bw, alpha = link_for(span, cluster)
        return (n - 1) / n * b / bw + (n - 1) * alpha
    return _nvlink_and_nic_s((k - 1) / n * b, (n - k) / n * b, n, k, cluster)


def _nvlink_and_nic_s(intra_bytes: float, inter_bytes: float, n: int, k: int, cluster: Cluster) -> float:
    """An exchange among `n` ranks, `k` per node, across nodes that sends `intra_bytes` per rank
    over NVLink and `inter_bytes` through the rank's own NIC share, concurrently; n-1 messages
    pay alpha."""
    net = cluster.efficiency.network
    intra_s = intra_bytes / (intra_bandwidth_gbps(k, cluster) * 1e9 * net)
    inter_s = inter_bytes / (cluster.inter_node.bandwidth_gbps * 1e9 * net)
    return max(intra_s, inter_s) + (n - 1) * cluster.inter_node.latency_us * 1e-6


def expert_dispatch_time_s(bytes_per_rank: float, span: GroupSpan, cluster: Cluster, top_k: int,
                           num_experts: int = 0) -> float:
    """Seconds for one MoE dispatch (or combine) over the expert-parallel group `span`.

    `bytes_per_rank` is a rank's send buffer: its tokens x hidden x `top_k` copies. The stack's
    `efficiency.ep_dispatcher` says how it crosses nodes: "all_to_all" is NCCL's all-to-all
    (`collective_time_s`); "node_dedup" sends a token once to each other node that holds one of
    its experts and forwards it there over NVLink (DeepEP / HybridEP; DeepSeek-V3 report,
    Liu et al. 2024, section 3.2.2). With balanced routing a token's `top_k` distinct experts,
    of `num_experts` spread evenly over the N nodes, miss a given node with probability
    C(E - E/N, top_k) / C(E, top_k), so they reach (N-1)(1 - that) of the N-1 others
    ((1 - 1/N)^top_k, draws with replacement, when `num_experts` is not given). NVLink carries
    the on-node copies and the forwarding of the arrivals whose expert is not on the GPU they
    landed on, concurrently with the NIC. N = size / ranks per node, as `_all_to_all` takes it.
    """
    if cluster.efficiency.ep_dispatcher == "all_to_all" or not span.crosses_nodes or top_k < 1:
        return collective_time_s("all_to_all", bytes_per_rank, span, cluster)
    if bytes_per_rank < 0:
        raise PerfModelError(f"bytes_per_rank must not be negative, got {bytes_per_rank}")
    _check_span(span, cluster)
    n, k = span.size, min(span.ranks_per_node, span.size)
    nodes = n / k
    off_node = (n - k) / n * bytes_per_rank  # what an all-to-all sends over the NICs
    per_copy = bytes_per_rank / top_k
    per_node = num_experts / nodes
    if num_experts >= top_k and per_node == int(per_node):
        miss = math.comb(num_experts - int(per_node), top_k) / math.comb(num_experts, top_k)
    else:
        miss = (1.0 - 1.0 / nodes) ** top_k
    inter_bytes = min(off_node, per_copy * (nodes - 1) * (1.0 - miss))
    intra_bytes = (k - 1) / n * bytes_per_rank + off_node * (k - 1) / k
    return _nvlink_and_nic_s(intra_bytes, inter_bytes, n, k, cluster)


def _check_dims(m: int, n: int, k: int) -> None:
    for name, value in (("m", m), ("n", n), ("k", k)):
        if value < 1:
            raise PerfModelError(f"GEMM dimension {name} must be at least 1, got {value}")


def _check_span(span: GroupSpan, cluster: Cluster) -> None:
    if span.size < 1 or span.ranks_per_node < 1:
        raise PerfModelError(f"group span needs size and ranks_per_node of at least 1, got {span}")
    if span.ranks_per_node > cluster.fast_domain_gpus:
        raise PerfModelError(
            f"group has {span.ranks_per_node} ranks per NVLink domain but one of {cluster.name!r} has "
            f"{cluster.fast_domain_gpus} GPUs; use ParallelLayout(..., gpus_per_node={cluster.fast_domain_gpus}).span(dim)"
        )
