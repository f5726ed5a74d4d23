"""Run a plan for real: DeviceMesh, TP, FSDP2/DDP, pipelining, checkpoints, metrics.

    from smplan.executor import ExecuteOptions, execute, resolve_plan
    plan, model_file = resolve_plan("dp=2,mbs=1,gbs=4", model="examples/gpt.py:tiny")
    execute(plan, model_file, ExecuteOptions(steps=5, out="runs/demo"))
"""

from .checkpoint import CheckpointMismatchError
from .config import RunConfig, fingerprint
from .launch import (
    LaunchError,
    launch_local,
    sbatch_script,
    slurm_time_limit,
    write_sbatch,
)
from .mesh import MeshError, ParallelDims
from .run import ExecuteOptions, ExecuteResult, check_this_machine, execute, prepare, resolve_plan
from .validate import PlanMismatchError, validate_plan

__all__ = [
    "CheckpointMismatchError",
    "ExecuteOptions",
    "ExecuteResult",
    "LaunchError",
    "MeshError",
    "ParallelDims",
    "PlanMismatchError",
    "RunConfig",
    "check_this_machine",
    "execute",
    "fingerprint",
    "launch_local",
    "prepare",
    "resolve_plan",
    "sbatch_script",
    "slurm_time_limit",
    "validate_plan",
    "write_sbatch",
]
