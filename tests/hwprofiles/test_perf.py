"""Limits of the hardware performance model (no timing asserts: pure arithmetic)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from smplan.hwprofiles import (
    COLLECTIVES,
    GroupSpan,
    HardwareProfileError,
    PerfModelError,
    collective_time_s,
    expert_dispatch_time_s,
    link_for,
    load_cluster,
    matmul_efficiency,
    matmul_time_s,
    memory_bound_time_s,
    p2p_time_s,
    single_nic_collective_time_s,
    wave_efficiency,
)

A100 = load_cluster("a100x8", nodes=4)
NET = A100.efficiency.network
NODE = GroupSpan(size=8, ranks_per_node=8)  # tp=8 inside one node
ACROSS = GroupSpan(size=8, ranks_per_node=1)  # dp=8 with tp=8: one member per node
ALPHA_INTRA = A100.intra_node.latency_us * 1e-6
ALPHA_INTER = A100.inter_node.latency_us * 1e-6


def ring_bandwidth_term(b, n, bw_gbps):
    return 2 * (n - 1) / n * b / (bw_gbps * 1e9 * NET)


@pytest.mark.parametrize("span,bw_gbps", [(NODE, 300.0), (ACROSS, 25.0), (GroupSpan(32, 8), 200.0)])
def test_large_all_reduce_approaches_ring_bandwidth_bound(span, bw_gbps):
    ratios = [
        collective_time_s("all_reduce", b, span, A100) / ring_bandwidth_term(b, span.size, bw_gbps)
        for b in (1e6, 1e8, 1e10, 1e12)
    ]
    assert all(r > 1 for r in ratios)
    assert ratios == sorted(ratios, reverse=True)  # latency share shrinks as bytes grow
    assert ratios[-1] == pytest.approx(1.0, abs=1e-4)


def test_latency_dominates_small_messages():
    t = collective_time_s("all_reduce", 8, NODE, A100)
    assert t == pytest.approx(2 * 7 * ALPHA_INTRA, rel=1e-3)
    t = collective_time_s("all_gather", 8, ACROSS, A100)
    assert t == pytest.approx(7 * ALPHA_INTER, rel=1e-3)


@pytest.mark.parametrize("kind", COLLECTIVES)
@pytest.mark.parametrize("nbytes", [1e3, 1e6, 1e9])
def test_cross_node_group_slower_than_in_node(kind, nbytes):
    assert collective_time_s(kind, nbytes, ACROSS, A100) > collective_time_s(
        kind, nbytes, NODE, A100
    )


@pytest.mark.parametrize("kind", COLLECTIVES)
def test_group_of_one_is_free_and_time_grows_with_bytes(kind):
    assert collective_time_s(kind, 1e9, GroupSpan(1, 1), A100) == 0.0
    times = [collective_time_s(kind, b, NODE, A100) for b in (0, 1e3, 1e6, 1e9)]
    assert times == sorted(times) and times[0] > 0  # zero bytes still pays latency


def test_ring_all_reduce_is_reduce_scatter_plus_all_gather():
    for span in (NODE, ACROSS):
        b = 3e8
        rs = collective_time_s("reduce_scatter", b, span, A100)
        ag = collective_time_s("all_gather", b, span, A100)
        assert collective_time_s("all_reduce", b, span, A100) == pytest.approx(rs + ag)


def test_tree_wins_small_ring_wins_large_auto_takes_min():
    span = GroupSpan(size=64, ranks_per_node=1)
    big = load_cluster("a100x8", nodes=64)
    small, large = 1e3, 1e10
    ring_s = collective_time_s("all_reduce", small, span, big, "ring")
    tree_s = collective_time_s("all_reduce", small, span, big, "tree")
    assert tree_s < ring_s
    assert tree_s == pytest.approx(2 * math.log2(64) * ALPHA_INTER, rel=1e-2)
    ring_l = collective_time_s("all_reduce", large, span, big, "ring")
    tree_l = collective_time_s("all_reduce", large, span, big, "tree")
    assert ring_l < tree_l
    assert tree_l == pytest.approx(2 * large / (25e9 * NET), rel=1e-3)  # double binary tree: 2B/bw
    for b in (small, large):
        auto = collective_time_s("all_reduce", b, span, big, "auto")
        assert auto == min(
            collective_time_s("all_reduce", b, span, big, a) for a in ("ring", "tree")
        )
    assert collective_time_s("all_gather", small, span, big, "auto") == collective_time_s(
        "all_gather", small, span, big, "ring"
    )


def test_link_for_rings_share_node_nics_capped_by_intra():
    bw, lat = link_for(NODE, A100)
    assert (bw, lat) == (pytest.approx(300e9 * NET), pytest.approx(ALPHA_INTRA))
    bw, lat = link_for(GroupSpan(16, 4), A100)  # 4 rings through 4 NICs of 25 GB/s
    assert bw == pytest.approx(100e9 * NET) and lat == pytest.approx(ALPHA_INTER)
    l40s = load_cluster("l40sx8", nodes=2)  # 8 x 6.25 GB/s NICs beat 32 GB/s PCIe: PCIe caps it
    assert link_for(GroupSpan(16, 8), l40s)[0] == pytest.approx(32e9 * l40s.efficiency.network)


def test_all_to_all_across_nodes_uses_each_rank_own_nic():
    span, b = GroupSpan(16, 8), 1e10
    # half the buffer leaves the node through the rank's own NIC share; 15 messages pay alpha
    expected = 8 / 16 * b / (25e9 * NET) + 15 * ALPHA_INTER
    assert collective_time_s("all_to_all", b, span, A100) == pytest.approx(expected, rel=1e-4)


def test_node_dedup_dispatch_sends_each_token_once_per_node():
    """DeepEP / HybridEP: a token crosses to each other node holding one of its experts once."""
    dedup = load_cluster("a100x8", nodes=4, overrides={"efficiency.ep_dispatcher": "node_dedup"})
    span, b = GroupSpan(16, 8), 1e10  # two nodes of 8
    plain = collective_time_s("all_to_all", b, span, A100)
    assert expert_dispatch_time_s(b, span, A100, top_k=8) == plain  # the stack's default: all_to_all
    # top_k = 8 over 2 nodes: the other node is hit with probability 1 - (1/2)^8, one copy of b/8,
    # not the 8/16 of b an all-to-all sends; NVLink carries the on-node copies and the forwarding
    inter = b / 8 * (1 - 0.5**8) / (25e9 * NET)
    intra = (7 / 16 * b + 8 / 16 * b * 7 / 8) / (300e9 * NET)
    assert expert_dispatch_time_s(b, span, dedup, top_k=8) == pytest.approx(max(inter, intra) + 15 * ALPHA_INTER)
    assert expert_dispatch_time_s(b, span, dedup, top_k=8) < plain
    # with the expert count, the draws are without replacement: 8 of 16 experts, 8 per node,
    # miss the other node only if all 8 are this node's, C(8, 8) / C(16, 8)
    exact = b / 8 * (1 - 1 / 12870) / (25e9 * NET)
    assert expert_dispatch_time_s(b, span, dedup, top_k=8, num_experts=16) == pytest.approx(
        max(exact, intra) + 15 * ALPHA_INTER)
    # inside one node, or with one expert per token, there is nothing to deduplicate
    assert expert_dispatch_time_s(b, NODE, dedup, top_k=8) == collective_time_s("all_to_all", b, NODE, dedup)
    one = load_cluster("a100x8", nodes=4, overrides={"efficiency.ep_dispatcher": "node_dedup",
                                                      "intra_node.bandwidth_gbps": 1e6})
    assert expert_dispatch_time_s(b, span, one, top_k=1) == pytest.approx(
        collective_time_s("all_to_all", b, span, one), rel=1e-9)


@given(top_k=st.integers(1, 16), nodes=st.sampled_from([2, 4, 8, 16]), per_node=st.sampled_from([1, 2, 4, 8]),
       experts_per_rank=st.sampled_from([0, 1, 2, 8]))
def test_node_dedup_never_sends_more_across_nodes_than_an_all_to_all(top_k, nodes, per_node, experts_per_rank):
    # NVLink made free: what is compared is the bytes through the NICs (NVLink also forwards)
    dedup = load_cluster("a100x8", nodes=16, overrides={"efficiency.ep_dispatcher": "node_dedup",
                                                        "intra_node.bandwidth_gbps": 1e6})
    span = GroupSpan(nodes * per_node, per_node)
    plain = collective_time_s("all_to_all", 1e9, span, dedup)
    experts = experts_per_rank * nodes * per_node
    assert expert_dispatch_time_s(1e9, span, dedup, top_k, experts) <= plain * (1 + 1e-12)


def test_send_recv_and_p2p():
    b = 1e8
    assert p2p_time_s(b, True, A100) > p2p_time_s(b, False, A100)
    assert p2p_time_s(b, False, A100) == pytest.approx(b / (300e9 * NET) + ALPHA_INTRA)
    assert collective_time_s("send_recv", b, ACROSS, A100) == p2p_time_s(b, True, A100)
    assert p2p_time_s(0, True, A100) == pytest.approx(ALPHA_INTER)


def test_bad_requests_name_the_valid_choices():
    with pytest.raises(PerfModelError, match="all_reduce, reduce_scatter") as err:
        collective_time_s("allreduce", 1e6, NODE, A100)
    assert isinstance(err.value, ValueError)
    with pytest.raises(PerfModelError, match="ring, tree, auto"):
        collective_time_s("all_reduce", 1e6, NODE, A100, algorithm="butterfly")
    with pytest.raises(PerfModelError, match="use algorithm='ring'"):
        collective_time_s("all_gather", 1e6, NODE, A100, algorithm="tree")
    with pytest.raises(PerfModelError, match="must not be negative"):
        collective_time_s("all_reduce", -1, NODE, A100)
    with pytest.raises(PerfModelError, match="gpus_per_node=8"):
        collective_time_s("all_reduce", 1e6, GroupSpan(16, 16), A100)
    with pytest.raises(PerfModelError, match="at least 1"):
        matmul_time_s(0, 8, 8, A100)
    with pytest.raises(PerfModelError, match="unknown dtype"):
        matmul_time_s(8, 8, 8, A100, dtype="int4")
    with pytest.raises(HardwareProfileError, match="no fp8 peak"):
        matmul_time_s(8, 8, 8, A100, dtype="fp8")


dims = st.integers(min_value=1, max_value=1 << 16)


@given(m=dims, n=dims, k=dims, grow=st.integers(min_value=1, max_value=1 << 12))
def test_matmul_efficiency_monotone_and_bounded(m, n, k, grow):
    e = matmul_efficiency(m, n, k, A100)
    assert 0 < e <= A100.efficiency.matmul_max
    assert matmul_efficiency(m + grow, n, k, A100) >= e
    assert matmul_efficiency(m + grow, n + grow, k + grow, A100) >= e


def test_matmul_efficiency_half_point():
    half = int(A100.efficiency.matmul_half_dim)
    assert matmul_efficiency(half, 4096, 4096, A100) == pytest.approx(
        A100.efficiency.matmul_max / 2
    )


def test_matmul_ceiling_scales_the_a100_fit_by_each_gpus_measured_ceiling():
    """efficiency.matmul_max was fitted on A100; another GPU's GEMMs run at its measured share of
    peak (gpu.matmul_ceiling, per dtype) relative to A100's."""
    h100 = load_cluster("h100x8")
    shape = (8192, 8192, 8192)
    ratio = matmul_efficiency(*shape, h100) / matmul_efficiency(*shape, A100)
    assert ratio == pytest.approx(h100.gpu.matmul_ceiling.bf16 / A100.gpu.matmul_ceiling.bf16)
    fp8 = matmul_efficiency(*shape, h100, dtype="fp8") / matmul_efficiency(*shape, h100)
    assert fp8 == pytest.approx(h100.gpu.matmul_ceiling.fp8 / h100.gpu.matmul_ceiling.bf16) and fp8 < 1
    # a GPU measured at bf16 only (MI300X) times fp8 GEMMs at its bf16 figure
    mi = load_cluster("mi300xx8")
    assert mi.gpu.matmul_ceiling.fp8 == 0.0
    assert matmul_efficiency(*shape, mi, dtype="fp8") == matmul_efficiency(*shape, mi)
    # the A100 profiles keep the fitted value exactly
    assert matmul_efficiency(*shape, A100) == pytest.approx(A100.efficiency.matmul_max * 8192 / (8192 + 80))


