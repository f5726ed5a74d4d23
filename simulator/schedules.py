"""Pipeline schedules as task graphs: per pipeline rank, the ordered list of its tasks.

A task is (kind, chunk, microbatch) with kind "F" (forward) or "B" (backward). The graph's
edges are implied: F(c, j) needs F(c-1, j) (an activation send); B(c, j) needs B(c+1, j)
(a gradient send), and on the last chunk B(C-1, j) needs F(C-1, j) on the same rank.
Chunk c runs on rank c % pp (Narayanan et al. 2021 interleaving; `PlanCosts.device_stage`).
"""

from __future__ import annotations

from typing import NamedTuple

SCHEDULES = ("gpipe", "1f1b", "interleaved")


class Task(NamedTuple):
    kind: str  # "F" or "B"
    chunk: int  # model chunk (pipeline stage, or virtual stage under interleaving)
    mb: int  # micro-batch


class ScheduleError(ValueError):
    """A schedule that cannot be built from the given sizes; the message says what to change."""


def device_orders(schedule: str, pp: int, m: int, v: int = 1) -> list[list[Task]]:
    """Per pipeline rank, its tasks in execution order."""
    if pp < 1 or m < 1 or v < 1:
        raise ScheduleError(f"pp, micro-batches and v must be >= 1, got pp={pp}, m={m}, v={v}")
    if schedule == "gpipe":
        _need_v1(schedule, v)
        return [gpipe(d, pp, m) for d in range(pp)]
    if schedule == "1f1b":
        _need_v1(schedule, v)
        return [one_f_one_b(d, pp, m) for d in range(pp)]
    if schedule == "interleaved":
        if v == 1:
            return [one_f_one_b(d, pp, m) for d in range(pp)]
        if m % pp:
            raise ScheduleError(
                f"the interleaved schedule needs micro-batches ({m}) divisible by pp={pp}; change gbs or mbs"
            )
        return [interleaved(d, pp, m, v) for d in range(pp)]
    raise ScheduleError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")


def _need_v1(schedule: str, v: int) -> None:
    if v != 1:
        raise ScheduleError(f"v={v} needs schedule=interleaved, not {schedule}")


def gpipe(d: int, pp: int, m: int) -> list[Task]:
    """GPipe (Huang et al. 2019): all forwards, then all backwards (torch ScheduleGPipe order)."""
    return [Task("F", d, j) for j in range(m)] + [Task("B", d, j) for j in range(m)]


def one_f_one_b(d: int, pp: int, m: int) -> list[Task]:
    """1F1B with flush (PipeDream-Flush, Narayanan et al. 2021): pp-d-1 warm-up forwards."""
    warmup = min(pp - d - 1, m)
    order = [Task("F", d, j) for j in range(warmup)]
    for j in range(m - warmup):
        order.append(Task("F", d, warmup + j))
        order.append(Task("B", d, j))
    order += [Task("B", d, j) for j in range(m - warmup, m)]
    return order


def interleaved(d: int, pp: int, m: int, v: int) -> list[Task]:
    """Megatron-LM's interleaved 1F1B (schedules.forward_backward_pipelining_with_interleaving).

    Virtual micro-batch k runs model chunk ((k // pp) % v) of micro-batch
    (k // (pp*v)) * pp + k % pp; backwards take the chunks in reverse. Warm-up holds
    (pp - d - 1) * 2 + (v - 1) * pp forwards.
    """
    total = m * v

    def task(kind: str, k: int) -> Task:
        local = (k % (pp * v)) // pp
        if kind == "B":
            local = v - 1 - local
        mb = (k // (pp * v)) * pp + k % pp
        return Task(kind, local * pp + d, mb)

    warmup = total if m == pp else min((pp - d - 1) * 2 + (v - 1) * pp, total)
    order = [task("F", k) for k in range(warmup)]
    for k in range(total - warmup):
        order.append(task("F", warmup + k))
        order.append(task("B", k))
    order += [task("B", k) for k in range(total - warmup, total)]
    return order


def last_backward_index(order: list[Task]) -> dict[int, int]:
    """For each chunk of a rank, the position of its final backward (its gradients are then complete)."""
    out: dict[int, int] = {}
    for i, t in enumerate(order):
        if t.kind == "B":
            out[t.chunk] = i
    return out


def first_forward_index(order: list[Task]) -> dict[int, int]:
    out: dict[int, int] = {}
    for i, t in enumerate(order):
        if t.kind == "F" and t.chunk not in out:
            out[t.chunk] = i
    return out
