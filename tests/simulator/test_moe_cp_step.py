"""Expert all-to-alls and context-parallel collectives in the step simulation."""

import dataclasses

import pytest
from smplan.hwprofiles import load_cluster
from smplan.planner import profile_model
from smplan.planner.closed_form import estimate_from_costs
from smplan.planner.cost_model import plan_costs
from smplan.planner.plan import plan_from_inline
from smplan.simulator.api import simulate_plan, simulate_step

from .helpers import cluster, layout, uniform_costs


def _plan(text, profile, nodes):
    return plan_from_inline(text, model=profile.model, hw="h100x8", nodes=nodes, gpus_per_node=8,
                            num_blocks=profile.num_blocks)


@pytest.mark.parametrize("overlap", [0.0, 0.5])  # share of the all-to-alls hidden (ep_a2a_overlap)
@pytest.mark.parametrize("text", ["dp=16,pp=2,ep=16,mbs=1,gbs=64,zero=1", "dp=4,pp=2,ep=4,cp=2,mbs=1,gbs=16,zero=1"])
def test_moe_cp_step_equals_closed_form_without_contention(text, overlap):
    prof = profile_model("examples/moe.py:mixtral_8x7b", args={"layers": 4, "experts": 16}, seq_len=1024)
    cl = load_cluster("h100x8", nodes=4, overrides={"efficiency.ep_a2a_overlap": overlap})
    plan = _plan(text, prof, 4)
    costs = plan_costs(plan, prof, cl)
    assert any(s.ep_comm_forward_s > 0 for s in costs.stages)
    result = simulate_plan(plan, prof, cl, contention=False)
    closed = estimate_from_costs(costs)
    # 1e-6, not exact: the closed form adds the largest device tail to the last pipeline end, while
    # the device with the largest tail (its stage holds the head's parameters) may end its
    # pipeline earlier; here the tails differ by parts per million (uniform costs: exact, below).
    assert result.figures.step_time_s == pytest.approx(closed.step_time_s, rel=1e-6)
    assert result.figures.breakdown["ep_all_to_all"] == pytest.approx(closed.breakdown["ep_all_to_all"], rel=1e-9)


def _with_a2a(costs, seconds, crosses):
    stages = tuple(dataclasses.replace(s, ep_comm_forward_s=seconds, ep_comm_backward_s=seconds,
                                       ep_crosses_node=crosses) for s in costs.stages)
    return dataclasses.replace(costs, stages=stages)


def test_all_to_all_contends_with_dp_traffic_on_the_nic():
    base = uniform_costs("1f1b", 2, 8, tf=0.1, tb=0.2, send_s=0.0, dp_s=0.6)
    lay, cl = layout(2, dp=16, tp=1), cluster(4)
    across = _with_a2a(base, 0.05, crosses=True)
    inside = _with_a2a(base, 0.05, crosses=False)
    off = simulate_step(across, lay, cl, contention=False).step_time_s
    assert off == pytest.approx(estimate_from_costs(across).step_time_s, rel=1e-9)
    on_across = simulate_step(across, lay, cl, contention=True)
    on_inside = simulate_step(inside, lay, cl, contention=True)
    # the DP stream runs on the NIC (dp spans nodes): only the cross-node all-to-all shares it
    assert on_across.step_time_s > off
    assert on_inside.step_time_s == pytest.approx(off, rel=1e-9)
    assert any(row["shared_s"] > 0 for row in on_across.links)
    assert on_across.figures.breakdown["ep_all_to_all"] > estimate_from_costs(across).breakdown["ep_all_to_all"]