@pytest.mark.parametrize("value", [0.0, 1.5, -0.1])
def test_matmul_ceiling_out_of_range_is_one_line(value):
    with pytest.raises(HardwareProfileError) as err:
        load_cluster("h100x8", overrides={"gpu.matmul_ceiling.bf16": value})
    assert "gpu.matmul_ceiling.bf16 must be in (0, 1]" in str(err.value) and "\n" not in str(err.value)


def test_roofline_skinny_matmul_is_memory_bound():
    m, n, k = 1, 8192, 8192  # a matrix-vector product: ~1 FLOP per byte
    bytes_moved = (m * k + k * n + m * n) * 2
    assert matmul_time_s(m, n, k, A100) == pytest.approx(memory_bound_time_s(bytes_moved, A100))


def test_roofline_large_matmul_is_compute_bound():
    m = n = k = 8192
    eff = matmul_efficiency(m, n, k, A100)
    expected = 2 * m * n * k / (312e12 * eff)
    assert matmul_time_s(m, n, k, A100) == pytest.approx(expected)
    assert matmul_time_s(m, n, k, A100, batch=4) == pytest.approx(4 * expected)
    # fp32 runs at 19.5 TFLOP/s on A100: 16x slower than bf16
    assert matmul_time_s(m, n, k, A100, dtype="fp32") == pytest.approx(16 * expected)


