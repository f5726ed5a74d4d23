import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from smplan.planner.costs import PlanCosts, StageCosts
from smplan.simulator import ScheduleError, SimulationError, device_orders, simulate_step
from smplan.simulator.gantt import write_gantt
from smplan.simulator.trace import trace_events, write_trace

from .helpers import cluster, layout, uniform_costs

CASES = [(p, m) for p in (1, 2, 4, 8, 16) for m in (1, 2, 3, 8, 32) if m >= 1]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p,m", CASES)
def test_uniform_pipeline_equals_closed_form(schedule, p, m):
    tf, tb = 0.7, 1.9
    r = simulate_step(uniform_costs(schedule, p, m, tf=tf, tb=tb), layout(p), cluster(), contention=False)
    expected = (m + p - 1) * (tf + tb)
    assert r.step_time_s == pytest.approx(expected, rel=1e-6)
    assert r.figures.bubble_fraction == pytest.approx((p - 1) * (tf + tb) / expected, rel=1e-6)


@pytest.mark.parametrize("p,m,v", [(2, 2, 2), (2, 8, 2), (4, 8, 2), (4, 12, 3), (8, 16, 2), (4, 4, 4), (8, 64, 4)])
def test_interleaved_equals_narayanan(p, m, v):
    # Narayanan et al. 2021, section 2.2.2: bubble (p-1)/v * (t_f + t_b), t_f, t_b per full stage.
    tf, tb = 1.3, 2.6
    r = simulate_step(uniform_costs("interleaved", p, m, v, tf=tf, tb=tb), layout(p), cluster(), contention=False)
    assert r.step_time_s == pytest.approx(m * (tf + tb) + (p - 1) / v * (tf + tb), rel=1e-6)


def test_equals_planner_closed_form_where_it_is_exact():
    pytest.importorskip("smplan.planner.cost_model")
    from smplan.planner.closed_form import estimate_from_costs

    for kw in ({}, {"dp_s": 0.5}, {"dp_s": 5.0}, {"dp_s": 1.0, "overlap": False}, {"opt_s": 0.1}, {"recompute_s": 0.5}):
        for sched in ("1f1b", "gpipe"):
            c = uniform_costs(sched, 4, 8, **kw)
            r = simulate_step(c, layout(4), cluster(), contention=False)
            assert r.step_time_s == pytest.approx(estimate_from_costs(c).step_time_s, rel=1e-9), (sched, kw)
    c = uniform_costs("gpipe", 4, 8, send_s=0.1)
    assert simulate_step(c, layout(4), cluster(), contention=False).step_time_s == pytest.approx(
        estimate_from_costs(c).step_time_s, rel=1e-9)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    schedule=st.sampled_from(["1f1b", "gpipe", "interleaved"]),
    p=st.integers(1, 5),
    v=st.integers(2, 4),
    k=st.integers(1, 4),
    data=st.data(),
)
def test_the_closed_form_replays_every_schedule_as_the_simulation_does(schedule, p, v, k, data):
    """Uneven stages, sends, an optimizer: the closed form (closed_form.compute_end_s, the task graph
    replayed) equals the step simulated with contention off. The textbook formulas it replaced
    (AMP's critical path, the interleaved bubble) hold only for identical stages."""
    from smplan.planner.closed_form import estimate_from_costs

    v = v if schedule == "interleaved" and p >= 2 else 1
    m = p * k if v > 1 else data.draw(st.integers(1, 12))
    chunks = p * v
    stages = tuple(
        StageCosts(forward_s=data.draw(st.floats(0.01, 1.0)), backward_s=data.draw(st.floats(0.01, 2.0)),
                   send_s=data.draw(st.sampled_from([0.0, 0.02, 0.3])) if c < chunks - 1 else 0.0,
                   optimizer_s=data.draw(st.sampled_from([0.0, 0.4])))
        for c in range(chunks)
    )
    costs = PlanCosts(stages=stages, num_microbatches=m, pp=p, virtual_stages=v, schedule=schedule,
                      tokens_per_step=1, samples_per_step=1)
    sim = simulate_step(costs, layout(p), cluster(), contention=False)
    assert estimate_from_costs(costs).step_time_s == pytest.approx(sim.step_time_s, rel=1e-9)


@pytest.mark.parametrize("schedule,p,v", [("1f1b", 4, 1), ("gpipe", 3, 1), ("interleaved", 4, 3), ("interleaved", 2, 2)])
def test_a_long_schedule_is_replayed_eight_rounds_and_extrapolated(schedule, p, v):
    """Past closed_form.REPLAYED_ROUNDS rounds every device's end moves by one round's increment a
    round; the extrapolation equals replaying all of them (uneven stages, sends)."""
    from smplan.planner import closed_form

    stages = tuple(StageCosts(forward_s=0.3 + 0.17 * (c % 3), backward_s=0.5 + 0.41 * (c % 4),
                              send_s=0.05 if c < p * v - 1 else 0.0) for c in range(p * v))
    m = (closed_form.REPLAYED_ROUNDS + 13) * p
    costs = PlanCosts(stages=stages, num_microbatches=m, pp=p, virtual_stages=v, schedule=schedule)
    assert closed_form.compute_end_s(costs) == pytest.approx(closed_form._replay(costs, m), rel=1e-12)
    sim = simulate_step(costs, layout(p), cluster(), contention=False)
    assert closed_form.pipeline_time_s(costs) == pytest.approx(sim.step_time_s, rel=1e-12)