def test_a_dense_plan_reports_no_expert_or_context_communication():
    """The breakdown has ep/cp keys only where the plan has them, in the simulation too (no float
    rounding of a pass's end shown as shared CP links)."""
    prof = profile_model("examples/gpt.py:llama3_8b", args={"layers": 2}, seq_len=2048)
    cl = load_cluster("h100x8", nodes=1)
    plan = plan_from_inline("dp=8,zero=3,mbs=2,gbs=16", model=prof.model, hw="h100x8", nodes=1, gpus_per_node=8,
                            num_blocks=prof.num_blocks)
    breakdown = simulate_plan(plan, prof, cl, contention=True).figures.breakdown
    assert "cp_comm_exposed" not in breakdown and "ep_all_to_all" not in breakdown


def _with_hidden_cp(costs, seconds, crosses):
    stages = tuple(dataclasses.replace(s, cp_hidden_forward_s=seconds, cp_hidden_backward_s=seconds,
                                       cp_crosses_node=crosses) for s in costs.stages)
    return dataclasses.replace(costs, stages=stages)


def test_hidden_collectives_take_no_gpu_time_but_share_the_links():
    """The share of the CP collectives hidden under compute runs beside it: drawn from the
    pass's start, the step unchanged without contention, and on the NIC it slows the DP
    stream that shares it (before, hidden traffic never touched the links)."""
    base = uniform_costs("1f1b", 2, 8, tf=0.1, tb=0.2, send_s=0.0, dp_s=0.6)
    lay, cl = layout(2, dp=16, tp=1), cluster(4)
    across = _with_hidden_cp(base, 0.08, crosses=True)
    off = simulate_step(across, lay, cl, contention=False)
    assert off.step_time_s == pytest.approx(estimate_from_costs(base).step_time_s, rel=1e-9)
    sends = [e for e in off.events if e.name == "cp-comm"]
    passes = {(e.device, e.start) for e in off.events if e.lane == "compute" and e.name in ("F", "B")}
    assert len(sends) == 2 * 2 * 8 and all((e.device, e.start) in passes for e in sends)
    assert all(e.end - e.start == pytest.approx(0.08) for e in sends)
    on = simulate_step(across, lay, cl, contention=True)
    assert on.step_time_s > simulate_step(base, lay, cl, contention=True).step_time_s
    assert any(row["shared_s"] > 0 for row in on.links)


def test_full_recompute_puts_every_all_to_all_on_the_links():
    """Each all-to-all of a pass goes on the links, hidden or exposed: without recompute a
    forward's and a backward's; under full recompute (Megatron-Core refuses the overlap) the
    recomputed forward's too, so the links carry one more forward's all-to-alls."""
    prof = profile_model("examples/moe.py:mixtral_8x7b", args={"layers": 4, "experts": 16}, seq_len=1024)
    cl = load_cluster("h100x8", nodes=4, overrides={"efficiency.ep_a2a_overlap": 0.5})
    on_links, stages = {}, {}
    for rc in ("none", "full"):
        plan = _plan(f"dp=32,ep=16,mbs=1,gbs=64,zero=1,recompute={rc}", prof, 4)
        stages[rc] = plan_costs(plan, prof, cl).stages[0]
        events = simulate_plan(plan, prof, cl, contention=False).raw.events
        on_links[rc] = sum(e.end - e.start for e in events if e.name == "ep-a2a")
    none = stages["none"]
    assert none.ep_hidden_forward_s > 0 and none.ep_hidden_backward_s > 0  # the overlap hid part of them
    per_forward = none.ep_comm_forward_s + none.ep_hidden_forward_s
    m = 64 // 32
    assert on_links["none"] == pytest.approx(m * (per_forward + none.ep_comm_backward_s + none.ep_hidden_backward_s))
    assert on_links["full"] == pytest.approx(on_links["none"] + m * per_forward)


