"""Per-step metrics (RUN_DIR/metrics.jsonl) and the measured-vs-predicted summary."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from smplan.planner.feasibility import effective_zero

MEASURED = ("step_time_s", "tokens_per_s", "samples_per_s", "peak_memory_gib")
# The throughput the progress line and the summary's text report, and its unit: both keys stay in
# every record (scripts read tokens_per_s), only the one shown follows the model's samples.
RATE_UNITS = {"tokens_per_s": "tok/s", "samples_per_s": "samples/s"}
# A step record's flag: the first step after the workers started (a resume's, a restart's; the run's
# own step 1 is one without it in older files), which warms up (allocations, gloo's connections,
# lazy initialisation) and is left out of the medians.
WARM_UP = "warm_up"
# A step record's tag of the layout it ran under (`layout_tag`): a run resumed under another layout
# (`--force-resume`) keeps the earlier steps, whose times and memory are another plan's.
LAYOUT = "layout"
# The plan fields a summary reports as what ran, and `layout_tag` hashes: each changes the step's
# time or memory (recompute and dtype do, though not the loss).
RAN_FIELDS = ("dp", "tp", "pp", "cp", "ep", "micro_batch", "global_batch", "schedule", "virtual_stages", "zero",
              "sequence_parallel", "recompute", "dtype", "fp8_scaling", "capacity_factor", "grad_compress")


def peak_memory_gib(device) -> float:
    """Peak GPU memory allocated, or on CPU the process's peak resident set size."""
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def peak_memory_source(device) -> str:
    """What `peak_memory_gib` measures on this device (RSS includes the interpreter and
    libraries, so it is not comparable with a GPU memory prediction)."""
    return "cuda_allocator" if getattr(device, "type", "cpu") == "cuda" else "rss"


METRICS_FILE = "metrics.jsonl"  # RUN_DIR/metrics.jsonl: one line per step (rank 0)
RANKS_DIR = "ranks"  # RUN_DIR/ranks/rank-00001.jsonl: one file per rank
STOPPED_FILE = "stopped.json"  # RUN_DIR/stopped.json: the local launcher's word that the run ended unfinished
RUN_CONFIG_FILE = "run_config.json"  # RUN_DIR/run_config.json: what the workers run (executor/config.py)
SUMMARY_FILE = "summary.json"  # RUN_DIR/summary.json: measured vs predicted, once the run has finished
CHECKPOINTS_DIR = "checkpoints"  # RUN_DIR/checkpoints/step-N: the run's own checkpoints
ELASTIC_DIR = "elastic"  # RUN_DIR/elastic/: torchrun's per-worker logs
TENSORBOARD_DIR = "tensorboard"  # RUN_DIR/tensorboard/: --tensorboard event files
SBATCH_FILE = "smplan.sbatch"  # RUN_DIR/smplan.sbatch: --launcher slurm's job script
NON_FINITE_FILE = "non_finite.txt"  # RUN_DIR/non_finite.txt: a NaN stop's line, for the agent's restarts of that launch
# Everything a run writes into its folder: a folder holding any of these but no run config of
# execute's is someone else's, and is not written into (executor/run.py).
RUN_ENTRIES = (RUN_CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, STOPPED_FILE, RANKS_DIR, ELASTIC_DIR, TENSORBOARD_DIR,
               CHECKPOINTS_DIR, SBATCH_FILE, NON_FINITE_FILE)


def present_run_entries(folder: str | Path) -> list[str]:
    """The names of RUN_ENTRIES that `folder` holds: what of a run (its own or another's) is there."""
    return [name for name in RUN_ENTRIES if (Path(folder) / name).exists()]


def mark_stopped(run_dir: str | Path, reason: str, detail: str, cause: str | None = None) -> None:
    """Record why a run ended without its summary ("interrupted", "failed"), so that a reader
    waiting for summary.json (`monitor --follow`) stops waiting. `cause`: a failed rank's
    exception line, kept with the last step recorded (`after_step`) so that the next attempt can
    tell whether it failed the same way (`repeats_stop`).

    A stop after the last step (a Ctrl-C, or a worker crashing in the shutdown) stopped nothing:
    with summary.json there (rank 0 writes it after the last step; a launch removes the one
    before) nothing is recorded, and without it the record says every step ran, not that the
    same command resumes the run (it would refuse: no step is left to run)."""
    run_dir = Path(run_dir)
    if (run_dir / SUMMARY_FILE).is_file():
        clear_stopped(run_dir)
        return
    done, total = _steps_done(run_dir)
    if total and done >= total:
        line = "" if reason == "interrupted" else f" ({detail})"  # a crash keeps its log line; Ctrl-C's resume advice goes
        detail = (f"{reason} after the run's last step ({done} of {total}): every step ran and was recorded, "
                  f"only {SUMMARY_FILE} was not written; there is nothing left to resume{line}")
    record = {"reason": reason, "detail": detail, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if cause:
        record.update(cause=cause, after_step=done)
    # whole or not at all: a reader never meets half a record, and a full disk (the cause of many a
    # stop) must not turn the launcher's report of the failure into a traceback of its own
    tmp = run_dir / f".{STOPPED_FILE}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(run_dir / STOPPED_FILE)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        print(f"note: could not record why the run stopped in {run_dir / STOPPED_FILE} ({err.strerror or err})",
              file=sys.stderr)