def test_dp_overlap_exposes_only_the_excess():
    p, m, tf, tb = 4, 8, 1.0, 2.0
    base = (m + p - 1) * (tf + tb)
    hidden = simulate_step(uniform_costs("1f1b", p, m, dp_s=1.5), layout(p), cluster(), contention=False)
    assert hidden.step_time_s == pytest.approx(base)
    excess = simulate_step(uniform_costs("1f1b", p, m, dp_s=3.5), layout(p), cluster(), contention=False)
    assert excess.step_time_s == pytest.approx(base + 1.5)
    assert excess.figures.breakdown["dp_comm_exposed"] == pytest.approx(1.5)
    serial = simulate_step(uniform_costs("1f1b", p, m, dp_s=1.5, overlap=False, opt_s=0.2), layout(p), cluster(),
                           contention=False)
    assert serial.step_time_s == pytest.approx(base + 1.7)


def test_breakdown_sums_to_step_and_figures():
    c = uniform_costs("1f1b", 4, 8, send_s=0.05, crosses=True, dp_s=4.0, opt_s=0.1, recompute_s=0.5)
    r = simulate_step(c, layout(4, dp=8, tp=8), cluster(32))
    f = r.figures
    assert sum(f.breakdown.values()) == pytest.approx(f.step_time_s)
    assert f.tokens_per_s == pytest.approx(c.tokens_per_step / f.step_time_s)
    assert f.mfu == pytest.approx(f.model_tflops_per_gpu / 312.0)
    assert f.peak_memory_gib > 0 and f.memory_breakdown_gib["total"] == pytest.approx(f.peak_memory_gib)
    for row in r.stage_utilisation:
        assert 0 <= row["compute"] <= 1 and 0 <= row["idle"] <= 1
    assert r.to_dict()["step_time_s"] == f.step_time_s


def test_every_task_runs_once_in_dependency_order():
    for sched, p, m, v in (("1f1b", 4, 7, 1), ("gpipe", 3, 5, 1), ("interleaved", 4, 8, 3)):
        orders = device_orders(sched, p, m, v)
        tasks = [t for o in orders for t in o]
        assert len(tasks) == len(set(tasks)) == 2 * m * p * v
        r = simulate_step(uniform_costs(sched, p, m, v, send_s=0.01), layout(p), cluster(), contention=False)
        start = {(e.name, e.chunk, e.mb): e.start for e in r.events if e.lane == "compute"}
        end = {(e.name, e.chunk, e.mb): e.end for e in r.events if e.lane == "compute"}
        for (kind, c, j), t0 in start.items():
            if kind == "F" and c > 0:
                assert t0 >= end[("F", c - 1, j)]
            if kind == "B" and c < p * v - 1:
                assert t0 >= end[("B", c + 1, j)]


def test_bad_inputs_raise_value_errors():
    with pytest.raises(ScheduleError):
        device_orders("interleaved", 4, 6, 2)
    with pytest.raises(ScheduleError):
        device_orders("zigzag", 4, 8)
    with pytest.raises(SimulationError):
        simulate_step(uniform_costs("1f1b", 4, 8), layout(2), cluster())
    with pytest.raises(SimulationError):
        simulate_step(uniform_costs("1f1b", 4, 8), layout(4), cluster(), dp_pattern="gossip")


def test_a_large_step_runs_every_pass():
    # its wall time (< 1 s) is benchmarks/sim_speed.py's: timed unit tests fail on a busy machine
    c = uniform_costs("1f1b", 16, 96, tf=0.05, tb=0.1, send_s=0.002, crosses=True, dp_s=0.5)
    result = simulate_step(c, layout(16, dp=8, tp=8), cluster(128))
    assert result.step_time_s >= 96 * (0.05 + 0.1)  # a stage's 96 forward and backward passes at least


# -- contention ---------------------------------------------------------------------


def test_contention_slows_concurrent_cross_node_traffic():
    # tp8 per node, DP across nodes: DP buckets and pipeline sends share each GPU's NIC.
    c = uniform_costs("1f1b", 4, 8, tf=0.1, tb=0.2, send_s=0.05, crosses=True, dp_s=0.6)
    off = simulate_step(c, layout(4, dp=4, tp=8), cluster(16), contention=False)
    on = simulate_step(c, layout(4, dp=4, tp=8), cluster(16), contention=True)
    assert on.step_time_s > off.step_time_s
    assert any(row["shared_s"] > 0 for row in on.links)


