"""Details of the recommended point: its pipeline timeline, goodput curves, sensitivity."""

from __future__ import annotations

from smplan.hwprofiles import Cluster
from smplan.planner import ModelProfile, Plan

from .point import simulate
from .question import Question
from .run import goodput_curves

# Simulator event names (simulator.SimEvent.name) -> the report's task kinds.
EVENT_KINDS = {
    "F": "forward",
    "R": "recompute",
    "B": "backward",
    "send-act": "send",
    "send-grad": "send",
    "dp-reduce": "dp_comm",
    "dp-gather": "dp_comm",
    # ZeRO-3 / FSDP's per-layer collectives run on the DP group's links, under the compute
    "zero-gather": "dp_comm",
    "zero-reduce": "dp_comm",
    "ep-a2a": "ep_comm",
    "cp-comm": "cp_comm",
    "optimizer": "optimizer",
}
MAX_GANTT_TASKS = 6000  # beyond this the chart is a solid block anyway; keep the first ones


def gantt(point_id: int, plan: Plan, profile: ModelProfile, cluster: Cluster) -> dict:
    """The simulated step's events as task records (one row per pipeline rank)."""
    figures, _, result = simulate(plan, profile, cluster, record_events=True)
    tasks = []
    for ev in sorted(result.events, key=lambda e: (e.start, e.device)):
        kind = EVENT_KINDS.get(ev.name, ev.name)
        # The recompute slice sits inside its backward event; draw it over it, not twice.
        tasks.append({"stage": int(ev.device), "kind": kind, "microbatch": int(ev.mb) if ev.mb >= 0 else None,
                      "start_s": float(ev.start), "end_s": float(ev.end)})
    return {"point": point_id, "step_time_s": figures["step_time_s"], "stages": plan.pp,
            "tasks": tasks[:MAX_GANTT_TASKS], "truncated": len(tasks) > MAX_GANTT_TASKS}


def sensitivity_keys(cluster: Cluster, dtype: str) -> list[str]:
    keys = [f"gpu.peak_tflops.{dtype}", "gpu.memory_bandwidth_gbps", "intra_node.bandwidth_gbps",
            "inter_node.bandwidth_gbps", "intra_node.latency_us", "inter_node.latency_us"]
    if cluster.get("efficiency.host_overhead_us_per_layer"):
        keys.append("efficiency.host_overhead_us_per_layer")
    return keys


def sensitivity(point_id: int, plan: Plan, profile: ModelProfile, cluster: Cluster, delta: float) -> dict:
    """Step time of the same plan with each hardware figure scaled by 1 - delta and 1 + delta."""
    base, _, _ = simulate(plan, profile, cluster)
    items = []
    for key in sensitivity_keys(cluster, plan.dtype):
        value = float(cluster.get(key))
        times = []
        for factor in (1.0 - delta, 1.0 + delta):
            changed = cluster.with_overrides({key: value * factor})
            times.append(simulate(plan, profile, changed)[0]["step_time_s"])
        items.append({"key": key, "low_step_time_s": times[0], "high_step_time_s": times[1]})
    return {"point": point_id, "delta": delta, "base_step_time_s": base["step_time_s"], "items": items}


def details(q: Question, point: dict, plan: Plan, profile: ModelProfile, cluster: Cluster) -> dict:
    out = {"gantt": None, "goodput": None, "sensitivity": None}
    out["gantt"] = gantt(point["id"], plan, profile, cluster)
    out["sensitivity"] = sensitivity(point["id"], plan, profile, cluster, q.sensitivity_delta)
    if q.timed and point.get("run"):
        out["goodput"] = goodput_curves(q, point, plan, cluster)
    return out
