"""`smplan reliability`: a plan's whole run under failures (goodput, wall-clock, intervals)."""

from __future__ import annotations

import math

import click

from smplan.display import days_text
from smplan.planner import estimate
from smplan.progress import said_after
from smplan.simulator.failures import (
    MIN_SWEEP_FAILURES,
    ReliabilityError,
    RunDoesNotFinish,
    RunReport,
    weibull_shape_problem,
)
from smplan.simulator.inputs import resolve_target
from smplan.simulator.prediction import stale_prediction_note
from smplan.simulator.reliability import RunTarget, checkpoint_write_gbps, plan_reliability

from .checks import FiniteFloat
from .notes import out_of_memory_warning
from .options import (
    SEQ_LEN,
    OneSpelling,
    echo_json,
    hw_options,
    json_option,
    model_args_from,
    model_args_option,
    warn_about_profiles,
)
from .table import format_table


def _interval(value: str) -> float | None:
    if value.strip().lower() == "auto":
        return None
    try:
        minutes = float(value)
    except ValueError:
        raise ReliabilityError(f"--checkpoint-interval-min must be 'auto' or minutes, got {value!r}") from None
    if not math.isfinite(minutes) or minutes <= 0:
        raise ReliabilityError(f"--checkpoint-interval-min must be a finite number of minutes > 0, got {value}")
    return minutes


def _weibull_shape(ctx, param, value: float | None) -> float | None:
    """--weibull-shape in the simulation's range: one message for 0, negatives, NaN and the rest."""
    problem = weibull_shape_problem(value)
    if problem:
        raise ReliabilityError(problem)
    return value


def _wait_text(wait_s: float) -> str:
    return f"{wait_s / 86400:.2f} days" if wait_s >= 86400 else f"{wait_s / 3600:.2f} h"


def daly_line(r: RunReport) -> str:
    """Daly's closed-form wall-clock beside the simulated one; Daly's has no spare pool, so with
    --spares it leaves out the wait for a spare node that the simulation counts."""
    day = 86400.0
    line = (f"Daly's expected wall-clock at the used interval: {r.daly_expected_wall_s / day:.2f} days "
            f"(simulated mean {r.wall_mean_s / day:.2f}")
    if r.spares is not None and r.spare_wait_mean_s > 0:
        line += f"; Daly's formula leaves out the {_wait_text(r.spare_wait_mean_s)} waiting for a spare node"
    return line + ")"


def failure_model_line(r: RunReport) -> str:
    """The settings that drive the failures: GPU lifetimes and the spare-node pool."""
    if r.weibull_shape is None or r.weibull_shape == 1.0:
        lives = "exponential GPU lifetimes (no ageing)"
    else:
        kind = "infant mortality" if r.weibull_shape < 1 else "wear-out"
        lives = f"Weibull GPU lifetimes, shape {r.weibull_shape:g} ({kind}), every GPU new at t=0"
    if r.spares is None:
        pool = "spare nodes never run short (--spares N models a pool)"
    else:
        pool = f"{r.spares} spare node{'' if r.spares == 1 else 's'}, a failed node back after {r.repair_hours:g} h"
    return f"failures: {lives}; {pool}"


def spare_wait_line(r: RunReport) -> str:
    """How much of the wall-clock went to waiting for a spare node (part of the goodput lost)."""
    wait_s = r.spare_wait_mean_s
    if wait_s <= 0:
        return f"waiting for a spare node: none (the {r.spares} spares cover every repair)"
    return (f"waiting for a spare node: {_wait_text(wait_s)} per run on average, {wait_s / r.wall_mean_s:.1%} of the "
            f"wall-clock lost from goodput (more --spares win it back)")


def skewed_mean_note(r: RunReport) -> str | None:
    """A line on why the mean goodput lies outside p10..p90 (as printed), or None when it does not:
    in a short run most seeds see no failure and the few that do pull the mean below them all."""
    shown = [round(100 * g, 2) for g in (r.goodput_p10, r.goodput_mean, r.goodput_p90)]
    if shown[0] <= shown[1] <= shown[2]:
        return None
    side = "below p10" if shown[1] < shown[0] else "above p90"
    return (f"note: {r.seeds_without_failure} of {r.seeds} seeds see no failure (failures per seed "
            f"{r.failures_mean:.2g} on average): the few seeds that fail pull the mean ({shown[1]:.2f}%) {side}")


@click.command()
@click.argument("target", metavar="PLAN.json|MODEL")
@hw_options(required=False, plan_files=True)
@click.option("--plan", "plan_text", default=None, metavar="KEYS", help="Inline plan for a MODEL.")
@model_args_option
@click.option("--seq-len", type=SEQ_LEN, default=None, help="Sequence length (tokens per sample; builder argument).")
# At most 10 years of failure-free training, and 1e15 tokens (64x the 15.6T of Llama 3, Meta 2024):
# beyond either the failure simulation only overflows.
@click.option("--days", type=FiniteFloat(max_value=3650, limit_note="10 years"), default=None,
              help="Failure-free training days: the compute the run needs, before failures, restarts and "
                   "checkpoints add to its wall-clock (at most 3650). Not `smplan whatif --days`, which is "
                   "wall-clock days.")
