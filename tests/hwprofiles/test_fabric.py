"""How a fast domain's GPUs connect (`intra_node.fabric`): a switch gives every group the GPU's
whole share, a mesh (MI300X) only the direct links to the group's members, and PCIe has no
userbuffers to hide the TP collectives under the GEMMs."""

import pytest
from click.testing import CliRunner
from smplan.hwprofiles import GroupSpan, HardwareProfileError, load_cluster
from smplan.hwprofiles.perf import collective_time_s, intra_bandwidth_gbps, p2p_time_s

from smplan.cli.main import cli

MI300X = load_cluster("mi300xx8")  # fabric = "mesh", 7 links of 64 GB/s
SWITCH = MI300X.with_overrides({"intra_node.fabric": "switch"})
GB = 1e9


def test_bundled_fabrics():
    assert MI300X.intra_node.fabric == "mesh"
    assert load_cluster("l40sx8").intra_node.fabric == "pcie"
    assert load_cluster("h100x8").intra_node.fabric == "switch"
    assert load_cluster("gb200nvl72").intra_node.fabric == "switch"


@pytest.mark.parametrize("members", [2, 3, 4, 8])
def test_a_mesh_group_uses_its_members_direct_links(members):
    assert intra_bandwidth_gbps(members, MI300X) == pytest.approx(64.0 * (members - 1))
    assert intra_bandwidth_gbps(members, SWITCH) == 448.0
    span = GroupSpan(size=members, ranks_per_node=members)
    alpha = (members - 1) * MI300X.intra_node.latency_us * 1e-6
    mesh_s = collective_time_s("all_gather", GB, span, MI300X) - alpha
    switch_s = collective_time_s("all_gather", GB, span, SWITCH) - alpha
    assert mesh_s == pytest.approx(switch_s * 7 / (members - 1))


def test_a_mesh_point_to_point_send_takes_one_link():
    alpha = MI300X.intra_node.latency_us * 1e-6
    one_link_s = GB / (64.0 * GB * MI300X.efficiency.network)
    assert p2p_time_s(GB, False, MI300X) == pytest.approx(one_link_s + alpha)
    assert p2p_time_s(GB, False, SWITCH) == pytest.approx(one_link_s / 7 + alpha)
    assert p2p_time_s(GB, True, MI300X) == p2p_time_s(GB, True, SWITCH)  # the NIC: no mesh


def test_across_nodes_the_mesh_limits_only_the_members_in_a_node():
    two = MI300X.with_nodes(2)
    one_per_node = GroupSpan(size=2, ranks_per_node=1)  # no intra-node hop: the NIC decides
    assert collective_time_s("all_reduce", GB, one_per_node, two) == collective_time_s(
        "all_reduce", GB, one_per_node, two.with_overrides({"intra_node.fabric": "switch"}))


@pytest.mark.parametrize("dispatcher", ["all_to_all", "node_dedup"])
def test_across_nodes_an_exchange_takes_one_mesh_link_per_node_peer(dispatcher):
    """4 ranks on 2 nodes, 2 per node: each reaches its one node peer over k-1 = 1 of the 7 links,
    so the NVLink part takes 7x a switch's (a NIC fast enough that it is the NVLink part)."""
    from smplan.hwprofiles.perf import expert_dispatch_time_s

    fast_nic = {"inter_node.bandwidth_gbps": 1e5, "efficiency.ep_dispatcher": dispatcher}
    mesh = MI300X.with_nodes(2).with_overrides(fast_nic)
    switch = mesh.with_overrides({"intra_node.fabric": "switch"})
    span = GroupSpan(size=4, ranks_per_node=2)
    alpha = 3 * mesh.inter_node.latency_us * 1e-6  # n-1 messages
    mesh_s = expert_dispatch_time_s(GB, span, mesh, top_k=2, num_experts=8) - alpha
    switch_s = expert_dispatch_time_s(GB, span, switch, top_k=2, num_experts=8) - alpha
    intra_bytes = GB / 4 if dispatcher == "all_to_all" else GB / 4 + GB / 2 / 2  # on-node share (+ forwarding)
    assert mesh_s == pytest.approx(intra_bytes / (64.0 * GB * mesh.efficiency.network))
    assert mesh_s == pytest.approx(7 * switch_s)


def _tp_part():
    from smplan.planner.model_profile import BlockProfile, MatmulShape, TPCollective

    m = n = k = 8192
    coll = (TPCollective(kind="all_reduce", phase="forward", bytes_per_sample=m * n * 2.0),
            TPCollective(kind="all_reduce", phase="backward", bytes_per_sample=m * n * 2.0))
    return BlockProfile(name="block", kind="block", params=n * k, forward_flops_per_sample=2.0 * m * n * k,
                        saved_bytes_tp_sharded_per_sample=0.0, saved_bytes_replicated_per_sample=0.0,
                        saved_bytes_attention_core_per_sample=0.0, output_bytes_per_sample=0.0,
                        matmuls=(MatmulShape(m, n, k, tp_dim="n"),), tp_collectives=coll)


@pytest.mark.parametrize("fabric", ["switch", "pcie"])
def test_userbuffers_hide_tp_collectives_only_inside_an_nvlink_domain(fabric):
    """TE's userbuffers need CUDA multicast or IPC over NVLink: over PCIe, or for a TP group
    that leaves the domain, the collectives wait as without the overlap."""
    from smplan.planner.pass_model import pass_times

    cluster = load_cluster("l40sx8").with_nodes(2).with_overrides(
        {"intra_node.fabric": fabric, "efficiency.host_overhead_us_per_layer": 0.0})
    on = cluster.with_overrides({"efficiency.tp_comm_overlap": 1.0})
    off = cluster.with_overrides({"efficiency.tp_comm_overlap": 0.0})
    part = _tp_part()
    inside = GroupSpan(size=2, ranks_per_node=2)
    across = GroupSpan(size=2, ranks_per_node=1)
    assert pass_times(part, across, True, 1, on, "bf16") == pass_times(part, across, True, 1, off, "bf16")
    hidden, waits = pass_times(part, inside, True, 1, on, "bf16"), pass_times(part, inside, True, 1, off, "bf16")
    if fabric == "pcie":
        assert hidden == waits
    else:
        assert hidden.tp_forward_s < waits.tp_forward_s


def test_an_unknown_fabric_is_one_line_exit_2():
    result = CliRunner().invoke(cli, ["hw", "show", "h100x8", "--hw-set", "intra_node.fabric=ring"])
    assert result.exit_code == 2, result.output
    assert "intra_node.fabric must be one of switch, mesh, pcie, got 'ring'" in result.output
    assert "Traceback" not in result.output
    with pytest.raises(HardwareProfileError, match="fabric"):
        MI300X.with_overrides({"intra_node.fabric": "torus"})


def test_a_mesh_cannot_span_an_nvl72_domain():
    with pytest.raises(HardwareProfileError, match="use fabric=switch or nvlink_domain_gpus=0"):
        load_cluster("gb200nvl72").with_overrides({"intra_node.fabric": "mesh"})
    result = CliRunner().invoke(cli, ["hw", "show", "gb200nvl72", "--hw-set", "intra_node.fabric=pcie"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert [line for line in result.output.splitlines() if line.strip()] == [result.output.strip()]
