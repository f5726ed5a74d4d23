"""The gloo group of a spawned multi-process test worker, left the way executor/worker.py leaves it."""

import contextlib

import torch.distributed as dist
from smplan.executor.worker import leave_at_once


@contextlib.contextmanager
def gloo_group(init_file: str, rank: int, world: int):
    """Start a gloo group; on success every rank meets at a barrier and the process leaves at once
    (executor.worker.leave_at_once: gloo's teardown can SIGABRT a rank). On failure the group is
    destroyed and the error propagates, so the spawning test reports it."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        yield
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_at_once()
