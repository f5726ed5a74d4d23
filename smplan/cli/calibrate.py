"""`smplan calibrate MODEL --hw HW`: run plans for real, compare, fit the profile's factors."""

from __future__ import annotations

from pathlib import Path

import click

from smplan.calibrate import CalibrateOptions
from smplan.calibrate import calibrate as run_calibration
from smplan.calibrate.run import factor_state, undetermined_note

from .checks import UserError, check_can_write
from .options import (
    GLOBAL_BATCH,
    OneSpelling,
    echo_json,
    json_option,
    model_args_from,
    model_args_option,
    non_empty_path,
    stack_option,
)
from .table import format_table


@click.command()
@click.argument("model", metavar="MODEL")
@click.option("--hw", required=True, metavar="NAME|PATH",
              help="Profile to calibrate, e.g. the output of `smplan hw probe -o myhw.toml`.")
@stack_option
@click.option("--hw-set", "hw_set", multiple=True, metavar="KEY=VALUE",
              help="Override a hardware value before calibrating (dotted key). Repeatable.")
@model_args_option
@click.option("--plans", "num_plans", type=click.IntRange(min=0), default=3, show_default=True,
              help="How many plans to run (at least 1 without --plan); they differ in dp/tp/pp, recomputation and "
                   "micro-batch.")
@click.option("--plan", "choices", multiple=True, metavar="KEYS",
              help='Run this plan instead of the automatic pick, e.g. "dp=2,mbs=4,recompute=full". Repeatable.')
@click.option("--steps", type=click.IntRange(min=2), default=5, show_default=True,
              help="Steps per plan, at least 2: the first is warm-up, the fastest of the rest is the measurement.")
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run the list of plans this many times (at least 1) and keep each plan's fastest (busy machines).")
@click.option("--nproc-per-node", "--nproc", "nproc", cls=OneSpelling, old_names=("--nproc",), type=click.IntRange(min=1), default=2, show_default=True, help="Local processes per run (gloo on CPU).")
@click.option("--global-batch", "--gbs", "global_batch", cls=OneSpelling, old_names=("--gbs",), type=GLOBAL_BATCH, default=8, show_default=True,
              help="Global batch of every plan (samples per step).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, callback=non_empty_path,
              help="Write the calibrated profile here (a TOML that --hw PATH loads).")
@click.option("--stack-output", type=click.Path(dir_okay=False), default=None,
              help="Also write a stack TOML here (a file that --stack PATH loads): the fitted stack keys "
                   "(host_overhead_us_per_layer), every other one as the fit ran with it.")
@click.option("--force", is_flag=True, help="Overwrite an existing -o or --stack-output file.")
@click.option("--check", is_flag=True, help="Only report the prediction error; fit and write nothing.")
@click.option("--runs-dir", type=click.Path(file_okay=False), default=None,
              help="Where the runs' metrics and logs go (default runs/calibrate-TIME).")
@json_option
def calibrate(model, hw, stack, hw_set, model_args, num_plans, choices, steps, rounds, nproc, global_batch, output, stack_output,
              force, check, runs_dir, as_json):
    """Hold the cost model against real runs of MODEL and fit HW's global efficiency factors.

    MODEL is a model file, path/to/model.py[:builder] (README: The model file), or hf:DIR, a folder
    holding a Hugging Face config.json (built from it: no weights, no download).

    Runs --plans plans of its own (not an `execute` run folder; on CPU no tp plan,
    whose speed there is DTensor's dispatch, unless --plan asks) for --steps steps each
    with `smplan execute`'s library, predicts the same plans with the planner's cost
    model (and the simulator), prints predicted vs measured step time, then fits the
    profile's few global factors (matmul_max, matmul_half_dim, memory_bound, network,
    host_overhead_us_per_layer; never one per plan) and writes the profile with them to -o; factors that miss these plans by more than
    HW's own are not kept, and nothing is written (exit code 2 where -o asked for a file). Without
    -o nothing is written either.
    --check stops before the fit. A fit to plans of one dp/tp/pp layout says which layouts (and
    ZeRO/FSDP, never run here) it did not measure.

    \b
    Example:
      smplan hw probe -o myhw.toml
      smplan calibrate examples/gpt.py --arg hidden=256 --arg seq_len=128 --hw myhw.toml -o cal.toml
      smplan calibrate examples/gpt.py --arg hidden=256 --arg seq_len=128 --hw cal.toml --check
    """
    opts = CalibrateOptions(plans=num_plans, steps=steps, rounds=rounds, nproc=nproc, global_batch=global_batch, output=output,
                            force=force, check=check, runs_dir=runs_dir, hw_set=tuple(hw_set),
                            choices=tuple(choices), stack=stack, stack_output=stack_output)
    if output and stack_output and Path(output).resolve() == Path(stack_output).resolve():
        raise UserError(f"-o/--output and --stack-output both name {output}: one holds the hardware profile, the "
                        "other the stack; give two files")
    for path, option in ((output, "-o/--output"), (stack_output, "--stack-output")):
        check_can_write(path, option)  # before the measured runs
    check_can_write(runs_dir, "--runs-dir", folder=True)
    report = run_calibration(model, model_args_from(model_args), hw, opts,
                             progress=lambda line: click.echo(line, err=True))
    unwritten = (output or stack_output) and report.kept_input and not check
    if as_json:
        echo_json(report.to_dict())
        if unwritten:  # after the object, as reliability does: a script's `calibrate -o X && plan --hw X` stops
            raise UserError(report.kept_input)
        return
    headers = ["plan", "measured ms", "predicted ms", "simulated ms", "pred/meas"]

    def table(rows):
        return format_table(headers, [[r.label, r.measured_s * 1e3, r.predicted_s * 1e3, r.simulated_s * 1e3,
                                       r.ratio] for r in rows])

    click.echo(f"with {hw} as given:")
    click.echo(table(report.before))
    click.echo(f"median |error| {report.median_ape_before:.1%}")
    for m in report.failed:
        click.echo(f"failed: {m.label}: {m.error}")
    if report.fit is None:
        if check and (output or stack_output):
            click.echo("(--check: nothing fitted, so -o / --stack-output were not written)")
        return
    click.echo("\ncalibrated:" if not report.kept_input else "\nfitted (not kept):")
    click.echo(table(report.after))
    click.echo(f"median |error| {report.median_ape_after:.1%} on the plans it was fitted to")
    for key, (before, after) in report.fit.changes(_efficiency(report)).items():
        undetermined = key in report.fit.undetermined  # the prior kept it: no "->" as if the runs set it
        click.echo(f"  efficiency.{key}: " + (factor_state(after, False) if undetermined else f"{before:.4g} -> {after:.4g}"))
    if report.warning:
        click.echo(f"warning: {report.warning}")
    if undetermined_note(report.fit):
        click.echo(f"note: {undetermined_note(report.fit)}")
    if report.coverage:
        click.echo(f"note: {report.coverage}")
    if report.kept_input:
        if unwritten:  # exit 2: what -o asked for is not there
            raise UserError(report.kept_input)
        click.echo(f"note: {report.kept_input}")
        return
    if report.output:
        click.echo(f"wrote {report.output} (use it with --hw {report.output})")
    if report.stack_output:
        click.echo(f"wrote {report.stack_output} (use it with --stack {report.stack_output})")
    if not report.output and not report.stack_output:
        click.echo("(no -o given: nothing written)")


def _efficiency(report):
    from smplan.hwprofiles import Efficiency

    return Efficiency(**report.efficiency_before)