def test_memory_bound_time():
    assert memory_bound_time_s(2039e9 * A100.efficiency.memory_bound, A100) == pytest.approx(1.0)
    assert memory_bound_time_s(0, A100) == 0.0


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_zero_collectives_use_one_nic_whatever_the_members_per_node(kind):
    # Megatron SC21 Table 2: ZeRO-3 rows with 8 and 4 group members per node take the same
    # time for the same bytes per GPU; a bucketed all_reduce gets the k-NIC rate instead.
    b, n = 4e9, 256
    eight, four = GroupSpan(n, 8), GroupSpan(n, 4)
    t8 = single_nic_collective_time_s(kind, b, eight, A100)
    assert t8 == pytest.approx(single_nic_collective_time_s(kind, b, four, A100))
    nic = A100.inter_node.bandwidth_gbps * 1e9 * A100.efficiency.single_nic_network
    assert t8 == pytest.approx((n - 1) / n * b / nic + (n - 1) * ALPHA_INTER)
    assert t8 > collective_time_s(kind, b, eight, A100)
    # inside one node it is the ordinary NVLink ring
    assert single_nic_collective_time_s(kind, b, NODE, A100) == collective_time_s(kind, b, NODE, A100)
    with pytest.raises(PerfModelError, match="all_gather and reduce_scatter"):
        single_nic_collective_time_s("all_reduce", b, eight, A100)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_sharded_dp_collectives_follow_the_stacks_choice(kind):
    """DeepSpeed's per-module collectives ("per_nic") use one NIC's share; FSDP's one flat
    parameter per block ("ring") is a large NCCL collective over all the node's rails."""
    from smplan.hwprofiles import sharded_dp_collective_time_s

    b, span = 4e9, GroupSpan(16, 8)
    per_nic = A100.with_overrides({"efficiency.zero_collectives": "per_nic"})
    ring = A100.with_overrides({"efficiency.zero_collectives": "ring"})
    assert sharded_dp_collective_time_s(kind, b, span, per_nic) == single_nic_collective_time_s(kind, b, span, per_nic)
    assert sharded_dp_collective_time_s(kind, b, span, ring) == collective_time_s(kind, b, span, ring)
    assert sharded_dp_collective_time_s(kind, b, span, ring) < sharded_dp_collective_time_s(kind, b, span, per_nic)
    # inside one node both are the NVLink ring
    assert sharded_dp_collective_time_s(kind, b, NODE, ring) == sharded_dp_collective_time_s(kind, b, NODE, per_nic)
    with pytest.raises(PerfModelError, match="all_gather and reduce_scatter"):
        sharded_dp_collective_time_s("all_reduce", b, span, ring)


