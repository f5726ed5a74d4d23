"""`smplan report RUN_DIR -o out.html`: the charts of one run of `smplan execute`."""

from __future__ import annotations

import click

from .checks import check_can_write
from .main import UserError
from .monitor import threshold_options
from .options import echo_json, json_option, non_empty_path


@click.command()
@click.argument("run_dir", metavar="RUN_DIR")
@click.option("-o", "--output", "out", default=None, callback=non_empty_path, metavar="FILE.html",
              help="Where the page goes (default RUN_DIR/report.html, rewritten on every call; a file of that name smplan did not write needs --force).")
@click.option("--force", is_flag=True, help="Overwrite an existing -o FILE (or a RUN_DIR/report.html of yours).")
@threshold_options
@json_option(help="Print one JSON object (the page's path and the run directory) instead of the line.")
def report(run_dir, out, force, straggler_pct, straggler_steps, memory_pct, as_json):
    """One self-contained HTML page for a run of `smplan execute`: loss (and validation loss),
    the learning rate, step time against the plan's prediction, memory per rank and the gradient-norm heatmap (blocks x steps),
    with the same warnings as `smplan monitor`. Works while the run is still going.

    \b
      smplan report runs/demo -o demo.html
    """
    from pathlib import Path

    from smplan.monitor import Thresholds, load_run, report_path_problem, write_run_report
    from smplan.monitor.report import is_run_report

    run = load_run(run_dir)  # first: a wrong RUN_DIR is named as such, not as -o's folder
    target = out or Path(run_dir) / "report.html"
    problem = report_path_problem(target)  # before --force: no flag makes a run's own file the page's
    if problem:
        raise UserError(problem)
    if out and Path(out).is_file() and not force:
        raise UserError(f"{out} exists; pass --force to overwrite it, or choose another -o")
    if not out and target.is_file() and not force and not is_run_report(target):  # not a page of ours
        raise UserError(f"{target} exists and is not a run report smplan wrote; pass --force to overwrite it, "
                        "or choose another -o")
    check_can_write(str(target), "-o/--output")
    path = write_run_report(run, target, Thresholds(straggler_pct, straggler_steps, memory_pct))
    if as_json:
        echo_json({"report": str(path), "run_dir": str(run_dir)})
    else:
        click.echo(f"report: {path}")
