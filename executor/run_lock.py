"""One `smplan execute` at a time per run directory.

Two launches into one folder would both resume from its checkpoint, append to one
metrics.jsonl and race on the next checkpoint's rename. A launch holds an advisory lock
(flock(2), Linux man-pages) on RUN_DIR/.smplan.lock while it prepares and runs: the kernel
drops it when the process ends, however it ends, so a crash leaves no stale lock. The file
names the holder for the error line; the holder removes it as it ends, still holding the lock,
so that a folder keeps nothing of a launch that was refused or has finished. (A launch that
opened the file just before that unlink could then lock the removed inode beside a later one:
three launches into one folder within the same instant, which this does not guard against.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from .validate import PlanMismatchError

LOCK_FILE = ".smplan.lock"
# The lock of a folder a run saves checkpoints into: a file of its own, so that a run whose
# --checkpoint-dir is its -o folder takes both, and `monitor` reads no run into a checkpoint folder.
CHECKPOINT_LOCK_FILE = ".smplan-checkpoints.lock"
# What flock(2) returns on a file system that does not offer it (Lustre mounted without
# -o flock: ENOSYS; some NFS set-ups: ENOLCK, EOPNOTSUPP): the run goes on unlocked.
NO_LOCKING = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return f" ({text})" if text else ""


# `running_launch` (smplan export) holds a shared lock for the moment it asks: a launch that
# meets it retries this long before it calls the folder in use (the probe takes microseconds).
PROBE_GRACE_S = 0.2


def _lock_exclusive(fd: int) -> None:
    """flock(LOCK_EX) without blocking on a launch, but past a running_launch probe's shared lock."""
    deadline = time.monotonic() + PROBE_GRACE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


@contextlib.contextmanager
def holding_run_dir(out: str | Path, option: str = "-o/--output", lock_file: str = LOCK_FILE) -> Iterator[bool]:
    """Hold RUN_DIR's lock for the block (yields True; False where the file system offers no
    locking), or raise PlanMismatchError naming the launch that holds it. A folder this call
    created and that holds nothing else at the end (the run was refused before writing
    anything) is removed again, while the lock is still held. `option` and `lock_file`: the
    flag that named the folder and its lock's file (the folder a run saves checkpoints into is
    held too, under CHECKPOINT_LOCK_FILE: two runs saving into one resumed from each other's
    steps and replaced them)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PlanMismatchError(f"{out} is a file; pass a folder to {option}")
    created = not out.exists()
    path = out / lock_file
    for attempt in range(2):  # a refused launch that made the folder may remove it between the two calls
        out.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            break
        except FileNotFoundError:
            if attempt:
                raise
    try:
        try:
            _lock_exclusive(fd)
        except BlockingIOError:
            raise PlanMismatchError(
                f"{out} is in use by another `smplan execute`{_holder(fd)}; wait for it to end"
                f"{f' (smplan monitor {out})' if option == '-o/--output' else ''}, stop it, or pass another {option}"
            ) from None
        except OSError as err:
            if err.errno not in NO_LOCKING:
                raise
            yield False
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"
                  .encode(), 0)
        try:
            yield True
        finally:
            # still holding the lock: a launch refused meanwhile has not touched the folder
            with contextlib.suppress(OSError):
                path.unlink()
                if created and not any(out.iterdir()):
                    out.rmdir()
    finally:
        os.close(fd)  # releases the lock


def running_launch(run_dir: str | Path) -> str | None:
    """Who is still training RUN_DIR ("pid 123 on host, since ..."), or None when no launch is.

    `smplan execute` holds an flock on RUN_DIR/.smplan.lock while it runs (executor/run_lock.py)
    and the kernel drops it however the launcher ends, so a launcher killed with SIGKILL leaves a
    file but no lock. A shared lock that cannot be had means a launch holds it; taken, it is
    released at once and the file left as it was. Where the file system offers no locking, the
    pid the file names is asked instead (on this host only)."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None  # no launch ever held it, or the last one ended and removed it
    try:
        holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return holder or "a launch of smplan execute"
        except OSError as err:
            if err.errno not in NO_LOCKING:
                raise
            return holder if _pid_alive_here(holder) else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def abandoned_launch(run_dir: str | Path) -> str | None:
    """The launch that held RUN_DIR's lock on this host and ended without removing its file (a
    launcher killed by SIGKILL, which records nothing), or None. Only this host's: another host's
    lock may not show here (a file system without cross-host flock), so it proves nothing."""
    path = Path(run_dir) / LOCK_FILE
    try:
        holder = path.read_text(errors="replace").strip()
    except OSError:
        return None
    return holder if _pid_here(holder) is not None and running_launch(run_dir) is None else None


def forget_abandoned_lock(run_dir: str | Path) -> None:
    """Remove the lock file a killed launch on this host left in RUN_DIR (`abandoned_launch`), for
    a launch that takes no lock (nodes sharing the folder): `monitor` would read the new run as
    that abandoned one."""
    if abandoned_launch(run_dir):
        with contextlib.suppress(OSError):
            (Path(run_dir) / LOCK_FILE).unlink()


def _pid_here(holder: str) -> int | None:
    """The pid of the lock file's "pid N on HOST, since ..." where HOST is this one, else None."""
    words = holder.replace(",", " ").split()
    if len(words) < 4 or words[0] != "pid" or not words[1].isdigit() or words[3] != socket.gethostname():
        return None
    return int(words[1])


def _pid_alive_here(holder: str) -> bool:
    """Whether the lock file's "pid N on HOST, ..." names a live process of this host."""
    pid = _pid_here(holder)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True
