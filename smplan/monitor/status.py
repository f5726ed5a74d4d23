"""The state of a run, as one JSON-able dict: what `smplan monitor` prints or emits.

Schema (all times in seconds; null where the run or the plan does not say)::

    {"run_dir": str, "finished": bool, "steps_done": int, "steps_total": int | null,
     "stopped": {"reason": "failed" | "interrupted", "detail": str, "time": str} | null,
     "running": str | null,                          # the launch holding the run's lock: "pid N on HOST, since ..."
     "abandoned": str | null,                        # this host's launch that ended without a record (SIGKILL)
     "progress": float | null,                       # steps_done / steps_total
     "step_time_s": {"median": float, "predicted": float | null, "ratio": float | null},
     "tokens_per_s": {"median": float, "predicted": float | null},
     "throughput": {"key": "tokens_per_s" | "samples_per_s", "unit": "tokens/s" | "samples/s",  # what the
                    "median": float, "predicted": float | null},   # text shows: samples for a model without sequences
     "loss": {"first": float, "last": float, "sparkline": str},
     "grad_norm": {"last": float, "sparkline": str},
     "val_loss": {"first": float, "first_step": int, "last": float, "last_step": int,
                  "best": float, "best_step": int, "sparkline": str} | null,   # --eval-every steps
     "lr": {"first": float, "last": float, "peak": float,  # peak: the run's --lr (as scaled), else
            "schedule": str | null, "warmup_steps": int, #   the highest recorded
            "sparkline": str} | null,                # null for runs that predate the lr record
     "memory": {"predicted_peak_gib": float | null, "source": "rss" | "cuda_allocator" | null,
                "compared": bool,                    # RSS (CPU) is not held against a GPU prediction
                "peak_gib_by_rank": {RANK: float}},   # JSON keys are strings; "max" (over
                                                     #   ranks) for runs without ranks/
     "ranks": [{"rank": int, "steps": int, "median_step_time_s": float,  # medians of this rank's own records
                "median_sync_wait_s": float, "median_own_step_time_s": float | null,
                "step_time_s": float | null,       # means over the steps every rank wrote (after the
                "sync_wait_s": float | null,       #   first): the ranks' median step time, this rank's
                "own_step_time_s": float | null,   #   wait, and step less wait (so they add up)
                "peak_memory_gib": float}],
     "stragglers": [Straggler.to_dict()],           # see smplan.monitor.stragglers
     "memory_over_prediction_pct": {RANK: float},
     "warnings": [str], "skipped_lines": [str],
     "thresholds": {"straggler_pct": float, "straggler_steps": int, "memory_pct": float}}

Medians leave out the first step and the first after each resume (warm-up: allocation, lazy
initialisation; executor.metrics.steady).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from smplan.executor.metrics import current_layout
from smplan.executor.metrics import steady as steady_steps

from .rundir import RunData
from .sparkline import sparkline
from .stragglers import find_stragglers, memory_over_prediction, own_step_times

# The throughput's label in monitor's text and page: samples for a model without sequences
# (RunData.throughput_key), tokens, as monitor always said, otherwise.
THROUGHPUT_UNITS = {"tokens_per_s": "tokens/s", "samples_per_s": "samples/s"}

class ThresholdError(ValueError):
    """Warning thresholds no run can be held to: the user's, shown in one line."""


@dataclass(frozen=True)
class Thresholds:
    # chosen defaults: above step-to-step noise (a few %) and a memory model's usual error, yet
    # early enough to act on
    straggler_pct: float = 20.0  # X: own step time this far above the median rank's...
    straggler_steps: int = 3  # N: ...for this many consecutive steps
    memory_pct: float = 10.0  # Y: peak memory this far above the plan's predicted peak

    def __post_init__(self) -> None:
        if self.straggler_pct < 0 or self.memory_pct < 0 or self.straggler_steps < 1:
            raise ThresholdError("thresholds: percentages must be >= 0 and --straggler-steps >= 1")




