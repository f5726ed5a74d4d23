"""ZeRO-3 / FSDP passes played unit by unit on the DP links (simulator.step._sharded_pass)."""

import pytest
from smplan.hwprofiles import load_cluster
from smplan.planner import estimate_from_costs, plan_costs, profile_model
from smplan.planner.costs import PlanCosts, StageCosts, ZeroUnit
from smplan.planner.plan import plan_from_inline
from smplan.simulator.api import simulate_plan, simulate_step

from .helpers import cluster, layout


def _costs(compute_f, gather, compute_b, reduce, units=4, overlapped=True):
    """One stage, one micro-batch, `units` equal units; forward_s / backward_s as the cost model
    sets them (max of compute and collectives when overlapped, else their sum)."""
    unit = ZeroUnit(compute_f, gather, compute_b, gather + reduce)
    join = max if overlapped else (lambda a, b: a + b)
    stage = StageCosts(forward_s=units * join(compute_f, gather), backward_s=units * join(compute_b, gather + reduce),
                       zero_units=(unit,) * units, dp_overlappable=overlapped, zero_crosses_node=True)
    return PlanCosts(stages=(stage,), num_microbatches=1, pp=1, tokens_per_step=1, samples_per_step=1)


def _names(result, name):
    return [e for e in result.events if e.name == name]


def test_first_gather_and_last_reduce_scatter_stick_out_of_a_compute_bound_pass():
    """Compute-bound (1 s per unit vs 0.5 s gathers): forward = first gather + 4 computes; backward
    = first gather + 4 computes + last reduce-scatter (the prefetch and the reduce-scatters share
    the NIC but still hide under 2 s of compute)."""
    costs = _costs(1.0, 0.5, 2.0, 0.5)
    closed = estimate_from_costs(costs).step_time_s
    off = simulate_step(costs, layout(1, dp=16), cluster(), contention=False)
    on = simulate_step(costs, layout(1, dp=16), cluster(), contention=True)
    assert off.step_time_s == pytest.approx(closed) == pytest.approx(4.0 + 8.0)
    assert on.step_time_s == pytest.approx(0.5 + 4.0 + 0.5 + 8.0 + 0.5)
    assert len(_names(on, "zero-gather")) == 8 and len(_names(on, "zero-reduce")) == 4
    parts = on.figures.breakdown
    assert parts["dp_comm_exposed"] == pytest.approx(1.5) and sum(parts.values()) == pytest.approx(on.step_time_s)


def test_a_network_bound_forward_runs_at_the_gathers_pace():
    """0.5 s gathers back to back under 0.25 s computes: four gathers, then the last compute."""
    on = simulate_step(_costs(0.25, 0.5, 0.5, 0.0), layout(1, dp=16), cluster(), contention=True)
    forward = [e for e in on.events if e.name == "F"][0]
    assert forward.end - forward.start == pytest.approx(4 * 0.5 + 0.25)


def test_without_overlap_every_collective_waits_and_the_closed_form_holds():
    costs = _costs(1.0, 0.5, 2.0, 0.5, overlapped=False)
    on = simulate_step(costs, layout(1, dp=16), cluster(), contention=True)
    assert on.step_time_s == pytest.approx(estimate_from_costs(costs).step_time_s) == pytest.approx(4 * 1.5 + 4 * 3.0)


def test_fsdp_plan_units_are_its_blocks_embedding_and_head():
    """The cost model hands the simulator one unit per block plus the embedding and the head, each
    with the passes' time without its collectives; the simulated step is never faster than the
    closed form, and the timeline shows the gathers."""
    prof = profile_model("examples/gpt.py:llama3_8b", args={"layers": 4}, seq_len=2048)
    cl = load_cluster("h100x8", nodes=2)
    plan = plan_from_inline("dp=16,zero=3,mbs=1,gbs=32", model=prof.model, hw="h100x8", nodes=2, gpus_per_node=8,
                            num_blocks=prof.num_blocks)
    stage = plan_costs(plan, prof, cl).stages[0]
    assert len(stage.zero_units) == 4 + len(prof.pre) + len(prof.post)
    blocks = stage.zero_units[len(prof.pre):len(prof.pre) + 4]
    assert len(set(blocks)) == 1 and blocks[0].forward_comm_s > 0 and blocks[0].backward_comm_s > blocks[0].forward_comm_s
    sim = simulate_plan(plan, prof, cl, contention=True)
    assert sim.step_time_s >= estimate_from_costs(plan_costs(plan, prof, cl)).step_time_s * (1 - 1e-9)
    assert _names(sim, "zero-gather") and _names(sim, "zero-reduce")
    zero1 = plan_from_inline("dp=16,zero=1,mbs=1,gbs=32", model=prof.model, hw="h100x8", nodes=2, gpus_per_node=8,
                             num_blocks=prof.num_blocks)
    assert plan_costs(zero1, prof, cl).stages[0].zero_units == ()


def test_the_per_layer_collectives_are_named_in_the_trace_and_the_gantt(tmp_path):
    from smplan.simulator.gantt import LABELS
    from smplan.simulator.trace import trace_events

    on = simulate_step(_costs(1.0, 0.5, 2.0, 0.5), layout(1, dp=16), cluster(), contention=True)
    names = {e["name"] for e in trace_events(on.events) if e.get("ph") == "X"}
    assert {"zero/fsdp layer all-gather mb0", "zero/fsdp layer reduce-scatter mb0"} <= names
    assert {"zero-gather", "zero-reduce"} <= set(LABELS)