def test_a_hidden_all_to_all_longer_than_its_pass_goes_on_with_the_next():
    """The cost model may hide a forward's all-to-all under the paired backward: what does not
    fit under the forward's compute runs under the device's next pass, none of it is lost, and
    with contention off the step is still the closed form's."""
    base = uniform_costs("1f1b", 2, 8, tf=0.1, tb=0.2, send_s=0.0, dp_s=0.0)
    stages = tuple(dataclasses.replace(s, ep_hidden_forward_s=0.15, ep_crosses_node=True) for s in base.stages)
    costs = dataclasses.replace(base, stages=stages)
    result = simulate_step(costs, layout(2, dp=16, tp=1), cluster(4), contention=False)
    assert result.step_time_s == pytest.approx(estimate_from_costs(base).step_time_s, rel=1e-9)
    drawn = sum(e.end - e.start for e in result.events if e.name == "ep-a2a")
    assert drawn == pytest.approx(2 * 8 * 0.15)  # 2 stages x 8 micro-batches, every second of it


@pytest.mark.parametrize(("ref", "text", "hw"), [
    ("examples/moe.py:mixtral_8x7b", "dp=32,ep=16,mbs=1,gbs=64,zero=1", "h100x8"),  # all-to-alls exposed again
    ("examples/gpt.py:llama3_8b", "tp=4,dp=8,mbs=1,gbs=32,zero=1,sp=1", "l40sx8"),  # TP collectives re-run over PCIe
])
def test_full_recompute_leaves_compute_alone_and_counts_its_collectives_once(ref, text, hw):
    """The breakdown's compute is the same with and without full recompute; what recompute
    re-runs of the collectives is counted as communication, not also as recompute."""
    args = {"layers": 4, "experts": 16} if "moe" in ref else {"layers": 4}
    prof = profile_model(ref, args=args, seq_len=1024)
    cl = load_cluster(hw, nodes=4, overrides={"efficiency.ep_a2a_overlap": 0.5, "efficiency.host_overhead_us_per_layer": 0.0,
                                              "efficiency.host_overhead_us_per_moe_layer": 0.0})
    got = {}
    for rc in ("none", "full"):
        plan = plan_from_inline(f"{text},recompute={rc}", model=prof.model, hw=hw, nodes=4, gpus_per_node=cl.gpus_per_node,
                                num_blocks=prof.num_blocks)
        got[rc] = simulate_plan(plan, prof, cl, contention=False).figures.breakdown
    assert got["full"]["compute"] == pytest.approx(got["none"]["compute"], rel=1e-6)
    assert got["full"]["recompute"] > 0
    comm = "ep_all_to_all" if "moe" in ref else "tp_comm"
    assert got["full"][comm] > got["none"][comm]


def test_the_closed_form_prices_links_shared_by_zero_and_hidden_all_to_alls():
    """ZeRO-3's gathers and the hidden all-to-alls both cross nodes: one NIC carries both in each
    pass, so the pass lasts at least their sum, not the larger of them. The closed form (what the
    search ranks by) then stays near the simulation that shares the links (25% under before)."""
    from smplan.planner.cost_model import CostModel, mesh_key

    prof = profile_model("examples/moe.py:mixtral_8x7b", args={"layers": 4, "experts": 16}, seq_len=1024)
    cl = load_cluster("h100x8", nodes=4, overrides={"inter_node.bandwidth_gbps": 12.5})
    plan = _plan("dp=32,ep=16,mbs=4,gbs=1024,zero=3", prof, 4)
    block = CostModel(prof, cl).pass_of(prof.blocks[0], mesh_key(plan))
    assert block.ep_hidden_forward_s > 0 and block.zero_forward_s > block.without_zero.forward_s  # link-bound
    # the all-to-alls on the links, hidden and exposed
    assert block.forward_s == pytest.approx(block.zero_forward_s + block.ep_hidden_forward_s + block.ep_forward_s)
    assert block.backward_s == pytest.approx(block.zero_backward_s + block.ep_hidden_backward_s + block.ep_backward_s)
    closed = estimate_from_costs(plan_costs(plan, prof, cl)).step_time_s
    shared = simulate_plan(plan, prof, cl, contention=True).figures.step_time_s
    assert closed <= shared < 1.1 * closed
    assert simulate_plan(plan, prof, cl, contention=False).figures.step_time_s == pytest.approx(closed, rel=1e-6)


