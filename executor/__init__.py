"""Run a plan for real: DeviceMesh, TP, FSDP2/DDP, pipelining, checkpoints, metrics.

    from smplan.executor import ExecuteOptions, execute, resolve_plan
    plan, model_file = resolve_plan("dp=2,mbs=1,gbs=4", model="examples/gpt.py:tiny")
    execute(plan, model_file, ExecuteOptions(steps=5, out="runs/demo"))

The names below load on first use (PEP 562 module __getattr__): most of the executor imports
torch (2.2 s on 2 cores), and `smplan execute --help` only needs constants of its torch-free
modules (recipe.py, config.py).
"""

from __future__ import annotations

import importlib

# public name -> the submodule that defines it
_EXPORTS = {
    "CheckpointMismatchError": "checkpoint",
    "RunConfig": "config",
    "fingerprint": "config",
    "LaunchError": "launch",
    "launch_local": "launch",
    "sbatch_script": "launch",
    "slurm_time_limit": "launch",
    "write_sbatch": "launch",
    "MeshError": "mesh",
    "ParallelDims": "mesh",
    "ExecuteOptions": "run",
    "ExecuteResult": "run",
    "check_this_machine": "run",
    "execute": "run",
    "prepare": "run",
    "resolve_plan": "run",
    "PlanMismatchError": "validate",
    "validate_plan": "validate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
