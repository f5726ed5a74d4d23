"""From a simulated step (RawStep) to the DESIGN.md figures and per-stage utilisation."""

from __future__ import annotations

from smplan.planner.costs import MemoryBreakdown, PlanCosts
from smplan.planner.plan import Figures

from .step import DeviceTimes, RawStep

GIB = 2.0**30


def critical_device(raw: RawStep) -> int:
    """The pipeline rank that finishes last (the lowest such rank on a tie)."""
    end = raw.step_time_s
    for d, t in enumerate(raw.devices):
        if t.end_s >= end * (1 - 1e-12):
            return d
    return 0


def breakdown(raw: RawStep, device: int | None = None, ep_or_cp: bool = False, host_wait: bool = False
              ) -> dict[str, float]:
    """Seconds of the step by kind on one rank (the critical one by default); sums to the step."""
    d = critical_device(raw) if device is None else device
    t = raw.devices[d]
    dp_exposed = max(0.0, t.dp_end_s - t.compute_end_s) + t.wait_gather_s + t.zero_wait_s
    out = {"compute": t.compute_s - t.recompute_s - t.tp_comm_s - t.ep_comm_s - t.cp_comm_s - t.zero_wait_s
                      - t.host_wait_s}
    if host_wait:  # as the closed form: the key only where some pass waits for the host
        out["host_wait"] = t.host_wait_s
    out |= {
        "recompute": t.recompute_s,
        "tp_comm": t.tp_comm_s,
        "pp_p2p": t.wait_comm_s + t.send_wait_s,
        "dp_comm_exposed": dp_exposed,
        "optimizer": t.optimizer_s,
    }
    if t.ep_comm_s or t.cp_comm_s or ep_or_cp:  # as the closed form: keys only where the plan has ep or cp
        out["ep_all_to_all"] = t.ep_comm_s
        out["cp_comm_exposed"] = t.cp_comm_s
    out["bubble"] = t.wait_bubble_s  # last, as in the closed form
    # Ranks that finish early idle until the step ends: that is bubble too.
    out["bubble"] += max(0.0, raw.step_time_s - t.end_s)
    return out


def device_memory(costs: PlanCosts) -> list[MemoryBreakdown | None]:
    """Per pipeline rank, the sum of its chunks' memory (buffers and reserve sit on one chunk)."""
    out: list[MemoryBreakdown | None] = [None] * costs.pp
    for c, st in enumerate(costs.stages):
        if st.memory is None:
            continue
        d = costs.device_stage(c)
        prev = out[d]
        if prev is None:
            out[d] = st.memory
        else:
            out[d] = MemoryBreakdown(
                *(
                    getattr(prev, f) + getattr(st.memory, f)
                    for f in MemoryBreakdown.__dataclass_fields__
                )
            )
    return out


def pass_wait_s(t: DeviceTimes) -> float:
    """Seconds the rank's GPU sat idle inside its passes for their collectives (the breakdown's
    ep_all_to_all, cp_comm_exposed and the per-unit ZeRO part of dp_comm_exposed)."""
    return t.zero_wait_s + t.ep_comm_s + t.cp_comm_s


def utilisation(raw: RawStep, node_of_stage: list[int] | None = None) -> list[dict]:
    """Per pipeline rank, fractions of the step: compute (recompute, host wait and exposed TP
    collectives included), comm_wait (`pass_wait_s`), optimizer and idle (between passes: pipeline
    bubble, p2p waits, the DP tail) sum to 1; send and dp_comm are the links' own busy time."""
    step = raw.step_time_s or 1.0
    rows = []
    for d, t in enumerate(raw.devices):
        rows.append(
            {
                "stage": d,
                "node": node_of_stage[d] if node_of_stage else None,
                "compute": (t.compute_s - pass_wait_s(t)) / step,
                "recompute": t.recompute_s / step,
                "comm_wait": pass_wait_s(t) / step,
                "send": t.send_busy_s / step,
                "dp_comm": t.dp_busy_s / step,
                "optimizer": t.optimizer_s / step,
                "idle": max(0.0, 1.0 - (t.compute_s + t.optimizer_s) / step),
                "end_s": t.end_s,
            }
        )
    return rows


# Breakdown rows and the plan degree without which they are always 0 (`shown_breakdown`).
_ROW_NEEDS = {"tp_comm": "tp", "pp_p2p": "pp", "ep_all_to_all": "ep", "cp_comm_exposed": "cp"}


def shown_breakdown(breakdown: dict[str, float], plan) -> dict[str, float]:
    """The breakdown's rows that apply to `plan` (text output; the JSON keeps every key): a row
    whose parallelism the plan lacks (tp_comm at tp=1, pp_p2p at pp=1, ep_all_to_all at ep=1,
    cp_comm_exposed at cp=1) is left out, but never one that holds time."""
    def applies(kind: str, seconds: float) -> bool:
        degree = _ROW_NEEDS.get(kind)
        return bool(seconds) or degree is None or getattr(plan, degree) > 1

    return {k: v for k, v in breakdown.items() if applies(k, v)}


def figures(raw: RawStep, costs: PlanCosts) -> Figures:
    step = raw.step_time_s
    parts = breakdown(raw, ep_or_cp=costs.expert_or_context_parallel, host_wait=costs.waits_for_host)
    memories = [m for m in device_memory(costs) if m is not None]
    fullest = max(memories, key=lambda m: m.total_bytes) if memories else None
    gpus = max(costs.num_gpus, 1)
    model_tflops = costs.model_flops_per_step / step / gpus / 1e12 if step > 0 else 0.0
    hw_tflops = costs.hardware_flops_per_step / step / gpus / 1e12 if step > 0 else 0.0
    return Figures(
        step_time_s=step,
        tokens_per_s=costs.tokens_per_step / step if step > 0 else 0.0,
        samples_per_s=costs.samples_per_step / step if step > 0 else 0.0,
        model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=hw_tflops,
        mfu=model_tflops / costs.peak_tflops_per_gpu if costs.peak_tflops_per_gpu else 0.0,
        peak_memory_gib=fullest.total_bytes / GIB if fullest else 0.0,
        bubble_fraction=parts["bubble"] / step if step > 0 else 0.0,
        breakdown=parts,
        usd_per_step=step / 3600.0 * costs.num_gpus * costs.usd_per_gpu_hour,
        memory_breakdown_gib=fullest.to_gib() if fullest else {},
    )