def test_the_pass_waits_for_every_reduce_scatter_not_the_last_issued():
    """A big unit's reduce-scatter issued first, a small one's after it: sharing the link, the small
    one lands first; the pass still ends when the big one has landed."""
    big = ZeroUnit(1.0, 0.0, 0.1, 4.0)  # ZeRO-2: no gathers, a 4 s reduce-scatter
    small = ZeroUnit(1.0, 0.0, 0.1, 0.1)
    stage = StageCosts(forward_s=2.0, backward_s=4.0, zero_units=(small, big), zero_crosses_node=True)
    costs = PlanCosts(stages=(stage,), num_microbatches=1, pp=1, tokens_per_step=1, samples_per_step=1)
    on = simulate_step(costs, layout(1, dp=16), cluster(), contention=True)
    backward = [e for e in on.events if e.name == "B"][0]
    reduces = _names(on, "zero-reduce")
    assert len(reduces) == 2 and backward.end == pytest.approx(max(e.end for e in reduces))
    # backward runs big (0.1 s), then small (0.1 s) while big's reduce-scatter has the link alone,
    # then both share it: 0.1 + 0.1 + 0.2 (0.1 s each, shared) + 3.8 (big's rest alone) = 4.2 s
    assert backward.end - backward.start == pytest.approx(4.2)


def test_zero2_reduce_scatters_without_gathers():
    on = simulate_step(_costs(1.0, 0.0, 2.0, 0.5), layout(1, dp=16), cluster(), contention=True)
    assert not _names(on, "zero-gather") and len(_names(on, "zero-reduce")) == 4
    assert on.step_time_s == pytest.approx(4.0 + 8.0 + 0.5)  # the last reduce-scatter sticks out


def _fsdp(text, stack=None, nodes=2, **links):
    prof = profile_model("examples/gpt.py:llama3_8b", args={"layers": 4}, seq_len=2048)
    cl = load_cluster("h100x8", nodes=nodes, overrides=links or None, stack=stack)
    plan = plan_from_inline(text, model=prof.model, hw="h100x8", nodes=nodes, gpus_per_node=8,
                            num_blocks=prof.num_blocks)
    return plan, prof, cl


def test_without_overlap_a_real_plan_adds_up_to_the_closed_form_even_where_the_host_bounds_a_part():
    plan, prof, cl = _fsdp("dp=16,zero=3,mbs=1,gbs=32,overlap_dp=0")
    closed = estimate_from_costs(plan_costs(plan, prof, cl)).step_time_s
    assert simulate_plan(plan, prof, cl, contention=True).step_time_s == pytest.approx(closed, rel=1e-9)


def test_network_bound_fsdp_with_full_recompute_reports_its_recompute_and_dp_link_use():
    plan, prof, cl = _fsdp("dp=16,zero=3,mbs=1,gbs=32,recompute=full", **{"inter_node.bandwidth_gbps": 2.0})
    sim = simulate_plan(plan, prof, cl, contention=True)
    assert sim.figures.breakdown["recompute"] > 0  # hidden in the closed form, run in the timeline
    assert estimate_from_costs(plan_costs(plan, prof, cl)).breakdown["recompute"] == pytest.approx(0.0, abs=1e-9)
    assert sim.stage_utilisation[0]["dp_comm"] > 0.5  # the per-unit collectives keep the DP link busy


def test_bf16_gradient_compression_shrinks_an_fp32_stacks_reduce_scatters():
    """torchtitan reduces in fp32; grad_compress=bf16 (FSDP2's reduce_dtype) halves its reduce-scatters."""
    slow = {"inter_node.bandwidth_gbps": 2.0}
    plain, prof, cl = _fsdp("dp=16,zero=3,mbs=1,gbs=32", stack="torchtitan", **slow)
    packed, _, _ = _fsdp("dp=16,zero=3,mbs=1,gbs=32,grad_compress=bf16", stack="torchtitan", **slow)
    a, b = plan_costs(plain, prof, cl).stages[0], plan_costs(packed, prof, cl).stages[0]
    assert b.backward_s < a.backward_s and b.forward_s == pytest.approx(a.forward_s)
    unit_a, unit_b = a.zero_units[1], b.zero_units[1]
    reduce_a = unit_a.backward_comm_s - unit_a.forward_comm_s
    assert unit_b.backward_comm_s - unit_b.forward_comm_s == pytest.approx(reduce_a / 2, rel=0.01)


def test_the_simulated_breakdown_reports_the_closed_forms_wait_for_the_host():
    plan, prof, cl = _fsdp("dp=16,zero=3,mbs=1,gbs=32", **{"efficiency.host_overhead_us_per_layer": 20000.0})
    closed = estimate_from_costs(plan_costs(plan, prof, cl))
    sim = simulate_plan(plan, prof, cl, contention=False)
    assert closed.breakdown["host_wait"] > 0
    assert sim.figures.breakdown["host_wait"] == pytest.approx(closed.breakdown["host_wait"], rel=1e-9)