@click.option("--tokens", type=FiniteFloat(max_value=1e15, limit_note="64x the tokens of Llama 3"), default=None,
              help="Tokens to train on (e.g. 3e11; at most 1e15); samples for a model without token sequences "
                   "(an MLP, a CNN, a ViT on images), as `plan` counts them.")
@click.option("--checkpoint-interval-min", "--checkpoint-interval", "interval", cls=OneSpelling,
              old_names=("--checkpoint-interval",), default="auto", show_default=True, metavar="auto|MIN",
              help="Minutes of training between checkpoints; auto takes the sweep's best. (Not "
                   "--checkpoint-minutes, the time one checkpoint takes to write.)")
@click.option("--mtbf-hours", type=FiniteFloat(), default=None, help="Per-GPU MTBF (default: the hardware profile's).")
@click.option("--restart-minutes", type=FiniteFloat(allow_zero=True), default=None, help="Detection + restart (default: the profile's).")
@click.option("--checkpoint-minutes", type=FiniteFloat(), default=None,
              help="Minutes one checkpoint takes to write (not the interval between them: "
                   "--checkpoint-interval-min). Default: weights + optimizer state over nodes x "
                   "storage.checkpoint_write_gbps, at most the file system's storage.filesystem_write_gbps).")
@click.option("--async-checkpoint", is_flag=True,
              help="Training blocks only for the GPU->host snapshot; a write still ends before the next starts, "
                   "so the interval is at least one write.")
@click.option("--spares", type=click.IntRange(min=0), default=None,
              help="Hot spare nodes; a failure with none free waits for a repaired node (default: never short).")
@click.option("--repair-hours", type=FiniteFloat(), default=24.0, show_default=True,
              help="Hours a failed node is out for repair (with --spares N, 0 included).")
# Weibull lifetimes from new hardware: see simulator/failures.py (Schroeder & Gibson, DSN 2006, for k < 1).
@click.option("--weibull-shape", type=click.FLOAT, callback=_weibull_shape, default=None, metavar="K",
              help="Weibull GPU lifetimes of shape K (0.1-10, mean --mtbf-hours), every GPU new at t=0 and "
                   "when replaced: K < 1 is infant mortality (more failures early, so more in a short run), "
                   "K > 1 wear-out (fewer until GPUs age). Default: exponential (K = 1, no ageing).")
@click.option("--seeds", type=click.IntRange(min=1), default=100, show_default=True,
              help="Failure-simulation runs (different random failure times); the report gives mean and spread.")
