"""Closed-form step figures of a plan's per-stage costs: PlanCosts -> Figures.

The schedule replayed with the stages' seconds (each device's last pass), each device's tail
after it drains (exposed DP communication and the optimizer), the step's breakdown, and memory
per device. The step simulation equals the pipeline for any stages with contention off
(tests/simulator); `smplan.planner.cost_model` fills the PlanCosts. The ILP (smplan.planner.ilp)
minimises the textbook formulas that approximate the replay, linear in the blocks per stage, and
the search then polishes its partition under this closed form (solve.polish).
"""

from __future__ import annotations

from .costs import PlanCosts
from .plan import Figures
from .schedules import task_order

# A schedule's event times grow by the same seconds every round (pp micro-batches interleaved, one
# otherwise) once its warm-up has passed: over 300 random uneven pipelines (pp 2-16, v 1-5, sends,
# backward/forward 1-3), extrapolating from 6 rounds matched replaying 40 within 1e-13, from 4
# within 2.6%. Longer schedules are replayed this far and extrapolated, so a plan of 2^40
# micro-batches costs what one of 8 rounds does.
REPLAYED_ROUNDS = 8


def compute_end_s(costs: PlanCosts) -> list[float]:
    """When each pipeline device's last forward or backward ends.

    The schedule's task graph (schedules.task_order) replayed with the stages' seconds: a task
    starts when its device is free and its input has arrived, and holds its device for its pass
    and its own send (Megatron's blocking p2p; s_c is chunk c's activation send and the
    gradient of chunk c+1 comes back over the same size). This is the longest path of the
    graph, the max-plus recurrence the step simulation equals with contention off; for
    identical stages without sends it is (m + p - 1)(t_f + t_b) for 1F1B and GPipe, and
    m t + (p - 1)/v t (t: a device's chunks' t_f + t_b) for interleaving (Narayanan et al.
    2021, section 2.2.2). For uneven stages the AMP critical path (Li et al. 2022, eq. 2) and
    the bubble formula only approximate it (tests/simulator/test_step.py holds the replay
    against the simulation on random uneven stages, where they fail).
    """
    m, p, v = costs.num_microbatches, costs.pp, costs.virtual_stages
    period = _period(costs.schedule, p, v)
    replayed = REPLAYED_ROUNDS * p
    if m <= replayed:
        return _replay(costs, m)
    # periodic from here on: each end moves by its last round's increment every round
    last, before = _replay(costs, replayed), _replay(costs, replayed - period)
    rounds = (m - replayed) / period
    return [a + rounds * (a - b) for a, b in zip(last, before, strict=True)]


def _period(schedule: str, pp: int, v: int) -> int:
    """Micro-batches a round: pp interleaved, one otherwise."""
    return pp if schedule == "interleaved" and v > 1 else 1


def replayed_microbatches(m: int, pp: int, v: int, schedule: str) -> int:
    """Micro-batches `compute_end_s` replays for a schedule of m (what one estimate costs)."""
    replayed = REPLAYED_ROUNDS * pp
    return m if m <= replayed else 2 * replayed - _period(schedule, pp, v)


def _replay(costs: PlanCosts, m: int) -> list[float]:
    st, p = costs.stages, costs.pp
    order = task_order(costs.schedule, p, m, costs.virtual_stages)
    last = len(st) - 1
    seconds = [s.forward_s + (s.send_s if c < last else 0.0) for c, s in enumerate(st)]
    seconds += [s.backward_s + (st[c - 1].send_s if c else 0.0) for c, s in enumerate(st)]
    arrived = [0.0] * order.slots
    free = [0.0] * p
    for d, k, source, target in zip(order.device, order.duration, order.source, order.target, strict=True):
        t = free[d]
        if arrived[source] > t:
            t = arrived[source]
        t += seconds[k]
        arrived[target] = t
        free[d] = t
    return free


def pipeline_time_s(costs: PlanCosts) -> float:
    """Time until the last backward ends (`compute_end_s`)."""
    return max(compute_end_s(costs))


