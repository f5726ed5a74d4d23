"""`--follow`: re-read the run directory and redraw until the run has finished or stopped."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from .rundir import RunData, RunDirError, load_run, read_stopped


def follow(run_dir, show: Callable[[RunData | None], None], interval_s: float = 2.0,
           max_updates: int | None = None, sleep: Callable[[float], None] = time.sleep) -> RunData | None:
    """Call `show` with the latest RunData every `interval_s` (None while the run has not
    written its first step) until summary.json appears or the launcher records that the run
    stopped (failed, interrupted); returns the last RunData."""
    run = None
    updates = 0
    while True:
        try:
            run = load_run(run_dir)
        except RunDirError:
            if not Path(run_dir).is_dir() or read_stopped(run_dir) is not None:
                raise  # a missing directory will not appear by waiting, nor steps of a stopped run
            run = None
        show(run)
        updates += 1
        if (run is not None and run.ended) or (max_updates is not None and updates >= max_updates):
            return run
        sleep(interval_s)