@json_option
def reliability(target, hw, stack, nodes, hw_set, plan_text, model_args, seq_len, days, tokens, interval, mtbf_hours,
                restart_minutes, checkpoint_minutes, async_checkpoint, spares, repair_hours, weibull_shape, seeds, as_json):
    """Goodput and wall-clock of a whole run of PLAN.json under failures.

    A MODEL with --hw and --plan stands for a plan file: a model file,
    path/to/model.py[:builder] (README: The model file), or hf:DIR, a folder
    holding a Hugging Face config.json (built from it: no weights, no download).

    \b
      smplan reliability plan.json --tokens 3e11
      smplan reliability plan.json --days 30 --checkpoint-interval-min 60 --spares 4 --json
    """
    if (days is None) == (tokens is None):
        raise ReliabilityError("give exactly one of --days D or --tokens T")
    given = click.get_current_context().get_parameter_source("repair_hours")
    if spares is None and given is not click.core.ParameterSource.DEFAULT:  # --spares 0 is a pool too
        raise ReliabilityError("--repair-hours is how long a failed node waits for a spare: add --spares N")
    minutes = _interval(interval)
    plan, profile, cluster = resolve_target(
        target, hw=hw, nodes=nodes, hw_set=hw_set, plan_text=plan_text, model_args=model_args_from(model_args), seq_len=seq_len,
        stack=stack,
    )
    notes = warn_about_profiles(hw or plan.hw, stack=stack or plan.stack, overrides=plan.hw_overrides)
    what = "the run" if minutes else "a sweep of checkpoint intervals"
    # a failure sweep takes from milliseconds to minutes (--seeds 1000 on a long run: 2 min 23 s, a review)
    with said_after(lambda line: click.echo(line, err=True),
                    f"simulating {what}, {seeds} failure draws each (fewer --seeds is quicker) ..."):
        result = plan_reliability(
            plan, profile, cluster, RunTarget(days=days, tokens=tokens), interval_minutes=minutes, mtbf_hours=mtbf_hours,
            restart_minutes=restart_minutes, checkpoint_minutes=checkpoint_minutes, async_checkpoint=async_checkpoint,
            spares=spares, repair_hours=repair_hours, weibull_shape=weibull_shape, seeds=seeds,
        )
    as_planned = not (hw or stack or nodes or hw_set)  # the file's own figures, as simulate checks them
    stale = (stale_prediction_note(target, plan, result.step_time_s, estimate(plan, profile, cluster).step_time_s)
             if as_planned and plan.predicted is not None else None)
    if stale:  # the recorded step is not what this run's goodput is priced at (a review's finding)
        notes.append(stale)
        click.echo(stale, err=True)
    if not result.fits_memory:  # on stderr: --json keeps stdout to its one object
        notes.append(out_of_memory_warning(result.peak_memory_gib, result.memory_capacity_gib, cluster.gpu.name, plan))
        click.echo(notes[-1], err=True)
    if as_json:
        # what was run, as `simulate --json` says it (review: the object named no model or plan)
        echo_json({**result.to_dict(), "unit": "token" if profile.seq_len else "sample",
                   "model": plan.model, "hw": cluster.name, "stack": plan.stack,
                   "plan": plan.to_dict(), "notes": notes})  # every line said on stderr
    if not result.finishes:  # after --json's object (feasible: false), as whatif prints its record, then exit 2
        raise RunDoesNotFinish(result.reason)
    if as_json:
        return
    r = result.report
    day = 86400.0
    unit = "tokens" if profile.seq_len else "samples"  # a model without sequences counts samples, as plan does
    click.echo(f"{plan.model}: {result.num_gpus} GPUs ({cluster.name}, stack {plan.stack}), step {result.step_time_s:.3g} s, "
               f"{result.tokens_per_s:,.0f} {unit}/s, failure-free {r.work_s / day:.2f} days")
    if checkpoint_minutes is None:  # say what the write time assumes: it scales with the nodes writing
        writers, per_node = result.nodes, cluster.storage.checkpoint_write_gbps
        rate = f", {writers} node{'s' if writers != 1 else ''} writing {per_node:g} GB/s each"
        if checkpoint_write_gbps(writers, cluster) < writers * per_node:
            rate += f", capped at the file system's {checkpoint_write_gbps(writers, cluster):g} GB/s"
        rate += "; --checkpoint-minutes sets it"
    else:
        rate = ""
    click.echo(f"job MTBF {r.job_mtbf_s / 3600:.2f} h, restart {r.restart_s / 60:.1f} min, "
               f"checkpoint {r.checkpoint_s / 60:.2f} min ({result.checkpoint_bytes / 1e9:.0f} GB{rate}"
               f"{', async: blocks ' + format(r.blocking_s, '.2g') + ' s' if async_checkpoint else ''})")
    click.echo(failure_model_line(r))
    if r.spares is not None:
        click.echo(spare_wait_line(r))
    rows = [
        # as percentages to 0.01: a run that rarely fails sits at 0.99x, which 3 digits show as "1"
        ["goodput", *(f"{100 * g:.2f}%" for g in (r.goodput_mean, r.goodput_p10, r.goodput_p50, r.goodput_p90))],
        ["wall-clock (days)", *(days_text(s / day) for s in (r.wall_mean_s, r.wall_p10_s, r.wall_p50_s, r.wall_p90_s))],
        ["failures", r.failures_mean, "", "", ""],
    ]
    click.echo(format_table(["over " + str(r.seeds) + " seeds", "mean", "p10", "p50", "p90"], rows, align="lrrrr"))
    if note := skewed_mean_note(r):
        click.echo(note)
    price = (f", ${result.usd_mean:,.0f} at ${result.usd_per_gpu_hour:g} per GPU-hour ({cluster.name}'s [cost])"
             if result.usd_per_gpu_hour else "")  # a probed profile has no price
    click.echo(f"the mean wall-clock takes {result.gpu_hours_mean:,.0f} GPU-hours{price}")
    click.echo("")
    used = {"daly": "Daly's: too few failures to sweep",
            "whole_run": "the whole run: shorter than the sweep's or Daly's"}.get(r.interval_source, r.interval_source)
    click.echo(format_table(["checkpoint interval", "minutes"], [
        [f"used ({used})", r.interval_s / 60],
        ["best by sweep", r.best_interval_s / 60],
        ["Young sqrt(2 delta M)", r.young_interval_s / 60],
        ["Daly (2006)", r.daly_interval_s / 60],
    ]))
    click.echo("\n" + daly_line(r))
    if r.interval_source == "daly":
        click.echo(f"note: the {r.seeds} seeds drew {r.sweep_failures} failure(s) at the sweep's best interval, under "
                   f"the {MIN_SWEEP_FAILURES} that tell intervals apart, so the interval used is Daly's; more --seeds "
                   "let the sweep choose")
