"""What a launch finds in its run directory (-o/--output) and claims of it: the run already
there (its run_config.json, the checkpoint folder it wrote to, the interval it saved at), and the
records a new launch sets aside, to put back should it end before its workers start.

Every refusal here is one PlanMismatchError line (exit code 2 on the CLI).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from . import checkpoint
from .config import RunConfig
from .metrics import (
    CHECKPOINTS_DIR,
    METRICS_FILE,
    RUN_CONFIG_FILE,
    SBATCH_FILE,
    STOPPED_FILE,
    SUMMARY_FILE,
    clear_stopped,
    present_run_entries,
    rank_files,
    read_metrics,
)
from .validate import PlanMismatchError


def start_afresh(out: Path, checkpoint_dir: str | None) -> str:
    """What starts a plan afresh instead of resuming the checkpoint it would find: a new run
    directory, as `out` continues the run it holds, unless only --checkpoint-dir names that checkpoint."""
    if checkpoint_dir is None:
        return "pass another -o/--output to start afresh in a new run directory"
    if out.is_dir() and read_metrics(out):
        return "pass another -o/--output and --checkpoint-dir to start afresh"
    return "pass another --checkpoint-dir to start afresh"


def earlier_config(out: Path) -> RunConfig | None:
    """The run_config.json of the run already in `out`, or None when there is none to read."""
    try:
        return RunConfig.load(out / RUN_CONFIG_FILE)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def is_run_config(path: Path) -> bool:
    """Whether `path` is a run_config.json that `execute` wrote (a JSON object naming a plan and
    its fingerprint), not a user's file of that name; fields of other versions are fine."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"plan", "fingerprint"} <= data.keys()


def recorded_checkpoint_dir(out: Path) -> str | None:
    """The --checkpoint-dir the run in `out` wrote to (its run_config.json), when it holds a
    checkpoint: `execute -o RUN_DIR` continues that run as it continues one in RUN_DIR/checkpoints.
    A run folder copied or moved elsewhere keeps the old path to its own checkpoints: those are
    the copy's RUN_DIR/checkpoints now, not the original's to write into."""
    earlier = earlier_config(out)
    recorded = earlier.checkpoint_dir if earlier is not None else None
    if recorded and earlier.out_dir and Path(recorded) == Path(earlier.out_dir) / CHECKPOINTS_DIR:
        return None
    return recorded if recorded and checkpoint.latest(recorded) else None


def earlier_checkpoint_every(out: Path, ckpt_dir: str | None) -> int:
    """The --checkpoint-every of the run this one continues (its run_config.json), so that a
    resumed run keeps checkpointing as it did and a later resume does not redo its steps; 0
    when there is nothing to continue or it cannot be read."""
    earlier = earlier_config(out) if ckpt_dir and checkpoint.latest(ckpt_dir) else None
    try:
        return max(0, int(earlier.checkpoint_every)) if earlier is not None else 0
    except (ValueError, TypeError):  # a hand-edited value
        return 0


def keep_a_slurm_script(out: Path, launcher: str) -> None:
    """A folder holding a Slurm script that has not run yet (no steps) is that job's: writing
    another script, or launching here, would rewrite its run_config.json (and a user's edits of
    the script) under it."""
    script = out / SBATCH_FILE
    if not script.is_file() or read_metrics(out):
        return
    if launcher == "slurm":
        raise PlanMismatchError(f"{out} already holds a Slurm script ({SBATCH_FILE}); submit it (sbatch "
                                f"{shlex.quote(str(script))}), or pass another -o/--output (delete the script to "
                                "write it anew)")
    raise PlanMismatchError(f"{out} holds a Slurm script not yet run ({SBATCH_FILE}); submit it (sbatch "
                            f"{shlex.quote(str(script))}), or pass another -o/--output to run here")


def claim_run_dir(out: Path, ckpt_dir: str | None, world: int) -> EarlierRecords | None:
    """A run directory holds one run: a new run may only continue the steps already there
    from a checkpoint. Its summary (of the earlier, finished part) and the records of ranks
    this run does not have would otherwise pass for this run's. Returns what it set aside of
    the earlier run, to put back should the launch end before any worker starts (None: no steps there)."""
    own_checkpoints = ckpt_dir is not None and Path(ckpt_dir) == out / CHECKPOINTS_DIR  # resumed from, not replaced
    if out.is_dir() and not is_run_config(out / RUN_CONFIG_FILE):
        theirs = [name for name in present_run_entries(out) if not (name == CHECKPOINTS_DIR and own_checkpoints)]
        if theirs:
            raise PlanMismatchError(
                f"{out} is not a run directory of `smplan execute` but holds {', '.join(theirs)}, which a run "
                "writes; pass a new or empty folder to -o/--output (and --checkpoint-dir DIR to resume from a "
                "checkpoint folder)")
    steps = read_metrics(out) if out.is_dir() else []
    if steps and not (ckpt_dir and checkpoint.latest(ckpt_dir)):
        raise PlanMismatchError(
            f"{out} already holds a run ({len(steps)} steps) and no checkpoint to resume it from; "
            "pass another -o/--output, or delete that folder to start over")
    earlier = EarlierRecords.take(out, world) if steps else None
    clear_stopped(out)  # a stopped run continues (either launcher): `monitor --follow` waits for it again
    if not steps:
        return None
    (out / SUMMARY_FILE).unlink(missing_ok=True)
    for rank, file in rank_files(out).items():
        if rank >= world:
            file.unlink()
    return earlier


@dataclass
class EarlierRecords:
    """The files of the run in a folder that a launch rewrites or removes before its workers start
    (run_config.json, summary.json, stopped.json, records of ranks it lacks), with metrics.jsonl's
    stamp: the workers rewrite that once they have resumed. A launch that ends before its workers
    start changed nothing of the run, so its records go back as they were; once they ran (and failed
    or were stopped, even while loading the checkpoint), stopped.json says how, as for any run."""

    files: dict[Path, bytes | None]  # None: was not there
    metrics_stamp: tuple | None

    @classmethod
    def take(cls, out: Path, world: int) -> EarlierRecords:
        paths = [out / RUN_CONFIG_FILE, out / SUMMARY_FILE, out / STOPPED_FILE,
                 *(file for rank, file in rank_files(out).items() if rank >= world)]
        return cls({path: path.read_bytes() if path.is_file() else None for path in paths}, _stamp(out / METRICS_FILE))

    def started(self, out: Path) -> bool:
        return _stamp(out / METRICS_FILE) != self.metrics_stamp

    def put_back(self) -> None:
        for path, data in self.files.items():
            if data is None:
                path.unlink(missing_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)


def _stamp(path: Path) -> tuple | None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns
