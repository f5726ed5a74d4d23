"""Medians leave out the first step after every start of the workers (the run's, a resume's, a
restart's: allocations, gloo's connections), not only the run's step 1."""

from __future__ import annotations

import json

from smplan.executor.metrics import LAYOUT, WARM_UP, layout_tag, steady, summarize
from smplan.planner.plan import Plan

from smplan.cli.execute import _echo_summary


def _rows(times: dict[int, float], warm: set[int]) -> list[dict]:
    return [{"step": s, "loss": 1.0, "step_time_s": t, "tokens_per_s": 1 / t, "samples_per_s": 1 / t,
             "peak_memory_gib": 0.5, **({WARM_UP: True} if s in warm else {})} for s, t in times.items()]


def test_a_resumed_runs_medians_leave_out_the_first_step_after_the_resume(tmp_path, capsys):
    # steps 1-4, then a resume from step-4: step 5 warms up again as step 1 did
    rows = _rows({1: 9.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 9.0, 6: 2.0, 7: 2.0}, warm={1, 5})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = summarize(tmp_path, None, Plan(model="m.py", hw="local", nodes=1).to_dict(), "cpu")
    assert summary["measured"]["step_time_s"] == 1.0  # with step 5 in, 1.5
    assert summary["warm_up_steps"] == [1, 5]
    _echo_summary(summary, Plan(model="m.py", hw="local", nodes=1))
    assert "over the run's 7 steps (medians leave out steps 1, 5, which warm up)" in capsys.readouterr().out


def test_steady_keeps_every_step_when_all_warm_up():
    assert [r["step"] for r in steady(_rows({1: 1.0, 2: 1.0}, warm=set()))] == [2]  # a file without flags
    assert [r["step"] for r in steady(_rows({1: 1.0}, warm={1}))] == [1]
    assert [r["step"] for r in steady(_rows({5: 1.0}, warm={5}))] == [5]


def test_a_run_resumed_under_another_layout_measures_only_its_own_steps(tmp_path, capsys):
    """A review resumed a dp=2 run as tp=2 (--force-resume): the summary's 20 ms step was the dp=2
    steps' median, the tp=2 steps took 260-780 ms."""
    plan = Plan(model="m.py", hw="local", nodes=1, tp=2, micro_batch=4, global_batch=8)
    old = {LAYOUT: layout_tag(Plan(model="m.py", hw="local", nodes=1, dp=2, micro_batch=4, global_batch=8).to_dict(),
                              "fp32")}
    new = {LAYOUT: layout_tag(plan.to_dict(), "fp32")}
    assert old != new
    # a plan file's fp32 and an inline plan's bf16 both compute in fp32 on a CPU: the same layout
    assert layout_tag(plan.replace(dtype="fp32").to_dict(), "fp32") == new[LAYOUT]
    rows = _rows({1: 0.5, 2: 0.02, 3: 0.02, 4: 0.02, 5: 0.8, 6: 0.26, 7: 0.3}, warm={1, 5})
    rows = [{**r, **(old if r["step"] <= 4 else new), "peak_memory_gib": 9.0 if r["step"] <= 4 else 1.0} for r in rows]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = summarize(tmp_path, None, plan.to_dict(), "cpu")
    assert summary["measured"]["step_time_s"] == 0.28  # steps 6 and 7; over every step, 0.26
    assert summary["measured"]["peak_memory_gib"] == 1.0  # not the dp=2 steps' 9.0
    assert summary["other_layout_steps"] == [1, 2, 3, 4] and summary["warm_up_steps"] == [5]
    assert summary["steps"] == 7
    _echo_summary(summary, plan)
    said = capsys.readouterr().out
    assert ("over the 3 steps run with this plan (steps 1-4 ran another layout, recompute or dtype before it resumed "
            "them; medians leave out step 5, which warms up)") in said
    # records from before the tag existed count as the current layout
    assert [r["step"] for r in steady(_rows({1: 1.0, 2: 1.0, 3: 1.0}, warm={1}))] == [2, 3]
