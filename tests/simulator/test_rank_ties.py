"""Among plans the objective cannot tell apart, the one that recomputes less, then the one with
more memory to spare, ranks first (a host-bound step gives several layouts the same time)."""

from __future__ import annotations

from smplan.planner import Figures, Plan, even_stages
from smplan.simulator.rank import prefer_simpler_among_ties


def _plan(step_s: float, recompute: str, memory_gib: float, dp: int = 8) -> Plan:
    figures = Figures(step_time_s=step_s, tokens_per_s=1.0, samples_per_s=1.0, model_tflops_per_gpu=1.0,
                      hardware_tflops_per_gpu=1.0, mfu=0.5, peak_memory_gib=memory_gib, bubble_fraction=0.0)
    return Plan(model="m.py", hw="a100x8", nodes=1, dp=dp, micro_batch=1, global_batch=16,
                stages=even_stages(4, 1, recompute), predicted=figures)


def test_ties_prefer_no_recompute_then_headroom_and_the_faster_plan_still_wins():
    tight = _plan(0.45, "full", 79.7)
    roomy = _plan(0.45001, "none", 60.0)  # within the tie share: printed alike
    fuller = _plan(0.45, "none", 72.0)
    faster = _plan(0.44, "full", 79.9)
    ranked = prefer_simpler_among_ties([tight, roomy, fuller, faster], lambda p: p.predicted.step_time_s)
    assert ranked == [faster, roomy, fuller, tight]
