"""Watching a run of `smplan execute`: status, stragglers, terminal view, HTML report.

    from smplan.monitor import load_run, run_status
    status = run_status(load_run("runs/demo"))   # the dict `smplan monitor --json` prints
    status["stragglers"]                          # [{"rank": 1, "excess_pct": 75.0, ...}]
"""

from .follow import follow
from .report import render_run_html, report_path_problem, write_run_report
from .rundir import RunData, RunDirError, load_run, read_jsonl
from .sparkline import sparkline
from .status import Thresholds, run_status
from .stragglers import Straggler, find_stragglers, memory_over_prediction, own_step_times
from .view import render_status, skipped_note

__all__ = [
    "RunData",
    "RunDirError",
    "Straggler",
    "Thresholds",
    "find_stragglers",
    "follow",
    "load_run",
    "memory_over_prediction",
    "own_step_times",
    "read_jsonl",
    "render_run_html",
    "render_status",
    "report_path_problem",
    "run_status",
    "skipped_note",
    "sparkline",
    "write_run_report",
]
