"""A whole run of a point: steps for --tokens (or tokens in --days), failures, goodput, cost.

The failure simulation is the simulator's (`smplan.simulator.failures`); this module only turns a
point into its inputs (work, GPUs, MTBF, restart time, checkpoint save time and interval)
and its output into the run record of the points schema.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from smplan.hwprofiles import Cluster
from smplan.planner import Plan

from .grid import PointSpec
from .question import Question

if TYPE_CHECKING:  # the simulator is imported when a run is simulated, not with whatif
    from smplan.simulator.failures import RunReport, RunSpec

INTERVAL_FACTORS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # around Young/Daly, goodput chart (chosen: 1/8x-8x shows both sides' loss)
MTBF_FACTORS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0)  # around the profile's GPU MTBF (chosen: a decade each way)


class RunDoesNotFinish(ValueError):
    """Failures come faster than the run can make progress; the message says so in whatif's settings."""


def checkpoint_save_s(params: float, plan: Plan, cluster: Cluster) -> float:
    """Seconds to write one checkpoint of the plan's model state from the plan's nodes, as
    `smplan reliability` prices it (weights + optimizer state, capped by the file system)."""
    from smplan.simulator.reliability import checkpoint_bytes, checkpoint_seconds, writer_nodes

    return checkpoint_seconds(checkpoint_bytes(params, plan.dtype), writer_nodes(plan.world_size, cluster), cluster)


def run_spec(plan: Plan, cluster: Cluster, work_s: float, save_s: float, mtbf_hours: float | None = None):
    from smplan.simulator.failures import RunSpec

    return RunSpec(
        work_s=work_s, num_gpus=plan.world_size,
        gpu_mtbf_hours=mtbf_hours or cluster.reliability.gpu_mtbf_hours,
        restart_s=cluster.reliability.restart_minutes * 60.0, checkpoint_s=save_s,
        gpus_per_node=cluster.gpus_per_node,
    )


def never_finishes(spec: RunSpec, interval_s: float | None = None) -> str:
    """Why the run of `spec` does not finish, naming the settings whatif varies (the failure
    simulation's own message names `smplan reliability`'s options)."""
    from smplan.simulator.failures import (
        HOPELESS_GOODPUT,
        daly_failures,
        default_interval_text,
        expected_goodput,
    )

    why = (f"the run does not finish: its {spec.num_gpus:,} GPUs fail every {spec.job_mtbf_s:.3g} s on average "
           f"(reliability.gpu_mtbf_hours={spec.gpu_mtbf_hours:g} per GPU), against a "
           f"{spec.restart_s / 60:.3g} min restart and a {spec.checkpoint_s:.3g} s checkpoint write")
    if expected_goodput(spec, interval_s) >= HOPELESS_GOODPUT:  # it finishes on paper, after more failures
        return (f"the run fails too often to simulate: its {spec.num_gpus:,} GPUs fail every "
                f"{spec.job_mtbf_s:.3g} s on average, about {daly_failures(spec, interval_s):.3g} times before "
                "it finishes; raise reliability.gpu_mtbf_hours (--hw-set or --vary) or use fewer nodes")
    if interval_s and expected_goodput(spec) >= HOPELESS_GOODPUT:  # the given interval is what is wrong
        return (f"{why}; checkpoint_interval_min={interval_s / 60:g} makes no progress between failures: "
                f"try about {default_interval_text(spec)}")
    return (f"{why}; raise reliability.gpu_mtbf_hours, lower reliability.restart_minutes "
            "(--hw-set or --vary) or use fewer nodes")


def analyse_or_refuse(spec: RunSpec, interval_s: float | None, seeds: int) -> RunReport:
    """The failure simulation's RunReport of `spec`, or RunDoesNotFinish, cheaply for a hopeless run."""
    from smplan.simulator.failures import HOPELESS_GOODPUT, analyse_run, expected_goodput
    from smplan.simulator.failures import RunDoesNotFinish as SimulationGaveUp

    if expected_goodput(spec, interval_s) < HOPELESS_GOODPUT:
        raise RunDoesNotFinish(never_finishes(spec, interval_s))
    try:
        return analyse_run(spec, interval_s=interval_s, seeds=seeds)
    except SimulationGaveUp:  # only that is a point's fate; any other ReliabilityError is a bug here
        raise RunDoesNotFinish(never_finishes(spec, interval_s)) from None