def repeats_stop(earlier: bytes | None, run_dir: str | Path, cause: str | None) -> bool:
    """Whether a failure with exception line `cause` repeats the one `earlier` (the stopped.json
    of the attempt before, as read before this one cleared it) recorded: the same exception after
    the same last step, as a bad sample or a model bug at a fixed step gives on every resume."""
    try:
        before = json.loads(earlier or b"null")
    except ValueError:
        return False
    return (bool(cause) and isinstance(before, dict) and before.get("reason") == "failed"
            and before.get("cause") == cause and before.get("after_step") == _steps_done(Path(run_dir))[0])


def _steps_done(run_dir: Path) -> tuple[int, int | None]:
    """(the last step in metrics.jsonl, the steps run_config.json asks for; None when unreadable)."""
    records = read_metrics(run_dir)
    try:
        total = json.loads((run_dir / RUN_CONFIG_FILE).read_text()).get("steps")
    except (OSError, ValueError, AttributeError):
        total = None
    return (records[-1]["step"] if records else 0), (total if isinstance(total, int) else None)


def clear_stopped(run_dir: str | Path) -> None:
    """A run starting (or resuming) in `run_dir` is no longer stopped."""
    (Path(run_dir) / STOPPED_FILE).unlink(missing_ok=True)


def rank_file(run_dir: str | Path, rank: int) -> Path:
    """RUN_DIR/ranks/rank-00001.jsonl: the per-rank records (one writer per rank, no gather)."""
    return Path(run_dir) / RANKS_DIR / f"rank-{rank:05d}.jsonl"


def rank_files(run_dir: str | Path) -> dict[int, Path]:
    """{rank: its records file} of the ranks that wrote any."""
    found = {}
    for file in sorted((Path(run_dir) / RANKS_DIR).glob("rank-*.jsonl")):
        try:
            found[int(file.stem.split("-", 1)[1])] = file
        except ValueError:
            continue
    return found


def read_jsonl(path: str | Path) -> tuple[list[dict], list[int]]:
    """(records, numbers of the lines skipped). A line that is not one JSON object with a
    "step" (a write in progress, or one a killed worker left half-done) is skipped; so is a
    file that vanished meanwhile."""
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return [], []
    records, skipped = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            skipped.append(number)
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
        else:
            skipped.append(number)
    return records, skipped


def _step_of(line: str) -> int | None:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return None  # a line cut short by a killed worker


