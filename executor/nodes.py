"""How a plan's processes spread over nodes: the Slurm job's node count, and a count torchrun
can split the processes over evenly (each node runs as many)."""

from __future__ import annotations

from pathlib import Path

from smplan.planner import Plan
from smplan.planner.plan import is_plan_file_name

from .validate import PlanMismatchError


def names_plan_file(plan_arg: str) -> bool:
    """Whether PLAN names a plan file, not inline keys."""
    return is_plan_file_name(plan_arg) or Path(plan_arg).is_file()


# The most GPUs a node holds in any bundled hardware profile (hwprofiles/*.toml: 8, an HGX/DGX
# node): an inline plan names no hardware, so its Slurm job puts no more than this on one node
# unless --nnodes or --nproc-per-node says how.
INLINE_MAX_PROCS_PER_NODE = 8


def slurm_nnodes(plan_arg: str, plan: Plan, nnodes: int | None, nproc_per_node: int | None) -> int:
    """The nodes a --launcher slurm job spans: --nnodes as given; else the nodes --nproc-per-node's
    processes fill; else the plan file's nodes. An inline plan of more than
    INLINE_MAX_PROCS_PER_NODE processes is refused without either: one node of them would not schedule."""
    if nnodes is not None:
        return nnodes
    if nproc_per_node:
        return -(-plan.world_size // nproc_per_node)
    world = plan.world_size
    if names_plan_file(plan_arg) or world <= INLINE_MAX_PROCS_PER_NODE:
        return plan.nodes
    fits = next(n for n in range(1, world + 1) if world % n == 0 and world // n <= INLINE_MAX_PROCS_PER_NODE)
    raise PlanMismatchError(
        f"an inline plan names no hardware, and its {world} processes are more than the {INLINE_MAX_PROCS_PER_NODE} "
        f"GPUs of the usual node: pass --nnodes N (e.g. --nnodes {fits}, {world // fits} per node), or a plan "
        "file made for your nodes (smplan plan MODEL --hw NAME --nodes N -o plan.json)")


def check_even_split(world: int, nnodes: int) -> None:
    """torchrun starts as many processes on every node: refuse a node count that does not divide
    the plan's processes (validate_plan would say only that the totals differ), naming the nearest that do."""
    if world % nnodes == 0:
        return
    divisors = [n for n in range(1, world + 1) if world % n == 0]
    below = max(n for n in divisors if n < nnodes)
    above = min((n for n in divisors if n > nnodes), default=None)
    fits = f"{below} or {above}" if above else str(below)
    raise PlanMismatchError(f"the plan's {world} processes do not split evenly over {nnodes} nodes (each runs as "
                            f"many): use --nnodes {fits}")
