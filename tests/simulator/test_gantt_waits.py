"""What a pass's GPU waits for (step.PassWaits), and where the Gantt chart and the trace draw it
and each kind of transfer (step.TRACKS)."""

from collections import defaultdict

import pytest
from smplan.planner.costs import PlanCosts, StageCosts, ZeroUnit
from smplan.simulator.api import simulate_step
from smplan.simulator.gantt import MIN_TRANSFER_PX, gantt_bars, write_gantt
from smplan.simulator.trace import trace_events

from .helpers import cluster, layout, uniform_costs


def _zero3(compute_f, gather, compute_b, reduce, units=4):
    """One stage, one micro-batch of `units` ZeRO-3 units, priced as the cost model does (max)."""
    unit = ZeroUnit(compute_f, gather, compute_b, gather + reduce)
    stage = StageCosts(forward_s=units * max(compute_f, gather), backward_s=units * max(compute_b, gather + reduce),
                       zero_units=(unit,) * units, zero_crosses_node=True)
    return PlanCosts(stages=(stage,), num_microbatches=1, pp=1, tokens_per_step=1, samples_per_step=1)


def _seconds(result, *names):
    return sum(e.end - e.start for e in result.events if e.name in names)


def _shares_add_up(row):
    assert row["compute"] + row["comm_wait"] + row["optimizer"] + row["idle"] == pytest.approx(1.0)


def test_a_zero3_pass_waiting_for_its_gathers_is_not_compute():
    """0.5 s gathers under 0.25 s forward units: the forward waits 0.5 s for the first gather and
    0.25 s before each of the other three; the backward (1 s units) waits for its first gather
    only. The GPU computes 4 x 0.25 + 4 x 1 = 5 s of the 6.75 s step, which the cost model's
    max(compute, gather) per unit priced as 6 s of compute."""
    on = simulate_step(_zero3(0.25, 0.5, 1.0, 0.0), layout(1, dp=16), cluster(), contention=True)
    assert on.step_time_s == pytest.approx(2.25 + 4.5)
    parts, row = on.figures.breakdown, on.stage_utilisation[0]
    assert parts["compute"] == pytest.approx(5.0) and parts["dp_comm_exposed"] == pytest.approx(1.75)
    assert _seconds(on, "zero-wait") == pytest.approx(1.75)
    assert row["comm_wait"] * on.step_time_s == pytest.approx(1.75)
    assert row["compute"] * on.step_time_s == pytest.approx(5.0)
    _shares_add_up(row)


def test_exposed_all_to_alls_are_waits_in_the_table_the_trace_and_the_chart():
    """The expert all-to-alls a pass waits for (0.2 s forward, 0.3 s backward, two micro-batches)
    are the breakdown's ep_all_to_all, the table's comm wait and wait events over the pass; the
    compute share is the rest of the passes."""
    stage = StageCosts(forward_s=1.0, backward_s=2.0, ep_comm_forward_s=0.2, ep_comm_backward_s=0.3,
                       ep_crosses_node=True)
    costs = PlanCosts(stages=(stage,), num_microbatches=2, pp=1, tokens_per_step=1, samples_per_step=1,
                      expert_or_context_parallel=True)
    for contention in (True, False):
        r = simulate_step(costs, layout(1, dp=16), cluster(), contention=contention)
        row = r.stage_utilisation[0]
        assert r.figures.breakdown["ep_all_to_all"] == pytest.approx(1.0)
        assert row["comm_wait"] * r.step_time_s == pytest.approx(1.0)
        assert row["compute"] * r.step_time_s == pytest.approx(2 * 3.0 - 1.0)
        _shares_add_up(row)
        a2a = sorted((e.start, e.end) for e in r.events if e.name == "ep-a2a")
        assert a2a == sorted((e.start, e.end) for e in r.events if e.name == "ep-wait") and len(a2a) == 4
        bars = gantt_bars(r.events, r.step_time_s / 1000)
        passes = {(y, h) for y, h, _, _ in bars["F"] + bars["B"]}
        assert {(y, h) for y, h, _, _ in bars["ep-wait"]} == passes  # drawn over the pass


def test_zero3_gathers_and_reduce_scatters_have_lanes_of_their_own():
    """A ZeRO-3 backward all-gathers and reduce-scatters at once: each kind in its own lane of the
    chart, below the passes, and on its own thread of the trace, whose slices must nest."""
    on = simulate_step(_zero3(1.0, 0.5, 2.0, 0.5), layout(1, dp=16), cluster(), contention=True)
    bars = gantt_bars(on.events, on.step_time_s / 1000)

    def lane(name):
        (box,) = {(y, y + h) for y, h, _, _ in bars[name]}
        return box

    compute, gathers, reduces = lane("F"), lane("zero-gather"), lane("zero-reduce")
    backward = [e for e in on.events if e.name == "B"][0]
    assert any(e.start < backward.end and e.end > backward.start for e in on.events if e.name == "zero-gather")
    assert compute[1] <= gathers[0] and gathers[1] <= reduces[0] and reduces[1] <= 1.0
    slices = defaultdict(list)
    for e in trace_events(on.events):
        if e["ph"] == "X":
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in slices.values():
        spans.sort()
        for (_, end), (start, later_end) in zip(spans, spans[1:], strict=False):
            assert start >= end - 1e-6 or later_end <= end + 1e-6  # after it, or inside it
    tids = {e["cat"]: e["tid"] for e in trace_events(on.events) if e["ph"] == "X"}
    assert len({tids["F"], tids["zero-wait"], tids["zero-gather"], tids["zero-reduce"]}) == 4


def test_short_sends_are_drawn_a_few_pixels_wide_and_passes_as_they_ran():
    """0.1 ms sends in a 33 s step are a three-hundredth of a pixel at 1000 pixels: drawn
    MIN_TRANSFER_PX wide; the passes keep their own width."""
    r = simulate_step(uniform_costs("1f1b", 4, 8, send_s=1e-4), layout(4), cluster())
    per_px = r.step_time_s / 1000
    bars = gantt_bars(r.events, per_px)
    for name in ("send-act", "send-grad"):
        assert len(bars[name]) == 3 * 8
        assert all(w == pytest.approx(MIN_TRANSFER_PX * per_px) for _, _, _, w in bars[name])
    assert sorted(w for _, _, _, w in bars["F"]) == pytest.approx([1.0] * 32)


def test_gantt_with_waits_and_every_lane_is_written(tmp_path):
    stage = StageCosts(forward_s=1.0, backward_s=2.0, ep_comm_forward_s=0.2, cp_comm_backward_s=0.3,
                       zero_units=(ZeroUnit(0.5, 0.6, 1.0, 1.2),) * 2, zero_crosses_node=True, dp_comm_s=0.5)
    costs = PlanCosts(stages=(stage,), num_microbatches=2, pp=1, tokens_per_step=1, samples_per_step=1)
    r = simulate_step(costs, layout(1, dp=16), cluster(), contention=True)
    assert {"zero-wait", "ep-wait", "cp-wait", "ep-a2a", "cp-comm", "zero-gather", "zero-reduce"} <= {
        e.name for e in r.events}
    path = write_gantt(tmp_path / "step.png", r.events, r.step_time_s)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