def test_zero_collectives_unknown_value_is_one_line():
    with pytest.raises(HardwareProfileError) as err:
        load_cluster("a100x8", overrides={"efficiency.zero_collectives": "tree"})
    assert "efficiency.zero_collectives must be one of per_nic, ring" in str(err.value)
    assert "\n" not in str(err.value)


def test_an_nvlink_domain_larger_than_a_node_keeps_collectives_on_nvlink():
    """On NVL72 a 64-rank expert all-to-all and a 32-rank all-reduce stay on NVLink across
    16 trays; the same groups on 8-GPU B200 nodes cross InfiniBand and take longer."""
    from smplan.hwprofiles import ParallelLayout, load_cluster
    from smplan.hwprofiles.perf import collective_time_s

    rack = load_cluster("gb200nvl72", nodes=18)
    nodes = load_cluster("b200x8", nodes=8)
    bytes_per_rank = 256 * 2**20
    for kind, size in (("all_to_all", 64), ("all_reduce", 32)):
        on_rack = ParallelLayout(pp=1, dp=size, tp=1, gpus_per_node=rack.fast_domain_gpus).span("dp")
        on_nodes = ParallelLayout(pp=1, dp=size, tp=1, gpus_per_node=nodes.fast_domain_gpus).span("dp")
        assert not on_rack.crosses_nodes and on_nodes.crosses_nodes
        assert collective_time_s(kind, bytes_per_rank, on_rack, rack) < collective_time_s(
            kind, bytes_per_rank, on_nodes, nodes) / 2  # ring: min(900, 8 x 50) GB/s per rank across nodes


