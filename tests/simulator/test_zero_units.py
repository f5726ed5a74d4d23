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
                       zero_units=(unit,) * units, zero_overlapped=overlapped, zero_crosses_node=True)
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
