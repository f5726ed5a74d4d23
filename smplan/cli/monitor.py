"""`smplan monitor RUN_DIR`: how a run of `smplan execute` is going, against its plan."""

from __future__ import annotations

import json
import os
import sys

import click

from .checks import FiniteFloat
from .options import echo_json, json_option

THRESHOLD_OPTIONS = [
    click.option("--straggler-pct", type=FiniteFloat(allow_zero=True, max_value=1000), default=20.0, show_default=True, metavar="X",
                 help="A rank whose own step time is more than X% above the median rank's..."),
    click.option("--straggler-steps", type=click.IntRange(min=1), default=3, show_default=True, metavar="N",
                 help="...for N consecutive steps is reported as a straggler."),
    click.option("--memory-pct", type=FiniteFloat(allow_zero=True, max_value=1000), default=10.0, show_default=True, metavar="Y",
                 help="Warn when a rank's peak memory is more than Y% above the plan's predicted peak (GPU runs)."),
]


def threshold_options(fn):
    for option in reversed(THRESHOLD_OPTIONS):
        fn = option(fn)
    return fn


@click.command()
@click.argument("run_dir", metavar="RUN_DIR")
@click.option("--follow", is_flag=True, help="Redraw every --interval seconds until the run finishes (Ctrl-C stops).")
@click.option("--interval", type=FiniteFloat(max_value=3600), default=2.0, show_default=True, help="Seconds between redraws.")
@threshold_options
@json_option
def monitor(run_dir, follow, interval, straggler_pct, straggler_steps, memory_pct, as_json):
    """How a run of `smplan execute` is going: progress, step time and tokens/s (samples/s for a
    model without sequences) against the plan's prediction, memory per rank, loss and gradient-norm sparklines (validation loss
    and lr too, when recorded), and warnings for stragglers and memory above the prediction. Works on a finished run too.

    \b
    RUN_DIR is the -o/--output folder of `smplan execute`. A rank's own step time is the step
    (the ranks' median step time) less its wait for the slowest rank at the step-end
    synchronisation; the rank table gives means over the steps, so step time = own time + waited.
      smplan monitor runs/demo
      smplan monitor runs/demo --follow                 # while it trains
      smplan monitor runs/demo --json | jq .stragglers  # for scripts (--follow: one object per line)
    """
    from smplan.monitor import Thresholds, load_run, render_status, run_status, skipped_note
    from smplan.monitor import follow as follow_run

    thresholds = Thresholds(straggler_pct, straggler_steps, memory_pct)
    said = {"waiting": None}  # the waiting line last printed: --follow says each once, not every --interval

    def show(run, clear: bool = False) -> None:
        if run is None:
            where = (f"the first step in {run_dir}" if os.path.isdir(run_dir)
                     else f"{run_dir} to appear (smplan execute creates it as it starts)")
            line = json.dumps({"run_dir": run_dir, "waiting": True}) if as_json else f"waiting for {where} ..."
            if as_json or line != said["waiting"]:  # --json --follow: one object per update, for scripts
                click.echo(line)
            said["waiting"] = line
            return
        said["waiting"] = None
        status = run_status(run, thresholds)
        if as_json and follow:
            click.echo(json.dumps(status))  # one object per line
        elif as_json:
            echo_json(status)
        else:
            if clear:
                click.clear()
            click.echo(render_status(status))
        note = skipped_note(status)
        if note:
            click.echo(note, err=True)

    if not follow:
        show(load_run(run_dir))
        return
    tty = sys.stdout.isatty()
    try:
        follow_run(run_dir, lambda run: show(run, clear=tty and not as_json), interval_s=interval)
    except KeyboardInterrupt:
        pass