@pytest.mark.parametrize("overlap", [0.0, 1.0])
def test_link_shared_passes_stay_exact_and_recompute_never_pays(overlap):
    """ep, cp and ZeRO-3 all on the NIC, passes both link- and host-bound (a review's case): full
    recompute never comes out cheaper than none (its exposed all-to-alls once made its extra time
    negative), the closed form equals the simulation without contention at pp=1, and more
    all-to-all overlap never makes the closed form slower."""
    from smplan.planner.cost_model import CostModel, mesh_key

    prof = profile_model("examples/moe.py:mixtral_8x7b", args={"layers": 4, "experts": 16}, seq_len=1024)
    cl = load_cluster("h100x8", nodes=4, overrides={"inter_node.bandwidth_gbps": 50, "efficiency.ep_a2a_overlap": overlap})
    step = {}
    for rc in ("none", "full"):
        plan = _plan(f"dp=16,cp=2,ep=16,mbs=2,gbs=64,zero=3,recompute={rc}", prof, 4)
        block = CostModel(prof, cl).pass_of(prof.blocks[0], mesh_key(plan))
        assert block.full_extra_s >= 0 and block.ep_full_exposed_s >= 0
        step[rc] = estimate_from_costs(plan_costs(plan, prof, cl)).step_time_s
        off = simulate_plan(plan, prof, cl, contention=False).figures.step_time_s
        assert off == pytest.approx(step[rc], rel=1e-6), rc
    assert step["full"] > step["none"]


@pytest.mark.parametrize("rc", ["none", "full"])
@pytest.mark.parametrize("host", [None, 0.0])
def test_more_all_to_all_overlap_never_slows_the_closed_form(rc, host):
    """On links ZeRO-3 shares (a second review's case): under full recompute Megatron-Core refuses
    the overlap, so the setting must not move the block at all; without recompute it may only help."""
    prof = profile_model("examples/moe.py:mixtral_8x7b", args={"layers": 4, "experts": 16}, seq_len=1024)
    plan = _plan(f"dp=16,tp=2,ep=16,mbs=1,gbs=128,zero=3,recompute={rc}", prof, 4)
    steps = []
    for overlap in (0.0, 0.5, 1.0):
        over = {"inter_node.bandwidth_gbps": 50, "efficiency.ep_a2a_overlap": overlap}
        if host is not None:
            over |= {"efficiency.host_overhead_us_per_layer": host, "efficiency.host_overhead_us_per_moe_layer": host}
        steps.append(estimate_from_costs(plan_costs(plan, prof, load_cluster("h100x8", nodes=4, overrides=over))).step_time_s)
    assert steps[1] <= steps[0] * (1 + 1e-9) and steps[2] <= steps[1] * (1 + 1e-9), steps


def test_cp_collectives_share_the_links_with_zero():
    """A CP group across nodes puts its K/V collectives on the NIC ZeRO-3 gathers on: a link-bound
    pass lasts at least both (the CP half of pass_model._link_share)."""
    from smplan.planner.cost_model import CostModel, mesh_key

    prof = profile_model("examples/gpt.py:llama3_8b", args={"layers": 2}, seq_len=8192)
    cl = load_cluster("h100x8", nodes=4, overrides={"inter_node.bandwidth_gbps": 5})
    plan = _plan("dp=2,cp=16,mbs=1,gbs=2,zero=3", prof, 4)
    block = CostModel(prof, cl).pass_of(prof.blocks[0], mesh_key(plan))
    cp_forward = block.cp_forward_s + block.cp_hidden_forward_s
    assert cp_forward > 0 and block.zero_forward_s > block.without_zero.forward_s  # link-bound
    assert block.forward_s == pytest.approx(block.zero_forward_s + cp_forward)
