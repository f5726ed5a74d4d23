"""The gloo group of a spawned multi-process test worker, left the way executor/worker.py leaves it."""

import contextlib
import os
import sys

import torch.distributed as dist


@contextlib.contextmanager
def gloo_group(init_file: str, rank: int, world: int):
    """Start a gloo group; on success every rank meets at a barrier and the process leaves at once
    (os._exit(0)): destroying gloo's group or the interpreter's teardown can std::terminate on a
    C++ thread ("terminate called without an active exception", SIGABRT; seen with 2 ranks on 2
    busy cores, as executor/worker.py notes). On failure the group is destroyed and the error
    propagates, so the spawning test reports it."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        yield
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
