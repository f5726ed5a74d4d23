"""Medians leave out the first step after every start of the workers (the run's, a resume's, a
restart's: allocations, gloo's connections), not only the run's step 1."""

from __future__ import annotations

import json

from smplan.executor.metrics import WARM_UP, steady, summarize
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
