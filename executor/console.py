"""The console a run writes to: local rank 0's stdout (the progress lines) and the agent's copy of
its stderr. Neither may stop the run when the reader of the console leaves (`smplan execute ... |
head -5`): training goes on, and everything it records is in files. The agent's copy drops what
the launcher says better itself (`agent_console`)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from collections.abc import Callable
from typing import TextIO

# What a worker's last line starts with when it stops on an error it words itself (worker.py): the
# launcher reports the failed rank's line once, after the run (failure.failure_report).
WORKER_ERROR = "error: "
# torch's elastic agent prefixes each line of a worker's stderr it copies to the console with
# "[<role><local rank>]:" (torch/distributed/elastic/multiprocessing/tail_log.py, TailLog.start;
# the role is LaunchConfig.role, "default_role").
_AGENT_PREFIX = re.compile(r"^\[default_role\d+\]:")


class Console(io.TextIOBase):
    """`stream` whose writes pass through `edit` (None: dropped) and never raise for a closed pipe:
    once its reader has left, the file descriptor is pointed at /dev/null and the writes go on there."""

    def __init__(self, stream: TextIO, edit: Callable[[str], str | None] = lambda text: text):
        self._stream, self._edit = stream, edit

    def write(self, text: str) -> int:
        shown = self._edit(text)
        if shown:
            self._quietly(lambda: self._stream.write(shown))
        return len(text)

    def flush(self) -> None:
        self._quietly(self._stream.flush)

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def writable(self) -> bool:
        return True

    def _quietly(self, call) -> None:
        try:
            call()
        except BrokenPipeError:  # the reader left: what is still buffered, and all that follows, goes nowhere
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self._stream.fileno())
                os.close(devnull)


def agent_line(text: str) -> str | None:
    """A line of local rank 0's stderr as the console shows it: without the agent's prefix, and
    none for the worker's closing error line (the launcher's report carries the failed rank's)."""
    copied = _AGENT_PREFIX.match(text)
    if not copied:  # the agent's own line
        return text
    text = text[copied.end():]
    return None if text.startswith(WORKER_ERROR) else text


@contextlib.contextmanager
def agent_console():
    """sys.stderr, while the agent starts and watches the workers, as `agent_line` edits it (its
    copy of local rank 0's stderr goes to the sys.stderr of the moment the workers start)."""
    with contextlib.redirect_stderr(Console(sys.stderr, agent_line)):
        yield
