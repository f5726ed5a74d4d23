"""A synthetic points record covering every chart, with infeasible points."""

from __future__ import annotations

import copy

from smplan.report import derive

_PLAN = {"tp": 8, "pp": 2, "dp": 1, "micro_batch": 1, "global_batch": 16}


def _point(i, hw, nodes, gpu, cap, price, tps, feasible=True, tokens=1e12):
    gpus = nodes * 8
    figures = None
    run = None
    if feasible:
        step = 16 * 4096 / tps
        figures = {
            "step_time_s": step, "tokens_per_s": tps, "samples_per_s": tps / 4096,
            "model_tflops_per_gpu": 150.0, "hardware_tflops_per_gpu": 180.0, "mfu": 0.45,
            "peak_memory_gib": cap * 0.7, "bubble_fraction": 0.1,
            "breakdown": {"compute": 0.6 * step, "tp_comm": 0.15 * step, "pp_p2p": 0.05 * step,
                          "dp_comm_exposed": 0.05 * step, "bubble": 0.1 * step, "optimizer": 0.05 * step},
            "usd_per_step": step * gpus * price / 3600,
            "memory_breakdown_gib": {"weights": 10.0, "gradients": 10.0, "optimizer": 20.0,
                                     "activations": cap * 0.7 - 45, "buffers": 3.0, "reserve": 2.0,
                                     "total": cap * 0.7},
        }
        ideal = tokens / tps / 86400
        run = {"tokens": tokens, "steps": int(tokens / (16 * 4096)), "ideal_days": ideal,
               "days": ideal / 0.9, "usd": ideal / 0.9 * 24 * gpus * price, "goodput": 0.9,
               "goodput_std": 0.01, "checkpoint_interval_min": 30.0, "failures": 3.0, "seeds": 3}
    else:
        figures = {"step_time_s": 0.0, "tokens_per_s": 0.0, "samples_per_s": 0.0,
                   "model_tflops_per_gpu": 0.0, "hardware_tflops_per_gpu": 0.0, "mfu": 0.0,
                   "peak_memory_gib": cap * 1.4 + 3.0, "bubble_fraction": 0.0, "breakdown": {},
                   "usd_per_step": 0.0,
                   "memory_breakdown_gib": {"weights": cap * 0.5, "gradients": cap * 0.5,
                                            "optimizer": cap * 0.3, "activations": cap * 0.1,
                                            "buffers": 1.0, "reserve": 2.0, "total": cap * 1.4 + 3.0}}
    return {
        "id": i, "label": f"nodes={nodes} hw={hw}", "settings": {"nodes": nodes, "hw": hw},
        "hw": hw, "gpu": gpu, "nodes": nodes, "num_gpus": gpus, "memory_capacity_gib": cap,
        "usd_per_gpu_hour": price, "feasible": feasible,
        "reason": None if feasible else f"needs {cap * 1.5:.0f} GiB per GPU but {gpu} has {cap:.0f} GiB",
        "plan": dict(_PLAN) if feasible else None,
        "plan_label": "tp=8 pp=2 dp=1 mbs=1 gbs=16" if feasible else None,
        "plan_inline": "tp=8,pp=2,dp=1,mbs=1,gbs=16" if feasible else None,
        "figures": figures, "run": run,
    }


def synthetic_record() -> dict:
    points = []
    specs = [("a100x8", "A100", 80.0, 1.79, 1000.0), ("h100x8", "H100", 80.0, 2.99, 2600.0)]
    i = 0
    for nodes in (2, 4, 8):
        for hw, gpu, cap, price, per_gpu in specs:
            eff = 1.0 - 0.05 * (nodes.bit_length() - 2)
            points.append(_point(i, hw, nodes, gpu, cap, price, per_gpu * nodes * 8 * eff))
            i += 1
    points.append(_point(i, "a100x8", 1, "A100", 80.0, 1.79, 0.0, feasible=False))
    tasks = []
    t_f, t_b = 0.1, 0.2
    for s in range(2):
        for m in range(4):
            start = (s + m) * t_f
            tasks.append({"stage": s, "kind": "forward", "microbatch": m, "start_s": start, "end_s": start + t_f})
            start = 1.0 + (m + 1 - s) * t_b
            tasks.append({"stage": s, "kind": "backward", "microbatch": m, "start_s": start, "end_s": start + t_b})
        tasks.append({"stage": s, "kind": "dp_comm", "microbatch": None, "start_s": 1.9, "end_s": 2.0})
    record = {
        "version": 1,
        "question": {"text": "How fast and at what cost does tiny train 1e12 tokens?", "command": "smplan whatif x",
                     "model": "examples/gpt.py:tiny", "model_args": {}, "hw": "a100x8", "nodes": None,
                     "vary": {"nodes": [1, 2, 4, 8], "hw": ["a100x8", "h100x8"]}, "tokens": 1e12, "days": None,
                     "plan": None, "checkpoint_interval_min": None},
        "points": points,
        "recommended": 5,
        "recommendation": "the cheapest point that trains within the fastest plus 10%",
        "details": {
            "gantt": {"point": 5, "step_time_s": 2.0, "stages": 2, "tasks": tasks},
            "goodput": {"point": 5, "young_daly_min": 40.0, "chosen_interval_min": 30.0, "gpu_mtbf_hours": 3e4,
                        "vs_interval": {"interval_min": [5, 10, 30, 60, 120], "goodput": [0.8, 0.87, 0.9, 0.89, 0.85],
                                        "goodput_std": [0.01, 0.01, 0.02, 0.02, 0.03]},
                        "vs_mtbf": {"gpu_mtbf_hours": [1e4, 3e4, 1e5], "goodput": [0.7, 0.85, 0.95],
                                    "goodput_std": [0.03, 0.02, 0.01]}},
            "sensitivity": {"point": 5, "delta": 0.2, "base_step_time_s": 2.0, "items": [
                {"key": "gpu.peak_tflops.bf16", "low_step_time_s": 2.4, "high_step_time_s": 1.7},
                {"key": "inter_node.bandwidth_gbps", "low_step_time_s": 2.1, "high_step_time_s": 1.95},
                {"key": "gpu.memory_bandwidth_gbps", "low_step_time_s": 2.05, "high_step_time_s": 1.97},
            ]},
        },
    }
    return derive(copy.deepcopy(record))
