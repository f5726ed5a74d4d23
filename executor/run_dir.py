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


def _explicit_checkpoint_dir(earlier: RunConfig | None) -> str | None:
    """The --checkpoint-dir the run of `earlier` (a run_config.json) wrote to, None for its own
    RUN_DIR/checkpoints. A run folder copied or moved elsewhere keeps the old path to its own
    checkpoints: those are the copy's RUN_DIR/checkpoints now, not the original's to write into."""
    recorded = earlier.checkpoint_dir if earlier is not None else None
    if recorded and earlier.out_dir and Path(recorded) == Path(earlier.out_dir) / CHECKPOINTS_DIR:
        return None
    return recorded


def recorded_checkpoint_dir(out: Path) -> str | None:
    """The --checkpoint-dir the run in `out` wrote to (its run_config.json), when it holds a
    checkpoint: `execute -o RUN_DIR` continues that run as it continues one in RUN_DIR/checkpoints."""
    recorded = _explicit_checkpoint_dir(earlier_config(out))
    return recorded if recorded and checkpoint.latest(recorded) else None


def refuse_checkpoints_not_ours(ckpt_dir: Path, out: Path, keep: int) -> None:
    """Refuse a run that saves into `ckpt_dir` while it holds step-N entries the run did not write:
    its saves would replace them, --keep-checkpoints prune them, and their own run would resume from
    this one's steps. Another run's checkpoints (a --checkpoint-dir shared with it), or a folder of
    the user's with a checkpoint's name. The run's own are the complete checkpoints its folder `out`
    wrote (their meta's run_dir); in RUN_DIR/checkpoints every complete one (copied there to be
    continued); in the --checkpoint-dir its run_config.json records also those that name no writer
    (written before the key) or the folder the run was moved from."""
    earlier = earlier_config(out)
    recorded = _explicit_checkpoint_dir(earlier)
    ours = {str(out)} | ({None, earlier.out_dir} if recorded and Path(recorded).resolve() == ckpt_dir else set())
    complete = {path for _, path in checkpoint.complete_steps(ckpt_dir)}
    theirs = {}  # step-N -> the run folder that wrote it (None: not a checkpoint, or it does not say)
    for _, path in checkpoint.step_entries(ckpt_dir):
        if path not in complete:
            theirs[path] = None
        elif ckpt_dir != out / CHECKPOINTS_DIR and (writer := _writer(path)) not in ours:
            theirs[path] = writer
    if not theirs:
        return
    names = ", ".join(path.name for path in list(theirs)[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
    runs = sorted({writer for writer in theirs.values() if writer})
    fixes = [f"start from their weights with --init-from {ckpt_dir}" if complete & theirs.keys() else "move them aside"]
    if len(runs) == 1:
        fixes.append(f"continue that run with -o {runs[0]}")
    fixes.append("pass another -o/--output" if ckpt_dir == out / CHECKPOINTS_DIR
                 else "give this run a --checkpoint-dir of its own (or none: RUN_DIR/checkpoints)")
    raise PlanMismatchError(
        f"{ckpt_dir} holds {names}, which this run did not write{f' (the run in {runs[0]} did)' if len(runs) == 1 else ''}"
        f": its checkpoints would replace {'or prune ' if keep else ''}them there; {', '.join(fixes[:-1])}, or {fixes[-1]}")


def _writer(path: Path) -> str | None:
    """The run folder that wrote checkpoint `path` (its meta's run_dir; None when it does not say,
    "" when its meta does not read)."""
    try:
        return checkpoint.read_meta(path).get(checkpoint.RUN_DIR)
    except checkpoint.CheckpointMismatchError:  # torn: not known to be this run's
        return ""


def earlier_checkpoint_setting(out: Path, ckpt_dir: str | None, field: str = "checkpoint_every") -> int:
    """The --checkpoint-every (or another checkpoint count, `field`: "keep_checkpoints") of the run
    this one continues (its run_config.json), so that a resumed run keeps checkpointing, and
    pruning, as it did and a later resume does not redo its steps; 0 when there is nothing to
    continue or it cannot be read."""
    earlier = earlier_config(out) if ckpt_dir and checkpoint.latest(ckpt_dir) else None
    try:
        return max(0, int(getattr(earlier, field))) if earlier is not None else 0
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

    def stopped(self, out: Path) -> bytes | None:
        """The earlier attempt's stopped.json, as it was before this launch cleared it."""
        return self.files.get(out / STOPPED_FILE)

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