def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def own_time_matrix(ranks: dict[int, list[dict]]) -> tuple[list[int], list[int], list[list[float]]]:
    """(steps, ranks, own[i][r]) over the steps every rank has written under the current plan
    (metrics.current_layout: not a --force-resume's earlier layout), after the first."""
    order = sorted(ranks)
    by_rank = {r: {rec["step"]: rec for rec in current_layout(ranks[r]) if "sync_wait_s" in rec} for r in order}
    common = sorted(set.intersection(*(set(m) for m in by_rank.values()))) if order else []
    steps = common[1:] if len(common) > 1 else []
    rows = [own_step_times([by_rank[r][s]["step_time_s"] for r in order],
                           [by_rank[r][s]["sync_wait_s"] for r in order]) for s in steps]
    return steps, order, rows


def step_split(ranks: dict[int, list[dict]], steps: list[int], order: list[int]) -> dict[int, tuple[float, float, float]]:
    """Rank -> (step, wait, own) seconds, means over `steps`: the ranks' median step time at each
    step, this rank's wait at the step-end synchronisation, and the step less the wait (the own time
    straggler detection reads). Means, not medians, so that own + wait = step for every rank: medians
    of the three do not add up (a skewed wait once showed 12.8 ms = 10.5 ms + 0.3 ms)."""
    if not steps:
        return {}
    # the records own_time_matrix chose `steps` from (a step written twice, across a restart: its last with a wait)
    by_rank = {r: {rec["step"]: rec for rec in ranks[r] if "sync_wait_s" in rec} for r in order}
    step_s = statistics.fmean(statistics.median(by_rank[r][s]["step_time_s"] for r in order) for s in steps)
    out = {}
    for rank in order:
        wait_s = statistics.fmean(by_rank[rank][s]["sync_wait_s"] for s in steps)
        out[rank] = (step_s, wait_s, step_s - wait_s)
    return out


def _rank_rows(run: RunData, steps: list[int], order: list[int], rows: list[list[float]]) -> list[dict]:
    split = step_split(run.ranks, steps, order)
    out = []
    for col, rank in enumerate(order):
        recs = steady_steps(run.ranks[rank])
        step_s, wait_s, own_s = split.get(rank, (None, None, None))
        out.append({
            "rank": rank,
            "steps": len(run.ranks[rank]),
            "median_step_time_s": _median(r["step_time_s"] for r in recs),
            "median_sync_wait_s": _median(r.get("sync_wait_s") for r in recs),
            "median_own_step_time_s": _median(row[col] for row in rows),
            "step_time_s": step_s,
            "sync_wait_s": wait_s,
            "own_step_time_s": own_s,
            "peak_memory_gib": max(r["peak_memory_gib"] for r in current_layout(run.ranks[rank])),
        })
    return out


def _val_loss(records: list[dict], spark_width: int) -> dict | None:
    """The validation losses of the --eval-every steps, or None when the run records none."""
    evals = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    if not evals:
        return None
    best_step, best = min(evals, key=lambda e: (e[1], e[0]))
    return {"first": evals[0][1], "first_step": evals[0][0], "last": evals[-1][1], "last_step": evals[-1][0],
            "best": best, "best_step": best_step, "sparkline": sparkline([v for _, v in evals], spark_width)}


def _lr(run: RunData, spark_width: int) -> dict | None:
    """The learning rate each step ran at, or None when the records do not hold it."""
    lrs = [r["lr"] for r in run.records if r.get("lr") is not None]
    if not lrs:
        return None
    config = run.config or {}
    peak = config.get("lr")  # run_config.json holds --lr already scaled to the global batch
    return {"first": lrs[0], "last": lrs[-1], "peak": peak if isinstance(peak, (int, float)) else max(lrs),
            "schedule": config.get("lr_schedule"), "warmup_steps": int(config.get("warmup_steps") or 0),
            "sparkline": sparkline(lrs, spark_width)}


def describe_lr(lr: dict) -> str:
    """'peak 0.002, 20 warmup steps, then cosine' for the view and the report."""
    parts = [f"peak {lr['peak']:.3g}"]
    if lr.get("warmup_steps"):
        parts.append(f"{lr['warmup_steps']} warmup steps")
    if lr.get("schedule"):
        parts.append(("then " if lr.get("warmup_steps") else "") + lr["schedule"])
    return ", ".join(parts)


