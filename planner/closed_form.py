"""Closed-form step figures of a plan's per-stage costs: PlanCosts -> Figures.

The pipeline's critical path per schedule, each device's tail after it drains (exposed DP
communication and the optimizer), the step's breakdown, and memory per device. The simulator
equals these with contention off (tests/simulator); `smplan.planner.cost_model` fills the
PlanCosts, and the ILP (smplan.planner.ilp) minimises the same expressions.
"""

from __future__ import annotations

from .costs import PlanCosts
from .plan import Figures


def pipeline_time_s(costs: PlanCosts) -> float:
    """Time until the last backward ends.

    1F1B and GPipe (critical path of a linear pipeline with uneven stages, Li et al. 2022
    "AMP" eq. 2; = (m + p - 1)(t_f + t_b) for uniform stages):
        T = sum_c (f_c + b_c) + 2 sum_c s_c + (m - 1) max_c (f_c + b_c + s_c + s_{c-1})
    Interleaved with v chunks per device (Narayanan et al. 2021, bubble (p-1)/v):
        T = m max_d sum_{c on d} (f_c + b_c + s_c + s_{c-1}) + (p-1)/v max_d W_d + 2 sum_{c<p-1} s_c
    with W_d = sum_{c on d} (f_c + b_c). s_c is chunk c's send (0 for the last chunk); in
    the steady state every micro-batch waits for its sends (Megatron's blocking p2p).
    """
    st, m, p, v = costs.stages, costs.num_microbatches, costs.pp, costs.virtual_stages
    sends = [s.send_s for s in st]
    cycle = [s.forward_s + s.backward_s + sends[c] + (sends[c - 1] if c else 0.0) for c, s in enumerate(st)]
    if costs.schedule == "interleaved":
        dev_cycle = [sum(cycle[c] for c in range(d, len(st), p)) for d in range(p)]
        dev_work = [sum(st[c].forward_s + st[c].backward_s for c in range(d, len(st), p)) for d in range(p)]
        return m * max(dev_cycle) + (p - 1) / v * max(dev_work) + 2.0 * sum(sends[: p - 1])
    return sum(s.forward_s + s.backward_s for s in st) + 2.0 * sum(sends) + (m - 1) * max(cycle)


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

    step = T_pipe + max_d (exposed_dp_d + optimizer_d), see `pipeline_time_s` and
    `device_tail_s`.
    """
    st, m, p = costs.stages, costs.num_microbatches, costs.pp
    t_pipe = pipeline_time_s(costs)
    tails = [device_tail_s(costs, d) for d in range(p)]
    crit = max(range(p), key=lambda d: sum(tails[d]))
    step = t_pipe + sum(tails[crit])
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
        "pp_p2p": min(p2p, max(0.0, t_pipe - busy)),
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
