"""plan --explain: a runner-up says where its time went, or that it ties with the best."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from smplan.planner.explain import explain
from smplan.planner.plan import Figures, Plan


def _plan(dp: int, step_s: float, breakdown: dict, nodes: int = 1) -> Plan:
    # a global batch of 16 sequences of 1024 tokens a step
    figures = Figures(step_time_s=step_s, tokens_per_s=16 * 1024 / step_s, samples_per_s=1.0, model_tflops_per_gpu=1.0,
                      hardware_tflops_per_gpu=1.0, mfu=0.5, peak_memory_gib=10.0, bubble_fraction=0.0,
                      breakdown=breakdown)
    return Plan(model="m.py", hw="a100x8", nodes=nodes, dp=dp, micro_batch=1, global_batch=16, predicted=figures)


def test_a_slower_runner_up_names_where_its_time_went_and_a_tie_says_so():
    best = _plan(8, 1.0, {"compute": 0.9, "dp_comm_exposed": 0.1})
    slower = _plan(4, 1.2, {"compute": 0.9, "dp_comm_exposed": 0.3})
    tie = _plan(8, 1.0001, {"compute": 0.9, "dp_comm_exposed": 0.1001})
    lines = explain([best, slower, tie])
    assert "+20.0% step time (1.200 s vs 1.000 s), mostly dp comm exposed (+0.200 s)" in lines[0]
    assert "ties with the best (1.000 s, 10.0 GiB vs 10.0 GiB): the cost model sees no difference" in lines[1]

    # as fast on twice the GPUs costs twice as much: not a tie
    wider = _plan(16, 1.0001, {"compute": 0.9, "dp_comm_exposed": 0.1001}, nodes=2)
    assert "ties" not in explain([best, wider])[0]


def test_under_the_cost_objective_a_runner_up_says_how_much_dearer_per_token_it_is():
    # faster on twice the GPUs: +50% step time blame would be wrong; it costs 1.2 x 2 / 2 ... per token
    best = _plan(8, 2.0, {"compute": 2.0})
    wider = _plan(16, 1.2, {"compute": 1.0, "pp_p2p": 0.2}, nodes=2)
    line = explain([best, wider], objective="cost")[0]
    assert "+20.0% cost per token (1.200 s on 16 GPUs vs 2.000 s on 8)" in line, line
    assert "step time" not in line and "mostly" not in line, line
    same = _plan(16, 1.0001, {"compute": 1.0}, nodes=2)
    assert "ties with the best on cost per token" in explain([best, same], objective="cost")[0]


def test_an_oom_bound_counts_whole_blocks_per_device():
    # two devices with 10 bytes of room, 6 bytes per block: the 3 blocks fit on average (20 >= 18)
    # but no split in whole blocks does: one device must hold 2, which takes 2 more bytes each
    from smplan.planner.bounds import _partition_shortfall, _Room

    rooms = [_Room(ratio=float("inf"), free=10 / 6, full=10 / 6, slope=6.0, room=10.0, saved=0.0)] * 2
    assert abs(_partition_shortfall(rooms, 3) - 2.0) < 1e-6
    assert _partition_shortfall(rooms, 2) == 0.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(-50, 100), st.floats(0.5, 20)), min_size=1, max_size=6), st.integers(1, 40))
def test_the_oom_shortfall_is_the_least_that_holds_every_block(devices, blocks):
    # its definition: with x more bytes each, the devices hold `blocks` whole blocks between them,
    # and with a little less they do not
    import math

    from smplan.planner.bounds import _partition_shortfall, _Room

    rooms = [_Room(ratio=math.inf, free=0.0, full=0.0, slope=b, room=r, saved=0.0) for r, b in devices]

    def held(x: float) -> int:
        return sum(math.floor((r + x) / b + 1e-9) for r, b in devices if r + x > 0)

    x = _partition_shortfall(rooms, blocks)
    assert x >= 0.0 and held(x) >= blocks
    if x > 0:
        assert held(x - 1e-6 * (1 + x)) < blocks


def test_an_oom_runner_up_says_its_figure_is_a_bound():
    class Shape:
        dp, tp, pp, mbs = 8, 1, 2, 1

        def describe(self):
            return "dp=8 tp=1 pp=2"

    best = _plan(8, 1.0, {"compute": 1.0})
    lines = explain([best], rejected=[(Shape(), "oom", 3 * 2**20), (Shape(), "oom", 0.0)])
    assert lines == ["dp=8 tp=1 pp=2: out of memory by at least 3 MiB per GPU"]
