"""One `smplan execute` at a time per run directory.

Two launches into one folder would both resume from its checkpoint, append to one
metrics.jsonl and race on the next checkpoint's rename. The launcher holds an advisory
lock (flock(2), Linux man-pages) on RUN_DIR/.smplan.lock while it prepares and runs: the
kernel drops it when the process ends, however it ends, so a crash leaves no stale lock.
The file stays (unlinking a lock file lets a third launcher lock a new inode while a second
still holds the old one); it names the holder for the error line.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from .validate import PlanMismatchError

LOCK_FILE = ".smplan.lock"


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return f" ({text})" if text else ""


@contextlib.contextmanager
def holding_run_dir(out: str | Path) -> Iterator[None]:
    """Hold RUN_DIR's lock for the block, or raise PlanMismatchError naming the launch that
    holds it. A folder this call created and that holds nothing else afterwards (the run was
    refused before writing anything) is removed again."""
    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PlanMismatchError(
                f"{out} is in use by another `smplan execute`{_holder(fd)}; wait for it to end (smplan monitor "
                f"{out}), stop it, or pass another -o/--output") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%H:%M:%S')}".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock
        if created and [p.name for p in out.iterdir()] == [LOCK_FILE]:
            path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                out.rmdir()
