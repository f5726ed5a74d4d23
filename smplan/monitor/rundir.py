"""Reading a run directory of `smplan execute`, also while the run is still writing it.

A line being written when we read (or left half-written by a killed worker) is skipped
and counted, never a crash: RUN_DIR/metrics.jsonl stays the source of truth.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from smplan.executor.metrics import METRICS_FILE as METRICS
from smplan.executor.metrics import (
    RANKS_DIR,
    RATE_UNITS,
    RUN_CONFIG_FILE,
    STOPPED_FILE,
    SUMMARY_FILE,
    rank_files,
    rate_key,
    read_jsonl,
)
from smplan.executor.run_lock import LOCK_FILE, abandoned_launch, running_launch


def no_step_line(run: RunData) -> str:
    """What there is to say of a run that stopped before its first step."""
    stopped = run.stopped or {}
    return (f"{run.run_dir} holds no step: the run stopped before its first one ({stopped.get('reason', '?')}: "
            f"{stopped.get('detail', 'no detail recorded')})")


class RunDirError(ValueError):
    """RUN_DIR is missing, not a run directory, or holds no metrics yet."""


def read_stopped(run_dir: str | Path) -> dict | None:
    """RUN_DIR/stopped.json when it says why the run stopped ({"reason": ..., "detail": ...})."""
    data = _read_json(Path(run_dir) / STOPPED_FILE)
    return data if data is not None and isinstance(data.get("reason"), str) else None


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # absent, or being written
    return data if isinstance(data, dict) else None


@dataclass
class RunData:
    run_dir: Path
    records: list[dict]  # metrics.jsonl: one per step (rank 0); none only when stopped before the first
    ranks: dict[int, list[dict]]  # ranks/rank-N.jsonl; empty for runs before per-rank records
    config: dict | None = None  # run_config.json
    summary: dict | None = None  # summary.json, once the run has finished
    stopped: dict | None = None  # stopped.json: why the run ended unfinished (its local launcher's record)
    running: str | None = None  # the launch holding the run's lock ("pid 123 on host, since ..."), if one does
    abandoned: str | None = None  # this host's launch that ended without a record (run_lock.abandoned_launch)
    skipped: list[str] = field(default_factory=list)  # "metrics.jsonl:7" per unreadable line

    @property
    def plan(self) -> dict:
        return (self.config or {}).get("plan") or {}

    @property
    def throughput_key(self) -> str:
        """"tokens_per_s", or "samples_per_s" for a model whose samples are not token sequences:
        the summary's record of what execute reported, else the same rule (executor.metrics.rate_key)
        on the plan's seq_len and the tokens a sample counted (older runs: tokens)."""
        if self.summary and self.summary.get("throughput_key") in RATE_UNITS:
            return self.summary["throughput_key"]
        first = self.records[0] if self.records else {}
        if not first.get("samples_per_s"):
            return "tokens_per_s"
        return rate_key(self.plan.get("seq_len"), round(first.get("tokens_per_s", 0.0) / first["samples_per_s"]))

    @property
    def predicted(self) -> dict:
        return self.plan.get("predicted") or {}

    @property
    def predicted_allocated_gib(self) -> float | None:
        """The plan's predicted peak without its reserve (CUDA context, fragmentation): what the
        caching allocator's peak, the ranks' `peak_memory_gib` on a GPU, can reach."""
        peak = self.predicted.get("peak_memory_gib")
        if peak is None:
            return None
        return peak - (self.predicted.get("memory_breakdown_gib") or {}).get("reserve", 0.0)

    @property
    def steps_total(self) -> int | None:
        return (self.config or {}).get("steps")

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def ended(self) -> bool:
        """Finished, or stopped for good: nothing more will be written until it is run again."""
        return self.finished or self.stopped is not None or self.abandoned is not None


# The numbers monitor and report read from every line execute writes (executor/train.py): a
# line without one (edited by hand) is skipped as an unreadable one is, not a KeyError.
METRIC_NUMBERS = ("loss", "step_time_s", "tokens_per_s", "peak_memory_gib", "grad_norm")
RANK_NUMBERS = ("step_time_s", "sync_wait_s", "peak_memory_gib")


def _with_numbers(rows: list[dict], keys: tuple[str, ...]) -> tuple[list[dict], list[int]]:
    """(the rows holding every key as a number, the steps of the others)."""
    def whole(row: dict) -> bool:
        return all(isinstance(row.get(k), int | float) and not isinstance(row.get(k), bool) for k in keys)

    return [r for r in rows if whole(r)], [r["step"] for r in rows if not whole(r)]


def load_run(run_dir: str | Path) -> RunData:
    """Everything `smplan monitor` and `smplan report` show. Raises RunDirError when the
    directory is missing or holds no step yet; a run stopped before its first step has no records."""
    path = Path(run_dir)
    if not path.exists():
        raise RunDirError(f"run directory {path} does not exist; pass the -o/--output folder of `smplan execute`")
    if not path.is_dir():
        raise RunDirError(f"{path} is a file, not a run directory; pass the -o/--output folder of `smplan execute`")
    records, bad = read_jsonl(path / METRICS)
    skipped = [f"{METRICS}:{n}" for n in bad]
    records, short = _with_numbers(records, METRIC_NUMBERS)
    skipped += [f"{METRICS}:step {step}" for step in short]
    unreadable = len(bad) + len(short)
    ranks: dict[int, list[dict]] = {}
    for rank, file in rank_files(path).items():
        rows, bad = read_jsonl(file)
        rows, short = _with_numbers(rows, RANK_NUMBERS)
        skipped += [f"{RANKS_DIR}/{file.name}:{n}" for n in bad] + [f"{RANKS_DIR}/{file.name}:step {s}" for s in short]
        if rows:  # a rank that has not finished its first step yet has nothing to show
            ranks[rank] = rows
    stopped = read_stopped(path)  # without records too: a run that stopped before its first step is a state to show
    if not records and not any((path / name).exists() for name in (RUN_CONFIG_FILE, METRICS, LOCK_FILE, STOPPED_FILE)):
        # execute holds its lock, then writes run_config.json, before the workers start: no run ever used this folder
        raise RunDirError(f"{path} is not a run directory (no {RUN_CONFIG_FILE}, no {METRICS}); pass the "
                          "-o/--output folder of `smplan execute`")
    if not records and stopped is None:
        what = ("no metrics.jsonl" if not (path / METRICS).exists() else
                f"{unreadable} unreadable line(s) in metrics.jsonl" if unreadable else "an empty metrics.jsonl")
        raise RunDirError(f"{path} holds no step yet ({what}): wait for the run's first step, "
                          "or pass the -o/--output folder of `smplan execute`")
    running = running_launch(path)
    summary = _read_json(path / SUMMARY_FILE)
    gone = abandoned_launch(path) if running is None and summary is None and stopped is None else None
    return RunData(run_dir=path, records=records, ranks=ranks, config=_read_json(path / RUN_CONFIG_FILE),
                   summary=summary, stopped=stopped, running=running, abandoned=gone, skipped=skipped)
