"""Pipeline schedules as task graphs: per pipeline rank, the ordered list of its tasks.

A task is (kind, chunk, microbatch) with kind "F" (forward) or "B" (backward). The graph's
edges are implied: F(c, j) needs F(c-1, j) (an activation send); B(c, j) needs B(c+1, j)
(a gradient send), and on the last chunk B(C-1, j) needs F(C-1, j) on the same rank.
Chunk c runs on rank c % pp (Narayanan et al. 2021 interleaving; `PlanCosts.device_stage`).

The closed form (closed_form.py) replays these graphs with the cost model's seconds and the
step simulation (smplan.simulator) runs them in simpy, so both take one definition from here.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from .plan import SCHEDULES


class Task(NamedTuple):
    kind: str  # "F" or "B"
    chunk: int  # model chunk (pipeline stage, or virtual stage under interleaving)
    mb: int  # micro-batch


class ScheduleError(ValueError):
    """A schedule that cannot be built from the given sizes; the message says what to change."""


def check_schedule(schedule: str, pp: int, m: int, v: int = 1) -> None:
    if pp < 1 or m < 1 or v < 1:
        raise ScheduleError(f"pp, micro-batches and v must be >= 1, got pp={pp}, m={m}, v={v}")
    if schedule not in SCHEDULES:
        raise ScheduleError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if v != 1 and schedule != "interleaved":
        raise ScheduleError(f"v={v} needs schedule=interleaved, not {schedule}")
    if schedule == "interleaved" and v > 1 and m % pp:
        raise ScheduleError(
            f"the interleaved schedule needs micro-batches ({m}) divisible by pp={pp}; change gbs or mbs"
        )


def device_arrays(schedule: str, pp: int, m: int, v: int = 1) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per pipeline rank, its tasks in execution order as arrays (is_forward, chunk, micro-batch).

    GPipe (Huang et al. 2019): all forwards, then all backwards (torch ScheduleGPipe order).
    1F1B with flush (PipeDream-Flush, Narayanan et al. 2021): pp-d-1 warm-up forwards, then
    one forward and one backward in turn, then the remaining backwards.
    Interleaved 1F1B (Megatron-LM's forward_backward_pipelining_with_interleaving): the same
    over m*v virtual micro-batches, with (pp - d - 1) * 2 + (v - 1) * pp warm-up forwards (all
    of them when m == pp). Virtual micro-batch k runs model chunk ((k // pp) % v) of micro-batch
    (k // (pp*v)) * pp + k % pp; backwards take the chunks in reverse. With v = 1 that is 1F1B's
    own order (chunk d, micro-batch k).
    """
    check_schedule(schedule, pp, m, v)
    total = m * v
    out = []
    for d in range(pp):
        if schedule == "gpipe":
            forward = np.repeat([True, False], m)
            k = np.tile(np.arange(m), 2)
        else:
            interleaving = schedule == "interleaved" and v > 1
            warmup = (total if m == pp else min((pp - d - 1) * 2 + (v - 1) * pp, total)) if interleaving \
                else min(pp - d - 1, m)
            steady = total - warmup
            pair_forward = np.tile([True, False], steady)
            pair_k = np.stack([warmup + np.arange(steady), np.arange(steady)], axis=1).ravel()
            forward = np.concatenate([np.ones(warmup, bool), pair_forward, np.zeros(warmup, bool)])
            k = np.concatenate([np.arange(warmup), pair_k, np.arange(steady, total)])
        local = (k % (pp * v)) // pp
        local = np.where(forward, local, v - 1 - local)
        out.append((forward, local * pp + d, (k // (pp * v)) * pp + k % pp))
    return out


def device_orders(schedule: str, pp: int, m: int, v: int = 1) -> list[list[Task]]:
    """Per pipeline rank, its tasks in execution order."""
    return [[Task("F" if f else "B", c, j) for f, c, j in zip(fw.tolist(), ch.tolist(), mb.tolist(), strict=True)]
            for fw, ch, mb in device_arrays(schedule, pp, m, v)]


class TaskOrder(NamedTuple):
    """Every task of a schedule once, in an order that runs each after what it needs.

    Task i runs on rank `device[i]` for the seconds of `duration[i]` (c: chunk c's forward;
    C + c: its backward), reads its input's arrival time from slot `source[i]` and writes its
    output's to slot `target[i]`. Slot `slots - 2` stays 0 (a first forward's input) and
    slot `slots - 1` is never read (a first chunk's backward).
    """

    device: list[int]
    duration: list[int]
    source: list[int]
    target: list[int]
    slots: int


@functools.lru_cache(maxsize=256)
def task_order(schedule: str, pp: int, m: int, v: int = 1) -> TaskOrder:
    """The schedule's tasks in dependency order (cached: a search asks for few distinct shapes).

    Slots: c*m + j holds when F(c, j)'s activation arrives, C*m + c*m + j when B(c, j)'s
    gradient does (the last chunk's, when its own forward ends).
    """
    chunks = pp * v
    n = chunks * m
    start, sink = 2 * n, 2 * n + 1
    per_device = []
    for forward, c, j in device_arrays(schedule, pp, m, v):
        source = np.where(forward, np.where(c > 0, c * m + j, start), n + c * m + j)
        target = np.where(forward, np.where(c < chunks - 1, (c + 1) * m + j, n + c * m + j),
                          np.where(c > 0, n + (c - 1) * m + j, sink))
        per_device.append((source, target, np.where(forward, c, chunks + c)))
    # Walk the ranks in turn, each as far as its inputs are there (alternate directions: activations
    # flow to higher ranks, gradients to lower ones); the schedules never deadlock.
    lists = [(s.tolist(), t.tolist()) for s, t, _ in per_device]
    done = bytearray(2 * n + 2)
    done[start] = 1
    offsets = np.cumsum([0] + [len(s) for s, _ in lists]).tolist()
    pos, order, left, sweep = [0] * pp, [], offsets[-1], 0
    while left:
        sweep += 1
        moved = False
        for d in range(pp) if sweep % 2 else range(pp - 1, -1, -1):
            source, target = lists[d]
            i = first = pos[d]
            while i < len(source) and done[source[i]]:
                done[target[i]] = 1
                i += 1
            if i > first:
                order.extend(range(offsets[d] + first, offsets[d] + i))
                pos[d], left, moved = i, left - (i - first), True
        if not moved:
            raise ScheduleError(f"the {schedule} schedule with pp={pp}, m={m}, v={v} deadlocks")
    idx = np.array(order)
    device = np.concatenate([np.full(len(s), d) for d, (s, _) in enumerate(lists)])
    source, target, duration = (np.concatenate([p[k] for p in per_device]) for k in range(3))
    return TaskOrder(device[idx].tolist(), duration[idx].tolist(), source[idx].tolist(), target[idx].tolist(),
                     2 * n + 2)


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