def test_no_overlap_no_contention_effect():
    c = uniform_costs("gpipe", 4, 8, send_s=0.05, crosses=True)
    off = simulate_step(c, layout(4), cluster(), contention=False)
    on = simulate_step(c, layout(4), cluster(), contention=True)
    assert on.step_time_s == pytest.approx(off.step_time_s, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    schedule=st.sampled_from(["1f1b", "gpipe", "interleaved"]),
    p=st.integers(1, 5),
    k=st.integers(1, 3),
    data=st.data(),
)
def test_contention_never_faster(schedule, p, k, data):
    v = 2 if schedule == "interleaved" and p >= 2 else 1
    schedule = schedule if v == 2 else ("1f1b" if schedule == "interleaved" else schedule)
    m = p * k
    chunks = p * v
    floats = st.floats(0.01, 1.0)
    stages = tuple(
        StageCosts(
            forward_s=data.draw(floats),
            backward_s=data.draw(floats),
            send_s=data.draw(st.floats(0.0, 0.5)) if c < chunks - 1 else 0.0,
            send_crosses_node=data.draw(st.booleans()),
            dp_comm_bytes=1e8,
            dp_comm_s=data.draw(st.floats(0.0, 2.0)),
            dp_overlappable=data.draw(st.booleans()),
        )
        for c in range(chunks)
    )
    costs = PlanCosts(stages=stages, num_microbatches=m, pp=p, virtual_stages=v, schedule=schedule)
    lay = layout(p, dp=2, tp=8)
    off = simulate_step(costs, lay, cluster(2 * p), contention=False)
    on = simulate_step(costs, lay, cluster(2 * p), contention=True)
    assert on.step_time_s >= off.step_time_s * (1 - 1e-9)


def test_parameter_server_what_if():
    pytest.importorskip("smplan.hwprofiles.perf")
    c = uniform_costs("1f1b", 2, 4, dp_s=0.2, overlap=False)
    lay = layout(2, dp=64, tp=1)
    few = simulate_step(c, lay, cluster(16), dp_pattern="ps", ps_servers=1)
    many = simulate_step(c, lay, cluster(16), dp_pattern="ps", ps_servers=16)
    assert few.step_time_s > many.step_time_s
    assert few.dp_pattern == "ps"


# -- trace and Gantt ----------------------------------------------------------------


def test_trace_is_valid_trace_event_json(tmp_path):
    r = simulate_step(uniform_costs("interleaved", 4, 8, 2, send_s=0.01, dp_s=0.5, opt_s=0.1, recompute_s=0.3),
                      layout(4), cluster())
    path = write_trace(tmp_path / "step.json", r.events, [0, 0, 0, 0])
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    assert events
    for e in events:
        assert isinstance(e["name"], str) and e["ph"] in ("X", "M")
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert "dur" in e and e["dur"] >= 0
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(r.events)
    assert max(e["ts"] + e["dur"] for e in complete) == pytest.approx(r.step_time_s * 1e6)
    assert {e["name"] for e in events if e["ph"] == "M"} >= {"process_name", "thread_name"}
    assert trace_events([]) == []


def test_gantt_png_is_written(tmp_path):
    r = simulate_step(uniform_costs("1f1b", 4, 8, send_s=0.05, dp_s=1.0, recompute_s=0.4), layout(4), cluster())
    path = write_gantt(tmp_path / "step.png", r.events, r.step_time_s)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 5000


def test_too_many_micro_batches_are_refused_not_simulated():
    # Found while fuzzing plan files: gbs=2**40 ran for hours and took GBs (one event per pass).
    from smplan.simulator.api import MAX_SIMULATED_PASSES

    assert simulate_step(uniform_costs(pp=2, m=8), layout(2), cluster()).step_time_s > 0
    with pytest.raises(SimulationError, match=r"2,097,152 passes; the step simulation takes at most 1,048,576"):
        simulate_step(uniform_costs(pp=2, m=MAX_SIMULATED_PASSES), layout(2), cluster())


def test_zero2_step_gather_waits_for_the_backwards_own_reduce_scatters():
    # ZeRO-2: the last backward (2 s) reduce-scatters 1.5 s of gradients on the DP links, so the
    # step's 1 s parameter all-gather has only 0.5 s of that pass left to hide in: 0.5 s exposed,
    # in the closed form and in the simulation with contention off alike.
    import dataclasses

    from smplan.planner.closed_form import estimate_from_costs
    from smplan.planner.costs import ZeroUnit

    base = uniform_costs("1f1b", 1, 4, tf=1.0, tb=2.0, dp_s=1.0)
    unit = ZeroUnit(forward_s=0.25, forward_comm_s=0.0, backward_s=0.5, backward_comm_s=0.375)
    c = dataclasses.replace(base, stages=tuple(dataclasses.replace(s, zero_units=(unit,) * 4) for s in base.stages))
    assert c.stages[0].zero_reduce_s == pytest.approx(1.5)
    closed = estimate_from_costs(c)
    assert closed.breakdown["dp_comm_exposed"] == pytest.approx(0.5)
    sim = simulate_step(c, layout(1), cluster(), contention=False)
    assert sim.step_time_s == pytest.approx(closed.step_time_s, rel=1e-9)
    assert sim.step_time_s == pytest.approx(4 * 3.0 + 0.5)
