"""`--follow`: re-read the run directory and redraw until the run has finished or stopped."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from smplan.executor.run_lock import abandoned_launch

from .rundir import RunData, RunDirError, load_run, read_stopped

# `execute` creates its run directory a second or two after it starts (interpreter start-up,
# imports): `monitor --follow` started beside it waits this long for the folder to appear; a
# mistyped path is an error after it.
APPEAR_WAIT_S = 30.0


def follow(run_dir, show: Callable[[RunData | None], None], interval_s: float = 2.0,
           max_updates: int | None = None, sleep: Callable[[float], None] = time.sleep) -> RunData | None:
    """Call `show` with the latest RunData every `interval_s` (None while the run has not
    written its first step, or its folder not appeared, for up to APPEAR_WAIT_S) until
    summary.json appears or the launcher records that the run stopped (failed,
    interrupted); returns the last RunData."""
    run = None
    updates = 0
    while True:
        try:
            run = load_run(run_dir)
        except RunDirError:
            missing = not Path(run_dir).is_dir()
            if missing and updates * interval_s >= APPEAR_WAIT_S:  # no run started there after all
                raise RunDirError(f"run directory {run_dir} did not appear in {APPEAR_WAIT_S:g} s of waiting; pass the "
                                  "-o/--output folder of a running `smplan execute`") from None
            if not missing and read_stopped(run_dir) is not None:
                raise  # a stopped run writes no more steps
            gone = None if missing else abandoned_launch(run_dir)
            if gone:  # its launcher was killed before the first step: none will come
                raise RunDirError(f"{run_dir} holds no step, and its launch ({gone}) is gone without a record "
                                  "(killed before the first step?): run `smplan execute` with -o this folder again") from None
            run = None
        show(run)
        updates += 1
        if (run is not None and run.ended) or (max_updates is not None and updates >= max_updates):
            return run
        sleep(interval_s)

