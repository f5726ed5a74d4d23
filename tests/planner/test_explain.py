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
