"""A word on long work: said once a wait has lasted long enough to need one (profiling a model,
a failure sweep), and never for quick work, whose output then stands alone."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

PROGRESS_AFTER_S = 1.0  # chosen: below it the wait needs no word


@contextlib.contextmanager
def said_after(say: Callable[[str], None] | None, message: str):
    """`say(message)` once, if the block is still running after PROGRESS_AFTER_S (read when it
    starts); nothing with `say` None. The timer is a daemon and is cancelled when the block ends."""
    if say is None:
        yield
        return
    timer = threading.Timer(PROGRESS_AFTER_S, say, (message,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
