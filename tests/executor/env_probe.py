"""What a process forked from the launcher's fork server sees (tests/executor/test_fork_server.py):
a module of its own, so that the forked process unpickles it without importing torch."""

import multiprocessing
import os


def _read_env(name: str, queue) -> None:
    queue.put(os.environ.get(name))


def seen_by_a_forked_process(name: str) -> str | None:
    """Environment variable `name` in a process the fork server forks now."""
    ctx = multiprocessing.get_context("forkserver")
    queue = ctx.SimpleQueue()
    process = ctx.Process(target=_read_env, args=(name, queue))
    process.start()
    process.join(60)
    return queue.get()