def device_tail_s(costs: PlanCosts, device: int) -> tuple[float, float]:
    """(exposed DP communication, optimizer) seconds of `device` after the pipeline drains.

    With `dp_overlappable` each chunk's DP collectives overlap the backward passes from its own
    last one on (one chunk, 1F1B: exposed = max(0, dp_comm - backward)); else all of it is exposed.
    Under ZeRO-2 that backward's own gradient reduce-scatters hold the same links, so only the
    rest of the pass is a window for the step's parameter all-gather.
    """
    st, p = costs.stages, costs.pp
    mine = [st[c] for c in range(device, len(st), p)]
    optimizer = sum(s.optimizer_s for s in mine)
    if not all(s.dp_overlappable for s in mine):
        return sum(s.dp_comm_s for s in mine), optimizer
    # Each chunk's reduction starts at its own last backward (Megatron-Core's per-chunk
    # grad_sync_func; the simulator's _queue_reduce), one after another on the DP stream. In the
    # interleaved cool-down the device runs its chunks' last backwards from the last model chunk
    # down, p micro-batches each (Narayanan et al. SC21, section 2.2.2), so chunk k's begins
    # b_k + p * sum(b_j, j < k) before the device's compute ends (no idle counted: an upper bound
    # on what sticks out). With one chunk this is max(0, dp - backward), as before.
    end = float("-inf")  # when the DP stream is done, in seconds after the device's compute ends
    for k in range(len(mine) - 1, -1, -1):
        s = mine[k]
        window = s.backward_s + p * sum(mine[j].backward_s for j in range(k))
        ready = -window + min(s.backward_s, s.zero_reduce_s)  # under ZeRO-2 its own reduce-scatters go first
        end = max(max(end, ready) + s.dp_comm_s, -window + s.backward_s)  # no earlier than that backward
    return max(0.0, end), optimizer


def estimate_from_costs(costs: PlanCosts) -> Figures:
    """Closed-form Figures from PlanCosts (what the simulator equals with contention off).

    step = max_d (compute_end_d + exposed_dp_d + optimizer_d), see `compute_end_s` and
    `device_tail_s`: a device that drains early has that long for its tail.
    """
    st, m, p = costs.stages, costs.num_microbatches, costs.pp
    ends = compute_end_s(costs)
    tails = [device_tail_s(costs, d) for d in range(p)]
    crit = max(range(p), key=lambda d: ends[d] + sum(tails[d]))
    step = ends[crit] + sum(tails[crit])
    mine = [st[c] for c in range(crit, len(st), p)]
    busy = m * sum(s.forward_s + s.backward_s for s in mine)
    tp_comm = m * sum(s.tp_comm_forward_s + s.tp_comm_backward_s for s in mine)
    ep_comm = m * sum(s.ep_comm_forward_s + s.ep_comm_backward_s for s in mine)
    cp_comm = m * sum(s.cp_comm_forward_s + s.cp_comm_backward_s for s in mine)
    recompute = m * sum(s.recompute_s for s in mine)
    host_wait = m * sum(s.host_wait_forward_s + s.host_wait_backward_s for s in mine)
    p2p = m * sum(s.send_s + (st[c - 1].send_s if c else 0.0) for c, s in enumerate(st) if c % p == crit)
    breakdown = {"compute": busy - tp_comm - ep_comm - cp_comm - recompute - host_wait}
    if costs.waits_for_host:  # only where some pass waits for the host's launches
        breakdown["host_wait"] = host_wait
    breakdown |= {
        "recompute": recompute,
        "tp_comm": tp_comm,
        "pp_p2p": min(p2p, max(0.0, ends[crit] - busy)),
        "dp_comm_exposed": tails[crit][0],
        "optimizer": tails[crit][1],
    }
    if ep_comm or cp_comm or costs.expert_or_context_parallel:  # keys only where the plan has ep or cp
        breakdown["ep_all_to_all"] = ep_comm
        breakdown["cp_comm_exposed"] = cp_comm
    breakdown["bubble"] = max(0.0, step - sum(breakdown.values()))
    dev_mem = [_device_memory(costs, d) for d in range(p)]
    peak_dev = max(range(p), key=lambda d: dev_mem[d]["total"])
    gpus = costs.num_gpus
    peak = costs.peak_tflops_per_gpu * 1e12
    return Figures(
        step_time_s=step,
        tokens_per_s=costs.tokens_per_step / step,
        samples_per_s=costs.samples_per_step / step,
        model_tflops_per_gpu=costs.model_flops_per_step / step / gpus / 1e12,
        hardware_tflops_per_gpu=costs.hardware_flops_per_step / step / gpus / 1e12,
        mfu=costs.model_flops_per_step / step / gpus / peak,
        peak_memory_gib=dev_mem[peak_dev]["total"],
        bubble_fraction=breakdown["bubble"] / step if step else 0.0,
        breakdown=breakdown,
        usd_per_step=step * gpus * costs.usd_per_gpu_hour / 3600.0,
        memory_breakdown_gib=dev_mem[peak_dev],
    )


def _device_memory(costs: PlanCosts, device: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in range(device, len(costs.stages), costs.pp):
        mem = costs.stages[c].memory
        if mem is None:
            continue
        for k, val in mem.to_gib().items():
            out[k] = out.get(k, 0.0) + val
    out.setdefault("total", 0.0)
    out["capacity"] = costs.capacity_bytes / 2.0**30
    return out