class MetricsWriter:
    """metrics.jsonl (rank 0) or a per-rank file. On resume, lines of steps after the
    checkpoint (and any line a killed run left half-written) are dropped."""

    def __init__(self, run_dir: str | Path, resume_step: int = 0, path: str | Path | None = None):
        self.path = Path(path) if path is not None else Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if self.path.exists():
            steps = [(line, _step_of(line)) for line in self.path.read_text().splitlines()]
            kept = [line for line, step in steps if step is not None and step <= resume_step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")


def rate_key(seq_len: int | None, tokens_per_sample: int | None) -> str:
    """"samples_per_s" for a model whose samples are not token sequences (an image or feature
    model: no seq_len in the plan, one token per sample), as `smplan plan` then labels its column
    samples/s (its plans' seq_len is 0 for them); "tokens_per_s" otherwise."""
    return "tokens_per_s" if seq_len or (tokens_per_sample or 1) > 1 else "samples_per_s"


def progress(record: dict, steps: int, rate: str = "tokens_per_s") -> None:
    print(
        f"step {record['step']}/{steps}  loss {record['loss']:.4f}  "
        f"{record['step_time_s'] * 1e3:.1f} ms/step  {record[rate]:,.0f} {RATE_UNITS[rate]}  "
        f"grad-norm {record['grad_norm']:.3f}  mem {record['peak_memory_gib']:.2f} GiB"
        + (f"  lr {record['lr']:.3g}" if "lr" in record else "")
        + (f"  val-loss {record['val_loss']:.4f}" if "val_loss" in record else ""),
        file=sys.stdout,
        flush=True,
    )


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The steps of RUN_DIR/metrics.jsonl (a truncated line is skipped)."""
    return read_jsonl(Path(run_dir) / METRICS_FILE)[0]


def allocated_prediction_gib(predicted: dict, device: str) -> float | None:
    """The predicted peak that `peak_memory_gib` measures: on a GPU, what the caching allocator
    hands out (torch.cuda.max_memory_allocated), so the plan's total less its reserve for the CUDA
    context and fragmentation (memory_breakdown_gib["reserve"]); on CPU none (RSS counts the
    interpreter and libraries, nothing the plan predicts)."""
    if device != "cuda" or predicted.get("peak_memory_gib") is None:
        return None
    reserve = (predicted.get("memory_breakdown_gib") or {}).get("reserve", 0.0)
    return predicted["peak_memory_gib"] - reserve


def layout_tag(plan: dict, compute_dtype: str) -> str:
    """A short tag of what the plan runs, which each step record carries (LAYOUT): its RAN_FIELDS
    and stage split, the dtype the run computes in (a CPU computes a bf16 plan in fp32, as it does a
    probed CPU's fp32 plan file), not the capacity factor (only the cost model's: routing is dropless)."""
    ran = {k: plan.get(k) for k in (*RAN_FIELDS, "stage_blocks") if k != "capacity_factor"}
    ran["dtype"] = compute_dtype
    return hashlib.sha256(json.dumps(ran, sort_keys=True, default=str).encode()).hexdigest()[:12]


def current_layout(records: list[dict]) -> list[dict]:
    """The records run under the last record's layout (LAYOUT); a record from before the tag existed
    counts as that layout."""
    tag = records[-1].get(LAYOUT) if records else None
    return [r for r in records if r.get(LAYOUT, tag) == tag]


def steady(records: list[dict]) -> list[dict]:
    """The step records medians are taken over: those of the current layout (`current_layout`) but
    the first and those flagged WARM_UP (the first after a resume or restart); all of the current
    layout's when that leaves none."""
    mine = current_layout(records)
    return [r for i, r in enumerate(mine) if i and not r.get(WARM_UP)] or mine


def summarize(run_dir: str | Path, predicted: dict | None, plan: dict, device: str,
              dtype: str = "fp32", rate: str = "tokens_per_s") -> dict:
    """Medians over the steps that did not warm up (`steady`), next to the plan's prediction;
    memory is the run's peak (the fullest rank's, over every step of this layout), what must fit. `rate`
    (`rate_key`) is the throughput key the text reports, recorded as "throughput_key"."""
    records = read_metrics(run_dir)
    kept, mine = steady(records), current_layout(records)
    kept_ids, mine_ids = {id(r) for r in kept}, {id(r) for r in mine}  # by identity: a dict compare per pair is O(N^2)
    measured = {k: statistics.median(r[k] for r in kept) for k in MEASURED} if kept else {}
    if records:
        measured["peak_memory_gib"] = max(r["peak_memory_gib"] for r in mine)
        measured["final_loss"] = records[-1]["loss"]
        val = [r["val_loss"] for r in records if "val_loss" in r]
        if val:
            measured["final_val_loss"] = val[-1]
    summary = {
        "steps": len(records),
        "warm_up_steps": [r["step"] for r in mine if id(r) not in kept_ids],  # left out of the medians
        "device": device,
        "compute_dtype": dtype,  # CPU runs compute in the parameters' dtype (fp32 unless built in bf16)
        "throughput_key": rate,  # added beside tokens_per_s and samples_per_s, which both stay
        "plan": {k: plan[k] for k in RAN_FIELDS if k in plan},
        "measured": measured,
        "predicted": None,
        "ratio_measured_over_predicted": None,
    }
    if len(mine) < len(records):  # resumed with another layout, recompute or dtype: those steps are another plan's
        summary["other_layout_steps"] = [r["step"] for r in records if id(r) not in mine_ids]
    ran = summary["plan"]
    if "zero" in ran and effective_zero(ran["zero"], ran.get("pp", 1)) != ran["zero"]:  # what ran, as it was priced
        ran["zero_planned"], ran["zero"] = ran["zero"], effective_zero(ran["zero"], ran.get("pp", 1))
    if predicted:
        summary["predicted"] = {k: predicted.get(k) for k in MEASURED}
        summary["predicted"]["peak_memory_gib"] = allocated_prediction_gib(predicted, device)
        summary["ratio_measured_over_predicted"] = {
            k: (measured[k] / summary["predicted"][k]) if summary["predicted"].get(k) and k in measured else None
            for k in MEASURED
        }
    else:
        # an inline plan, or a plan file's figures dropped where --model/--arg built another model (a
        # review: a plan file from `smplan plan`, so overridden, was told it lacked figures)
        summary["note"] = ("no predicted figures to compare: an inline plan has none, and a plan file's are not used "
                           "where --model/--arg build another model than it was priced for; `smplan plan` of the "
                           "model run gives them")
    (Path(run_dir) / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary
