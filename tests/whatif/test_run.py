"""A point's whole run under failures: a run that cannot finish is that point's reason, in
whatif's settings, found without simulating it; the goodput curves skip such runs; --days
holds the whole steps whose run ends in time."""

from __future__ import annotations

import math
import re

import pytest
from smplan.simulator.failures import (
    HOPELESS_GOODPUT,
    RunSpec,
    expected_goodput,
    too_many_failures_reason,
)

from smplan.whatif.run import (
    MAX_FILL_EVALUATIONS,
    RunDoesNotFinish,
    analyse_or_refuse,
    goodput_or_nan,
    steps_within,
)

# 800,000 GPUs of 50,000 h MTBF (`--vary nodes=1,100000` on h100x8) at a tenth of that MTBF:
# the job fails every 22.5 s and a restart takes 15 min
HOPELESS = RunSpec(work_s=3.0, num_gpus=800_000, gpu_mtbf_hours=5000.0, restart_s=900.0, checkpoint_s=0.06)
FINE = RunSpec(work_s=3600.0, num_gpus=800_000, gpu_mtbf_hours=50000.0, restart_s=900.0, checkpoint_s=0.06)


def test_a_hopeless_run_is_refused_in_whatifs_terms_without_simulating(monkeypatch):
    def spins(*_, **__):
        raise AssertionError("the failure simulation was run for a run that cannot finish")

    monkeypatch.setattr("smplan.simulator.failures.analyse_run", spins)
    with pytest.raises(RunDoesNotFinish) as err:  # `spins` fails the test if the simulation runs
        analyse_or_refuse(HOPELESS, None, seeds=30)
    message = str(err.value)
    assert "does not finish" in message and "reliability.gpu_mtbf_hours" in message
    assert "reliability.restart_minutes" in message and "nodes" in message
    for option in ("--mtbf-hours", "--restart-minutes", "--checkpoint-minutes"):  # `smplan reliability`'s
        assert option not in message


def test_a_checkpoint_interval_that_makes_no_progress_is_named():
    # Daly's interval would finish; 600 minutes between checkpoints of a job failing every 225 s does not
    with pytest.raises(RunDoesNotFinish, match=r"checkpoint_interval_min=600 makes no progress.*try about"):
        analyse_or_refuse(FINE, 600 * 60.0, seeds=5)


def test_closed_form_goodput_tells_hopeless_from_fine():
    assert expected_goodput(HOPELESS) < HOPELESS_GOODPUT < expected_goodput(FINE) <= 1.0
    assert 0.0 < analyse_or_refuse(FINE, None, seeds=5).goodput_mean <= 1.0


def test_goodput_curve_is_nan_where_the_run_does_not_finish():
    mean, std = goodput_or_nan(HOPELESS, [60.0, 600.0], seeds=5)
    assert all(math.isnan(v) for v in mean + std)
    mean, std = goodput_or_nan(FINE, [5.0, 1e6], seeds=5)  # an hour's work in one piece never finishes
    assert 0 < mean[0] <= 1 and math.isnan(mean[1])
    short = RunSpec(work_s=3.0, num_gpus=800_000, gpu_mtbf_hours=50000.0, restart_s=900.0, checkpoint_s=0.06)
    mean, _ = goodput_or_nan(short, [1e6], seeds=5)
    assert 0 < mean[0] <= 1  # 3 s of work (the nodes=100000 point): one piece, however long the interval


def test_a_run_with_more_failures_than_the_simulation_follows_says_so():
    # a failure a minute, restarts of 10 s: it finishes on paper, after ~2e5 failures, which the
    # failure simulation refuses to follow (simulator.failures.MAX_FAILURES_PER_SEED)
    busy = RunSpec(work_s=1e7, num_gpus=8, gpu_mtbf_hours=60 * 8 / 3600, restart_s=10.0, checkpoint_s=1.0)
    assert expected_goodput(busy) > 0.5
    with pytest.raises(RunDoesNotFinish, match=r"fails too often to simulate.*reliability.gpu_mtbf_hours") as err:
        analyse_or_refuse(busy, None, seeds=5)
    # `smplan reliability` says the same of it, with the same count (it once said "does not finish",
    # after 5.6x as many failures: those of its simulation horizon)
    count = re.search(r"about (\S+) times before it finishes", str(err.value)).group(1)
    assert re.match(rf"the run fails too often to simulate: .* about {re.escape(count)} times before it finishes",
                    too_many_failures_reason(busy))


def _run_of(step_s: float, checkpoint_s: float, calls: list, gpus: int = 128):
    def run_of(steps: int):
        calls.append(steps)
        spec = RunSpec(work_s=steps * step_s, num_gpus=gpus, gpu_mtbf_hours=50000.0, restart_s=600.0,
                       checkpoint_s=checkpoint_s)
        return analyse_or_refuse(spec, None, seeds=20)
    return run_of


@pytest.mark.parametrize("step_s, checkpoint_s, gpus, budget_s", [
    (12.2, 3067.0, 128, 4320.0), (12.2, 30.0, 128, 4320.0), (12.2, 30.0, 128, 30 * 86400.0),
    # a review's: plain regula falsi crept up a step at a time and stopped 13-20 steps short
    (0.5, 30.0, 16384, 86400.0), (0.5, 30.0, 128, 30 * 86400.0),
])
def test_days_fill_with_whole_steps_whose_run_ends_in_time(step_s, checkpoint_s, gpus, budget_s):
    """--days: the steps of a run that ends within the wall-clock, its last checkpoint included (a
    0.05-day run of 3,067 s checkpoint writes was given 159 steps of 12.2 s, which take 0.058 days)."""
    calls: list = []
    steps, report = steps_within(budget_s, step_s, _run_of(step_s, checkpoint_s, calls, gpus))
    assert report.wall_mean_s <= budget_s and report.work_s == pytest.approx(steps * step_s)
    assert _run_of(step_s, checkpoint_s, [], gpus)(steps + 1).wall_mean_s > budget_s  # one more does not fit
    assert len(calls) <= MAX_FILL_EVALUATIONS + 1


def test_days_shorter_than_one_step_and_its_checkpoint_are_the_points_reason():
    with pytest.raises(RunDoesNotFinish, match=r"no whole step ends within 0\.0001 days: one step \(12\.2 s\)"):
        steps_within(8.64, 12.2, _run_of(12.2, 30.0, []))


def test_a_best_case_of_tied_goodputs_states_one_figure():
    """A review: "Goodput runs from 12.6% (#0 ...) to 12.6% (#0 ...)" named one point twice."""
    from smplan.whatif.sweep import _best_case

    def point(i, goodput):
        return {"id": i, "label": f"restart={i}", "feasible": True, "run": {"goodput": goodput}}

    tied = _best_case([point(0, 0.12601), point(1, 0.12598)], 0, ["reliability.restart_minutes"])
    assert tied.endswith("Goodput is 12.6% at every point."), tied
    spread = _best_case([point(0, 0.5), point(1, 0.9)], 1, ["reliability.gpu_mtbf_hours"])
    assert spread.endswith("Goodput runs from 50.0% (#0 restart=0) to 90.0% (#1 restart=1)."), spread