# --days: at most this many failure simulations to find the steps that fill the wall-clock. The
# expected wall-clock is close to affine in the steps (work / goodput plus the last checkpoint),
# so the Illinois steps below usually close the bracket to one step in four or five.
MAX_FILL_EVALUATIONS = 16


def steps_within(budget_s: float, step_s: float, run_of) -> tuple[int, RunReport]:
    """The most whole steps whose run (`run_of(steps)`: its RunReport, failures, restarts and
    checkpoints included) is expected to end within `budget_s` of wall-clock, and that report.

    Work is not a fixed share of the wall-clock: every run pays for its last checkpoint, so a short
    budget holds fewer steps than budget x the goodput of a long run (a 0.05-day run with 3,067 s
    checkpoint writes was once given 159 steps, which take 0.058 days). The search brackets the
    count between one that fits and one that does not, by regula falsi with the Illinois change
    (Dowell & Jarratt 1971: an end kept twice has its overshoot halved, so a curved wall-clock
    does not creep up one step at a time), bisecting past a run that never ends."""
    one = run_of(1)
    if one.wall_mean_s > budget_s:
        raise RunDoesNotFinish(
            f"no whole step ends within {budget_s / 86400:.3g} days: one step ({step_s:.3g} s) with its failures, "
            f"restarts and checkpoint write ({one.checkpoint_s:.3g} s) is expected to take "
            f"{one.wall_mean_s:.3g} s; give more --days (or a faster checkpoint write)")
    fits, fits_report = 1, one
    over = None  # the fewest steps known not to fit
    # the ends' distances from the budget as the next guess weighs them (Illinois halves a kept one's)
    below_s, above_s, kept = budget_s - one.wall_mean_s, None, None
    for _ in range(MAX_FILL_EVALUATIONS):
        if over is not None and over - fits <= 1:
            break
        if over is None:  # extrapolate through one step's run and the largest that fits; failure-free
            # steps (the first guess) overshoot, as failures only add wall-clock
            per_step_s = (fits_report.wall_mean_s - one.wall_mean_s) / (fits - 1) if fits > 1 else step_s
            n = fits + max(1, int((budget_s - fits_report.wall_mean_s) / max(per_step_s, 1e-12)))
        elif above_s is None:  # the run past `over` never ends: bisect
            n = (fits + over) // 2
        else:
            n = fits + round(below_s / (below_s + above_s) * (over - fits))
        n = min(max(n, fits + 1), over - 1) if over is not None else n
        try:
            report = run_of(n)
        except RunDoesNotFinish:  # more work than the failures let finish: too many steps
            over, above_s, kept = n, None, None
            continue
        if report.wall_mean_s <= budget_s:
            fits, fits_report, below_s = n, report, budget_s - report.wall_mean_s
            if kept == "over" and above_s is not None:
                above_s /= 2.0
            kept = "over"
        else:
            over, above_s = n, report.wall_mean_s - budget_s
            if kept == "fits":
                below_s /= 2.0
            kept = "fits"
    return fits, fits_report


