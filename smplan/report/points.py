"""The points record: every number behind a what-if report (written as `points.json`).

Charts and the HTML page read only this record, so a notebook can rebuild any chart from
a saved `points.json`, and a test can hold each plotted series against it.

Schema (version 1; all times in seconds unless the key names another unit)::

    {
      "version": 1,
      "question": {
        "text": str,                 # the question in one sentence
        "command": str | null,       # the command line that asked it
        "model": str, "model_args": {...},
        "hw": str, "nodes": int | null,
        "vary": {KEY: [V1, V2, ...]},           # in the order given
        "tokens": float | null,      # --tokens: train this many tokens
        "days": float | null,        # --days: train for this long
        "plan": str | null,          # --plan: the fixed plan (inline form); null = re-plan
        "checkpoint_interval_min": float | null,
        "unit": str                  # "token", or "sample" for a model without sequences (an MLP, a
                                     #   CNN): what tokens, tokens_per_s and --tokens count
      },
      "points": [{
        "id": int,                   # index into this list
        "label": str,                # the varied values, "hw=a100x8 nodes=4"
        "settings": {KEY: value},    # the varied values of this point
        "hw": str, "gpu": str, "nodes": int, "num_gpus": int,
        "memory_capacity_gib": float,           # one GPU
        "usd_per_gpu_hour": float,
        "moe": bool,                 # the model routes tokens to experts (at any ep)
        "feasible": bool,
        "reason": str | null,        # why not, when infeasible
        "plan": {...} | null,        # Plan.to_dict() without "predicted"
        "plan_label": str | null,    # "tp=8 pp=4 dp=1 mbs=1 gbs=64 recompute=full"
        "plan_inline": str | null,   # the --plan form of the same plan
        "figures": {...} | null,     # Figures.to_dict(): step_time_s, tokens_per_s, mfu,
                                     #   breakdown {kind: s}, memory_breakdown_gib {part: GiB}...
        "scaling_efficiency": float | null,     # per-GPU tokens/s over that of the fewest-GPU
                                                #   feasible point of the same group (derive())
        "group": str,                # the scaling group: settings other than nodes, "hw=h100x8"
        "run": null | {              # with --tokens or --days: the failure simulation
          "tokens": float, "steps": int,
          "ideal_days": float,       # without failures or checkpoints
          "days": float,             # mean over seeds, with failures
          "usd": float,              # GPU-hours x price for "days"
          "goodput": float, "goodput_std": float, # work over "days"; the std over seeds
          "goodput_p10": float, "goodput_p90": float,
          "checkpoint_interval_min": float,       # the simulated best (Daly's with too few failures drawn), or the one given
          "checkpoint_interval_source": str,      # "auto", "daly", "given" or "whole_run"
          "checkpoint_save_s": float, "young_daly_min": float,  # Daly's 2006 interval (Young's, refined)
          "job_mtbf_hours": float,
          "failures": float, "seeds": int
        }
      }],
      "pareto": [int],               # ids on the time-to-train vs cost frontier (derive())
      "recommended": int | null,     # the id of the recommended point
      "recommendation": str,         # why it was chosen
      "details": {                   # for the recommended point (null when not computed)
        "gantt": null | {"point": int, "step_time_s": float, "stages": int,
                         "tasks": [{"stage": int, "kind": str, "microbatch": int|null,
                                    "start_s": float, "end_s": float}],
                         "truncated": bool},
        "goodput": null | {"point": int, "young_daly_min": float,  # Daly's 2006 interval (Young's, refined)
                           "chosen_interval_min": float,
                           "gpu_mtbf_hours": float,  # the profile's (the point's run); absent in older files
                           "vs_interval": {"interval_min": [..], "goodput": [..], "goodput_std": [..]},
                           "vs_mtbf": {"gpu_mtbf_hours": [..], "goodput": [..], "goodput_std": [..]},
                           "seeds": int},  # simulated runs per point; a goodput (and its std) is
                                           #   null where that run does not finish
        "sensitivity": null | {"point": int, "delta": float, "base_step_time_s": float,
                               "items": [{"key": str, "low_step_time_s": float,
                                          "high_step_time_s": float}]}
      },
      "notes": [str],                # what `smplan whatif` prints under its table (fp8 MFU, GPU counts...)
      "charts": {NAME: FILE}         # the chart files written beside points.json
    }
"""

