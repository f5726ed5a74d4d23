"""A whole run of a point: steps for --tokens (or tokens in --days), failures, goodput, cost.

The failure simulation is the simulator's (`smplan.simulator.failures`); this module only turns a
point into its inputs (work, GPUs, MTBF, restart time, checkpoint save time and interval)
and its output into the run record of the points schema.
"""

from __future__ import annotations

import math

from smplan.hwprofiles import Cluster
from smplan.planner import Plan

from .grid import PointSpec
from .question import Question

INTERVAL_FACTORS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # around Young/Daly, goodput chart
MTBF_FACTORS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0)  # around the profile's GPU MTBF


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


def run_record(q: Question, spec: PointSpec, plan: Plan, figures: dict, cluster: Cluster, params: float) -> dict:
    """The run of one point at the failure simulation's best checkpoint interval (Daly's when its
    seeds draw too few failures to tell intervals apart), or at the given one."""
    from smplan.simulator.failures import analyse_run

    save_s = checkpoint_save_s(params, plan, cluster)
    given_min = spec.checkpoint_interval_min or q.checkpoint_interval_min
    step_s = figures["step_time_s"]
    tokens_per_step = figures["tokens_per_s"] * step_s
    if q.tokens:
        steps = math.ceil(q.tokens / tokens_per_step)
        report = analyse_run(run_spec(plan, cluster, steps * step_s, save_s),
                             interval_s=given_min * 60.0 if given_min else None, seeds=q.seeds)
    else:
        # A fixed wall-clock: find the work that fills it (goodput barely depends on length).
        wall = q.days * 86400.0
        work = wall
        for _ in range(2):
            report = analyse_run(run_spec(plan, cluster, work, save_s),
                                 interval_s=given_min * 60.0 if given_min else None, seeds=q.seeds)
            work = wall * report.goodput_mean
        steps = int(work / step_s)
    wall_s = report.wall_mean_s if q.tokens else q.days * 86400.0
    return {
        "tokens": float(q.tokens) if q.tokens else steps * tokens_per_step,
        "steps": steps,
        "ideal_days": steps * step_s / 86400.0,
        "days": wall_s / 86400.0,
        "usd": wall_s / 3600.0 * plan.world_size * cluster.cost.usd_per_gpu_hour,
        "goodput": report.goodput_mean,
        "goodput_std": report.goodput_std,
        "goodput_p10": report.goodput_p10,
        "goodput_p90": report.goodput_p90,
        "checkpoint_interval_min": report.interval_s / 60.0,
        "checkpoint_interval_source": report.interval_source,  # "auto", "daly" or "given"
        "checkpoint_save_s": save_s,
        "young_daly_min": report.daly_interval_s / 60.0,
        "job_mtbf_hours": report.job_mtbf_s / 3600.0,
        "failures": report.failures_mean,
        "seeds": q.seeds,
    }


def goodput_curves(q: Question, point: dict, plan: Plan, cluster: Cluster) -> dict:
    """Goodput of the point's run vs checkpoint interval and vs GPU MTBF (mean, std over seeds)."""
    from smplan.simulator.failures import simulate_sweep

    run = point["run"]
    work_s = run["steps"] * point["figures"]["step_time_s"]
    save_s = run["checkpoint_save_s"]
    chosen_min = run["checkpoint_interval_min"]
    yd_min = run["young_daly_min"]
    intervals = sorted({yd_min * f for f in INTERVAL_FACTORS} | {chosen_min})
    res = simulate_sweep(run_spec(plan, cluster, work_s, save_s), [m * 60.0 for m in intervals], q.seeds)
    good = res.goodput
    vs_interval = {"interval_min": intervals, "goodput": good.mean(axis=1).tolist(),
                   "goodput_std": good.std(axis=1).tolist()}
    vs_mtbf = {"gpu_mtbf_hours": [], "goodput": [], "goodput_std": []}
    for f in MTBF_FACTORS:
        hours = cluster.reliability.gpu_mtbf_hours * f
        res = simulate_sweep(run_spec(plan, cluster, work_s, save_s, hours), [chosen_min * 60.0], q.seeds)
        vs_mtbf["gpu_mtbf_hours"].append(hours)
        vs_mtbf["goodput"].append(float(res.goodput[0].mean()))
        vs_mtbf["goodput_std"].append(float(res.goodput[0].std()))
    return {"point": point["id"], "young_daly_min": yd_min, "chosen_interval_min": chosen_min,
            "vs_interval": vs_interval, "vs_mtbf": vs_mtbf, "seeds": q.seeds}