def run_status(run: RunData, thresholds: Thresholds | None = None, spark_width: int = 40) -> dict:
    th = thresholds or Thresholds()
    if not run.records:  # stopped before its first step (load_run returns no other run without one)
        return {"run_dir": str(run.run_dir), "finished": False, "stopped": run.stopped, "running": run.running,
                "abandoned": run.abandoned,
                "steps_done": 0,
                "steps_total": run.steps_total, "progress": 0.0 if run.steps_total else None,
                "skipped_lines": run.skipped}
    records, predicted, rate = run.records, run.predicted, run.throughput_key
    steady = steady_steps(records)
    step_median = _median(r["step_time_s"] for r in steady)
    step_pred = predicted.get("step_time_s")
    steps, order, rows = own_time_matrix(run.ranks)
    stragglers = find_stragglers(rows, th.straggler_pct, th.straggler_steps, steps=steps, ranks=order)
    rank_rows = _rank_rows(run, steps, order, rows)
    sources = {r[-1].get("peak_memory_source") for r in run.ranks.values() if r}
    source = sources.pop() if len(sources) == 1 else None
    peaks = {row["rank"]: row["peak_memory_gib"] for row in rank_rows} or {"max": records[-1]["peak_memory_gib"]}
    compared = source == "cuda_allocator"
    over = memory_over_prediction(peaks, run.predicted_allocated_gib, th.memory_pct) if compared else {}
    warnings = [
        f"rank {s.rank} is a straggler: its own step time is {s.excess_pct:.0f}% above the median rank's "
        f"for {s.steps} consecutive steps ({s.first_step}-{s.last_step}{', ongoing' if s.ongoing else ''})"
        for s in stragglers
    ]
    warnings += [f"rank {r} peak memory {peaks[r]:.2f} GiB is {pct:.0f}% above the predicted "
                 f"{run.predicted_allocated_gib:.2f} GiB (allocated, without the reserve)" for r, pct in sorted(over.items())]
    total = run.steps_total
    done = records[-1]["step"]
    return {
        "run_dir": str(run.run_dir),
        "finished": run.finished,
        "stopped": None if run.finished else run.stopped,  # summary.json wins: a later run finished it
        "running": run.running,  # the launch that holds the run's lock (executor.run_lock), or None
        "abandoned": run.abandoned,  # this host's launch that ended without a record (run_lock.abandoned_launch)
        "steps_done": done,
        "steps_total": total,
        "progress": done / total if total else None,
        "step_time_s": {"median": step_median, "predicted": step_pred,
                        "ratio": step_median / step_pred if step_pred and step_median else None},
        "tokens_per_s": {"median": _median(r["tokens_per_s"] for r in steady),
                         "predicted": predicted.get("tokens_per_s")},
        "throughput": {"key": rate, "unit": THROUGHPUT_UNITS[rate], "median": _median(r.get(rate, 0.0) for r in steady),
                       "predicted": predicted.get(rate)},
        "loss": {"first": records[0]["loss"], "last": records[-1]["loss"],
                 "sparkline": sparkline([r["loss"] for r in records], spark_width)},
        "grad_norm": {"last": records[-1]["grad_norm"],
                      "sparkline": sparkline([r["grad_norm"] for r in records], spark_width)},
        "val_loss": _val_loss(records, spark_width),
        "lr": _lr(run, spark_width),
        "memory": {"predicted_peak_gib": run.predicted_allocated_gib, "source": source,
                   "compared": compared, "peak_gib_by_rank": peaks},
        "ranks": rank_rows,
        "stragglers": [s.to_dict() for s in stragglers],
        "memory_over_prediction_pct": over,
        "warnings": warnings,
        "skipped_lines": run.skipped,
        "thresholds": {"straggler_pct": th.straggler_pct, "straggler_steps": th.straggler_steps,
                       "memory_pct": th.memory_pct},
    }