from __future__ import annotations

import json
import math
from pathlib import Path

POINTS_VERSION = 1
CHART_NAMES = ("scaling", "versus", "frontier", "memory", "breakdown", "gantt", "goodput", "sensitivity")
MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "buffers", "reserve")
# The keys of a step's breakdown (smplan.planner.closed_form and smplan.simulator.figures emit
# them; tests/report/test_charts.py checks that list against both) in chart order.
BREAKDOWN_ORDER = ("compute", "host_wait", "recompute", "tp_comm", "ep_all_to_all", "cp_comm_exposed", "pp_p2p",
                   "dp_comm_exposed", "bubble", "optimizer")


class PointsError(ValueError):
    """A points record that does not follow the schema above."""


def feasible(points: list[dict]) -> list[dict]:
    return [p for p in points if p.get("feasible") and p.get("figures")]


def group_key(settings: dict) -> str:
    """The scaling group of a point: its varied settings other than the node count."""
    rest = [f"{k}={v}" for k, v in settings.items() if k != "nodes"]
    return " ".join(rest) or "all"


# Varied settings that only a whole run reads (failures, restarts, checkpoint writes and interval),
# not a step: smplan.whatif.question.RUN_ONLY_SECTIONS, and the checkpoint_interval_min --vary key.
RUN_ONLY_PREFIXES = ("reliability.", "storage.", "checkpoint_interval_min")


def run_only(key: str) -> bool:
    return key.startswith(RUN_ONLY_PREFIXES)


def versus_key(record: dict) -> str | None:
    """The varied setting other than nodes with two or more numeric values among the feasible
    points (a hardware figure such as inter_node.bandwidth_gbps) that the "versus" chart puts
    on x, one line per the other settings: the first one that only a whole run reads (its step
    is the same at every value) when the points have runs, else the first; None when there is none."""
    ok = feasible(record["points"])
    keys = []
    for key in (record["question"].get("vary") or {}):
        values = {p["settings"].get(key) for p in ok}
        if key != "nodes" and len(values) >= 2 and all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            keys.append(key)
    timed = any(p.get("run") for p in ok)
    return next((k for k in keys if timed and run_only(k)), keys[0] if keys else None)


# Settings that change a step's work: their step times are not comparable, their throughput is.
WORK_PER_STEP_KEYS = ("global_batch", "gbs", "seq_len")


# Varied settings that describe the cluster rather than a choice its user makes: a sweep of them
# has a best case, not a recommendation (smplan.whatif.sweep).
CONDITION_PREFIXES = ("reliability.",)


def conditions_only(keys) -> bool:
    """Whether every varied key (at least one) is a condition of the cluster (CONDITION_PREFIXES)."""
    keys = list(keys)
    return bool(keys) and all(key.startswith(CONDITION_PREFIXES) for key in keys)


def picked_word(record: dict) -> str:
    """What the chosen point is called: "best case" where the sweep varied conditions only (no
    choice to recommend), else "recommended"."""
    return "best case" if conditions_only(record["question"].get("vary") or {}) else "recommended"


def versus_metric(key: str, points: list[dict]) -> str:
    """What the versus chart plots against `key`: "goodput" of the whole run for a setting that
    only a run reads (the step time would be a flat line), "usd_per_mtok" for a price (the step
    does not change either), "tokens_per_s" for one that changes the work of a step (a 4x batch
    takes ~4x as long a step), else "step_time_s"."""
    if run_only(key) and all(p.get("run") for p in feasible(points)):
        return "goodput"
    if key.startswith("cost."):
        return "usd_per_mtok"
    return "tokens_per_s" if key in WORK_PER_STEP_KEYS else "step_time_s"


