"""plan --explain: a runner-up says where its time went, or that it ties with the best."""

from __future__ import annotations

from smplan.planner.explain import explain
from smplan.planner.plan import Figures, Plan


def _plan(dp: int, step_s: float, breakdown: dict, nodes: int = 1) -> Plan:
    figures = Figures(step_time_s=step_s, tokens_per_s=1.0, samples_per_s=1.0, model_tflops_per_gpu=1.0,
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


def test_an_oom_bound_counts_whole_blocks_per_device():
    # two devices with 10 bytes of room, 6 bytes per block: the 3 blocks fit on average (20 >= 18)
    # but no split in whole blocks does: one device must hold 2, which takes 2 more bytes each
    from smplan.planner.bounds import _partition_shortfall, _Room

    rooms = [_Room(ratio=float("inf"), free=10 / 6, full=10 / 6, slope=6.0, room=10.0, saved=0.0)] * 2
    assert abs(_partition_shortfall(rooms, 3) - 2.0) < 1e-6
    assert _partition_shortfall(rooms, 2) == 0.0


def test_an_oom_runner_up_says_its_figure_is_a_bound():
    class Shape:
        dp, tp, pp, mbs = 8, 1, 2, 1

        def describe(self):
            return "dp=8 tp=1 pp=2"

    best = _plan(8, 1.0, {"compute": 1.0})
    lines = explain([best], rejected=[(Shape(), "oom", 3 * 2**20), (Shape(), "oom", 0.0)])
    assert lines == ["dp=8 tp=1 pp=2: out of memory by at least 3 MiB per GPU"]