def run_record(q: Question, spec: PointSpec, plan: Plan, figures: dict, cluster: Cluster, params: float) -> dict:
    """The run of one point at the failure simulation's best checkpoint interval (Daly's when its
    seeds draw too few failures to tell intervals apart), or at the given one."""
    save_s = checkpoint_save_s(params, plan, cluster)
    given_min = spec.checkpoint_interval_min or q.checkpoint_interval_min
    step_s = figures["step_time_s"]
    tokens_per_step = figures["tokens_per_s"] * step_s
    interval_s = given_min * 60.0 if given_min else None
    from smplan.simulator.reliability import gpu_hours, whole_steps

    if q.tokens:
        steps = whole_steps(q.tokens, tokens_per_step)
        report = analyse_or_refuse(run_spec(plan, cluster, steps * step_s, save_s), interval_s, q.seeds)
    else:
        steps, report = steps_within(q.days * 86400.0, step_s, lambda n: analyse_or_refuse(
            run_spec(plan, cluster, n * step_s, save_s), interval_s, q.seeds))
    wall_s = report.wall_mean_s
    return {
        "tokens": float(q.tokens) if q.tokens else steps * tokens_per_step,  # --days: what its steps train
        "steps": steps,
        "ideal_days": steps * step_s / 86400.0,
        "days": wall_s / 86400.0,
        "usd": gpu_hours(wall_s, plan.world_size) * cluster.cost.usd_per_gpu_hour,
        "goodput": report.goodput_mean,
        "goodput_std": report.goodput_std,
        "goodput_p10": report.goodput_p10,
        "goodput_p90": report.goodput_p90,
        "checkpoint_interval_min": report.interval_s / 60.0,
        "checkpoint_interval_source": report.interval_source,  # "auto", "daly", "given" or "whole_run"
        "checkpoint_save_s": save_s,
        "young_daly_min": report.daly_interval_s / 60.0,
        "job_mtbf_hours": report.job_mtbf_s / 3600.0,
        "failures": report.failures_mean,
        "seeds": q.seeds,
    }


def goodput_curves(q: Question, point: dict, plan: Plan, cluster: Cluster) -> dict:
    """Goodput of the point's run vs checkpoint interval and vs GPU MTBF (mean, std over seeds;
    NaN where that run does not finish, as a tenth of the MTBF of a huge cluster may not)."""
    run = point["run"]
    work_s = run["steps"] * point["figures"]["step_time_s"]
    save_s = run["checkpoint_save_s"]
    chosen_min = run["checkpoint_interval_min"]
    yd_min = run["young_daly_min"]
    intervals = sorted({yd_min * f for f in INTERVAL_FACTORS} | {chosen_min})
    mean, std = goodput_or_nan(run_spec(plan, cluster, work_s, save_s), [m * 60.0 for m in intervals], q.seeds)
    vs_interval = {"interval_min": intervals, "goodput": mean, "goodput_std": std}
    vs_mtbf = {"gpu_mtbf_hours": [], "goodput": [], "goodput_std": []}
    for f in MTBF_FACTORS:
        hours = cluster.reliability.gpu_mtbf_hours * f
        mean, std = goodput_or_nan(run_spec(plan, cluster, work_s, save_s, hours), [chosen_min * 60.0], q.seeds)
        vs_mtbf["gpu_mtbf_hours"].append(hours)
        vs_mtbf["goodput"].append(mean[0])
        vs_mtbf["goodput_std"].append(std[0])
    return {"point": point["id"], "young_daly_min": yd_min, "chosen_interval_min": chosen_min,
            "gpu_mtbf_hours": cluster.reliability.gpu_mtbf_hours,
            "vs_interval": vs_interval, "vs_mtbf": vs_mtbf, "seeds": q.seeds}


def goodput_or_nan(spec: RunSpec, intervals_s: list[float], seeds: int) -> tuple[list[float], list[float]]:
    """(mean, std) goodput over seeds at each interval; NaN at an interval whose run does not
    finish (closed-form goodput under HOPELESS_GOODPUT, or the simulation gives up)."""
    from smplan.simulator.failures import HOPELESS_GOODPUT, expected_goodput, simulate_sweep
    from smplan.simulator.failures import RunDoesNotFinish as SimulationGaveUp

    mean, std = [math.nan] * len(intervals_s), [math.nan] * len(intervals_s)
    rows = [i for i, t in enumerate(intervals_s) if expected_goodput(spec, t) >= HOPELESS_GOODPUT]
    if not rows:
        return mean, std
    try:
        sweep = simulate_sweep(spec, [intervals_s[i] for i in rows], seeds)
    except SimulationGaveUp:  # one interval that cannot finish stops the sweep: try each alone
        if len(rows) == 1:
            return mean, std
        for i in rows:
            m, s = goodput_or_nan(spec, [intervals_s[i]], seeds)
            mean[i], std[i] = m[0], s[0]
        return mean, std
    for row, i in enumerate(rows):  # the mean on the basis of days and cost; the spread over seeds
        mean[i], std[i] = float(sweep.mean_goodput[row]), float(sweep.goodput[row].std())
    return mean, std