def usd_per_million(point: dict) -> float:
    """USD per million tokens (samples) of a point: over its whole run where it has one (failures,
    restarts and checkpoints included), else of one step (step time x GPUs x price)."""
    run = point.get("run")
    if run and run.get("tokens"):
        return run["usd"] / run["tokens"] * 1e6
    fig = point["figures"]
    return fig["usd_per_step"] / max(fig["tokens_per_s"] * fig["step_time_s"], 1e-30) * 1e6


def derive(record: dict) -> dict:
    """Fill the derived fields (group, scaling_efficiency, pareto) in place; returns record."""
    points = record["points"]
    for p in points:
        p["group"] = group_key(p.get("settings", {}))
        p.setdefault("scaling_efficiency", None)
    groups: dict[str, list[dict]] = {}
    for p in feasible(points):
        groups.setdefault(p["group"], []).append(p)
    for members in groups.values():
        base = min(members, key=lambda p: p["num_gpus"])
        base_rate = base["figures"]["tokens_per_s"] / base["num_gpus"]
        for p in members:
            rate = p["figures"]["tokens_per_s"] / p["num_gpus"]
            p["scaling_efficiency"] = rate / base_rate if base_rate > 0 else None
    record["pareto"] = pareto_ids(points, frontier_mode(record["question"]))
    return record


def frontier_mode(question: dict) -> str | None:
    """"tokens" (time vs cost for a token budget), "days" (tokens vs cost in a time) or None."""
    if question.get("tokens"):
        return "tokens"
    if question.get("days"):
        return "days"
    return None


def frontier_xy(point: dict, mode: str) -> tuple[float, float]:
    """(x, y) of a point on the frontier chart: (days, usd) or (tokens, usd)."""
    run = point["run"]
    return (run["days"] if mode == "tokens" else run["tokens"]), run["usd"]


def pareto_ids(points: list[dict], mode: str | None) -> list[int]:
    """Points no other point beats on both axes (less time or more tokens, and less cost)."""
    if mode is None:
        return []
    cands = [p for p in feasible(points) if p.get("run")]
    sign = 1.0 if mode == "tokens" else -1.0  # minimise days; maximise tokens

    def key(p):
        x, y = frontier_xy(p, mode)
        return sign * x, y

    out = []
    for p in cands:
        kx, ky = key(p)
        dominated = any(
            (qx <= kx and qy <= ky) and (qx < kx or qy < ky)
            for qx, qy in (key(q) for q in cands if q is not p)
        )
        if not dominated:
            out.append(p["id"])
    return sorted(out, key=lambda i: key(points[i]))


def charts_that_apply(record: dict) -> list[str]:
    """The chart names this record has data for, in CHART_NAMES order."""
    points = record["points"]
    ok = feasible(points)
    details = record.get("details") or {}
    out = []
    groups: dict[str, set] = {}
    for p in ok:
        groups.setdefault(p["group"], set()).add(p["num_gpus"])
    if any(len(g) >= 2 for g in groups.values()):
        out.append("scaling")
    if versus_key(record):
        out.append("versus")
    if record.get("pareto"):
        out.append("frontier")
    if any((p.get("figures") or {}).get("memory_breakdown_gib") for p in points):
        out.append("memory")
    if any((p["figures"] or {}).get("breakdown") for p in ok):
        out.append("breakdown")
    for name in ("gantt", "goodput", "sensitivity"):
        if details.get(name):
            out.append(name)
    return out


def save(record: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(_clean(record), indent=1) + "\n")


def load(path: str | Path) -> dict:
    record = json.loads(Path(path).read_text())
    if record.get("version") != POINTS_VERSION or "points" not in record:
        raise PointsError(f"{path} is not a version-{POINTS_VERSION} points.json (see smplan.report.points)")
    return record


def _clean(obj):
    """JSON without NaN/inf (the file must parse in a browser): such numbers become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def unit_of(record: dict) -> str:
    """What a step counts: "token", or "sample" for a model without sequences (question.unit;
    records before it counted tokens)."""
    return record["question"].get("unit", "token")