# ------------------------------------------------------------ wave quantisation (opt-in)

H100 = load_cluster("h100x8")


def test_wave_quantisation_is_off_by_default():
    assert H100.efficiency.gemm_tile == 0 and H100.gpu.sm_count == 132
    assert wave_efficiency(129, 128, H100) == 1.0


def test_wave_efficiency_counts_whole_waves_over_the_sms():
    h100 = H100.with_overrides({"efficiency.gemm_tile": 128})
    # 132 tiles fill one wave of H100's 132 SMs; 133 need a second, nearly empty one
    assert wave_efficiency(128 * 132, 128, h100) == 1.0
    assert wave_efficiency(128 * 133, 128, h100) == pytest.approx(133 / 264)
    # a partial tile counts whole (tile quantisation): 129 x 128 is 2 tiles, not 1.008
    assert wave_efficiency(129, 128, h100) == pytest.approx(2 / 132)
    # batched GEMMs (heads, local experts) share the waves; separate launches do not
    assert wave_efficiency(128, 128, h100, batch=264) == 1.0
    one = matmul_time_s(1024, 1024, 8192, h100)  # 64 tiles: one wave, 64 of 132 SMs busy (compute-bound)
    assert matmul_time_s(1024, 1024, 8192, h100, batch=66, launches=66) == pytest.approx(66 * one)
    assert matmul_time_s(1024, 1024, 8192, h100, batch=66) == pytest.approx(66 * one * 64 / 132)  # 32 full waves
    assert wave_efficiency(0, 128, h100) == 1.0  # an empty GEMM has no waves to count


def test_wave_quantisation_slows_the_gemm_by_its_efficiency_only():
    on = H100.with_overrides({"efficiency.gemm_tile": 128})
    m, n, k = 128 * 133, 1024, 8192  # 1,064 tiles in 9 waves; compute-bound (the roofline's HBM term is 8x below)
    base, quantised = matmul_time_s(m, n, k, H100), matmul_time_s(m, n, k, on)
    assert wave_efficiency(m, n, on) == pytest.approx(1064 / (9 * 132))
    assert quantised == pytest.approx(base / wave_efficiency(m, n, on))
    # a profile that states no SM count is not quantised
    no_sms = on.with_overrides({"gpu.sm_count": 0})
    assert matmul_time_s(m, n, k, no_sms) == pytest.approx(base)


@pytest.mark.parametrize("key", ["efficiency.gemm_tile", "gpu.sm_count"])
def test_negative_tile_or_sm_count_is_one_line(key):
    with pytest.raises(HardwareProfileError, match=f"{key} must not be negative"):
        H100.with_overrides({key: -1})
