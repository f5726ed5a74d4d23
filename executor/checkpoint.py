"""Checkpoints with torch.distributed.checkpoint, in atomically published step-N folders.

Every rank writes its shards into `.step-N.tmp`; rank 0 then adds `smplan.json` (step, plan
fingerprint and its inputs) and the `COMPLETE` marker, fsyncs, and renames the folder to `step-N`.
A folder without the marker (a crash mid-save) is never loaded. Parameter names do not
depend on the stage split or wrappers, so DCP can reshard a checkpoint across plans.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

MARKER = "COMPLETE"
META = "smplan.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
T = TypeVar("T")


class CheckpointMismatchError(ValueError):
    """The checkpoint folder holds a run of another plan or model."""


class CheckpointUnreadableError(RuntimeError):
    """No complete checkpoint of this run could be read back (its shards are damaged)."""


class CheckpointLoadError(RuntimeError):
    """Another rank failed to load a checkpoint for a reason other than damage (its log says why)."""


# A worker ends on these with their one line, not a traceback: they say what to change.
ONE_LINE_ERRORS = (CheckpointMismatchError, CheckpointUnreadableError, CheckpointLoadError)


def step_entries(root: str | Path) -> list[tuple[int, Path]]:
    """Everything in `root` named as a checkpoint is (step-N), complete or not, by step."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((int(match.group(1)), path) for path in root.iterdir() if (match := _STEP_DIR.match(path.name)))


def complete_steps(root: str | Path) -> list[tuple[int, Path]]:
    return [(step, path) for step, path in step_entries(root) if (path / MARKER).is_file() and (path / META).is_file()]


def prune(root: str | Path, keep: int, step: int, fingerprint: str) -> list[Path]:
    """After saving `step`, remove all but the newest `keep` of this run's complete checkpoints
    under `root` (torchtitan's checkpoint.keep_latest_k), `step` always among them. Only this
    run's are candidates: those of its fingerprint, at `step` or before. A later step (one that
    did not read back, which the run fell back from) and another plan's (a shared
    --checkpoint-dir, the one a --force-resume started from) stay; so does an unfinished save
    (.step-N.tmp). Returns the folders removed; keep <= 0 keeps every one."""
    if keep <= 0:
        return []
    ours = []
    for n, path in complete_steps(root):
        if n > step:
            continue
        try:
            same = read_meta(path).get("fingerprint") == fingerprint
        except (OSError, CheckpointMismatchError):  # unreadable: not ours to judge
            same = False
        if same:
            ours.append((n, path))
    old = [path for n, path in ours[:-keep] if n != step]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old


def latest(root: str | Path) -> tuple[int, Path] | None:
    steps = complete_steps(root)
    return steps[-1] if steps else None


def read_meta(path: Path) -> dict:
    try:
        meta = json.loads((path / META).read_text())
    except ValueError as err:  # a torn or hand-edited file: one line, not json's traceback
        raise CheckpointMismatchError(f"{path / META} is not valid JSON ({err}); move {path} aside to resume "
                                      "from the checkpoint before it") from None
    if not isinstance(meta, dict):
        raise CheckpointMismatchError(f"{path / META} holds no JSON object; move {path} aside to resume from the "
                                      "checkpoint before it")
    return meta


ANOTHER_PLAN_FIX = "use another --checkpoint-dir, or --force-resume to load (and reshard) it anyway"


def check_resumable(root: str | Path | None, fingerprint: str, force: bool,
                    fix: str = ANOTHER_PLAN_FIX, inputs: dict | None = None) -> tuple[int, Path] | None:
    """The checkpoint a run would resume from; refuses one of another plan unless forced,
    with `fix` (what the caller's user can change) as the advice and, given this run's
    fingerprint `inputs` (config.fingerprint_inputs), what changed since the checkpoint."""
    if not root:
        return None
    found = latest(root)
    if found is None:
        return None
    step, path = found
    meta = read_meta(path)
    theirs = meta.get("fingerprint")
    if theirs != fingerprint and not force:
        raise CheckpointMismatchError(
            f"checkpoint {path} was written by another plan or model ({_what_differs(meta, fingerprint, inputs)}); "
            f"{fix}")
    return found


def _what_differs(meta: dict, fingerprint: str, ours: dict | None) -> str:
    """What changed since the checkpoint, from the fingerprint inputs its meta keeps; only the
    fingerprints where it keeps none (an older checkpoint) or the caller gave none of its own."""
    from .config import describe_changes

    theirs = meta.get(FINGERPRINT_INPUTS)
    changes = describe_changes(theirs, ours) if isinstance(theirs, dict) and ours else ""
    if changes:
        return f"checkpoint -> this run: {changes}"
    return f"fingerprint {meta.get('fingerprint')} != {fingerprint}"


FINGERPRINT_INPUTS = "fingerprint_inputs"  # the meta key of what the fingerprint hashes
RUN_DIR = "run_dir"  # the meta key of the run folder (-o/--output) whose run wrote the checkpoint


def check_model(path: Path, model, fix: str) -> None:
    """Refuse checkpoint `path` unless its model part holds exactly `model`'s tensors (built on
    meta), shapes included: --force-resume reshards a checkpoint across plans, but DCP cannot load
    another model's (it raises on every rank after the launch, or silently loads a smaller model's
    blocks into a bigger one). Read from DCP's metadata alone, before anything starts."""
    from .init_from import open_source, shape_mismatch

    try:
        theirs = open_source(path).shapes
    except (*_READ_ERRORS, ValueError):  # damaged metadata: the workers report it and try the checkpoint before
        return
    why = shape_mismatch(theirs, model)
    if why:
        raise CheckpointMismatchError(f"checkpoint {path} holds another model: it {why}; {fix}")


def load_newest_readable(root: str | Path, fingerprint: str, force: bool, load: Callable[[Path], T],
                         gather: Callable[[tuple], list[tuple]],
                         report: Callable[[str], None] = lambda line: None,
                         inputs: dict | None = None) -> tuple[int, Path, T] | None:
    """Collective: loads the newest complete checkpoint every rank can read, newest first.

    The COMPLETE marker says every shard was written, not that it still reads back: a disk or
    a copy can lose a block later. A folder whose files fail to read on any rank is reported
    and the one before it tried, as long as it belongs to this run; none readable raises
    CheckpointUnreadableError. Any other failure (a shape that does not match the model under
    --force-resume, out of memory) is not damage: it is raised as it is, on every rank.
    `gather(x)` returns every rank's x in rank order (all_gather_object), so every rank takes
    the same branch and the report names each rank's own reason."""
    found = check_resumable(root, fingerprint, force, inputs=inputs)
    if found is None:
        return None
    failed, other_plan = [], None
    # newer ones were written after check_resumable looked: not one this run was refused or given
    candidates = [(step, path) for step, path in reversed(complete_steps(root)) if step <= found[0]]
    for index, (step, path) in enumerate(candidates):
        if path != found[1] and read_meta(path).get("fingerprint") != fingerprint and not force:
            other_plan = path  # an older run of another plan: not this run's to fall back to
            break
        error, loaded = None, None
        try:
            loaded, outcome = load(path), (_LOADED, None, "")
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # DCP's CheckpointException is a BaseException
            error = err
            outcome = (_UNREADABLE if _is_unreadable(err) else _FAILED, *_failure_reason(err))
        outcomes = gather(outcome)
        if all(code == _LOADED for code, _, _ in outcomes):
            return step, path, loaded
        if error is not None and outcome[0] == _FAILED:
            raise error
        broken = next((rank for rank, (code, _, _) in enumerate(outcomes) if code == _FAILED), None)
        if broken is not None:
            raise CheckpointLoadError(f"rank {broken} could not load {path} ({outcomes[broken][2]}); see its log")
        reasons = list(dict.fromkeys(f"rank {rank if who is None else who}: {why}"
                                     for rank, (code, who, why) in enumerate(outcomes) if code == _UNREADABLE))
        failed.append(f"{path.name} ({'; '.join(reasons)})")
        report(f"{path} could not be read ({'; '.join(reasons)})"
               + ("; trying the checkpoint before it" if index + 1 < len(candidates) else ""))
    before = f"; the one before them, {other_plan.name}, is another plan's" if other_plan else ""
    raise CheckpointUnreadableError(
        f"no checkpoint of this run in {root} could be read: {' | '.join(failed)}{before}; move the damaged "
        "step-N folders aside to resume from an older one, or start over in another -o/--output (and another "
        "--checkpoint-dir, where one was given)")


_LOADED, _UNREADABLE, _FAILED = 0, 1, 2


# What reading a damaged file raises: a missing or short file (OSError, EOFError), torch.load's
# pickle of garbage (UnpicklingError), torch's zip reader on a cut archive ("PytorchStreamReader
# failed reading zip archive"). Seen with truncated DCP shards, .metadata and rank-N.pt here.
class UnreadableFileError(Exception):
    """A checkpoint's file that does not read back: garbage where torch.load expects its archive
    (a zeroed rank-N.pt raises KeyError "filename 'storages' not found", other bytes ValueError),
    or missing beside the other ranks' files."""


_READ_ERRORS = (OSError, EOFError, pickle.UnpicklingError, UnreadableFileError)
_READ_ERROR_TEXT = ("PytorchStreamReader", "zip archive")
# torch 2.13's DCP load asserts when no metadata reads back (state_dict_loader.py: "metadata is None;
# global metadata read failed: <the UnpicklingError or FileNotFoundError>"), the cause kept as text only
_METADATA_READ_TEXT = "metadata read failed"


def _is_unreadable(err: BaseException) -> bool:
    failures = getattr(err, "failures", None)  # torch.distributed.checkpoint.api.CheckpointException
    if isinstance(failures, dict) and failures:
        return all(_is_unreadable(_inner(f)) for f in failures.values())
    return (isinstance(err, _READ_ERRORS)
            or (isinstance(err, RuntimeError) and any(text in str(err) for text in _READ_ERROR_TEXT))
            or (isinstance(err, AssertionError) and _METADATA_READ_TEXT in str(err)))


def _inner(failure) -> BaseException:
    return failure[0] if isinstance(failure, tuple) else failure  # DCP keeps (exception, traceback)


def _failure_reason(err: BaseException) -> tuple[int | None, str]:
    """(the rank that failed, when DCP says; one line of why). DCP gathers every rank's
    exception into one CheckpointException whose text is their tracebacks; the first failed
    rank's exception says what went wrong."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        rank = min(failures)
        return rank, _failure_reason(_inner(failures[rank]))[1]
    text = str(err).strip().splitlines()
    if not text:
        return None, type(err).__name__
    first = text[0]
    if len(first) > 160 and ". " in first:  # torch's zip reader goes on with advice: its first sentence says it
        first = first.split(". ")[0] + "."
    return None, f"{type(err).__name__}: {first if len(first) <= 300 else first[:299] + '…'}"


def _fsync_tree(path: Path) -> None:
    for item in sorted(path.rglob("*")):
        if item.is_file():
            fd = os.open(item, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def train_state(chunks, optimizers) -> dict:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    flat = StateDictOptions(flatten_optimizer_state_dict=True)
    model, optim = {}, {}
    for chunk, opt in zip(chunks, optimizers, strict=True):
        model.update(get_model_state_dict(chunk))
        optim.update(get_optimizer_state_dict(chunk, opt, options=flat))
    return {"model": model, "optim": optim}


def load_train_state(chunks, optimizers, path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state = train_state(chunks, optimizers)
    dcp.load(state, checkpoint_id=str(path))
    for chunk, opt in zip(chunks, optimizers, strict=True):
        set_model_state_dict(chunk, state["model"], options=StateDictOptions(strict=False))
        set_optimizer_state_dict(chunk, opt, state["optim"],
                                 options=StateDictOptions(flatten_optimizer_state_dict=True))


def rng_state(device) -> dict:
    """This rank's random generators: torch's CPU one, the device's, Python's and numpy's
    (when loaded). Dropout draws from them, and differs per rank (TP shards, pipeline
    stages), so every rank keeps its own."""
    import random
    import sys

    import torch

    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    if "numpy" in sys.modules:
        state["numpy"] = sys.modules["numpy"].random.get_state()
    return state


def set_rng_state(state: dict, device) -> None:
    import random

    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])


def rank_state_file(path: Path, rank: int) -> Path:
    return Path(path) / f"rank-{rank}.pt"


def _rank_files_written(path: Path) -> int:
    """How many rank-N.pt files checkpoint `path`'s writer kept: its world size (the plan in
    smplan.json; ep folds into dp x tp x cp) where it kept them, 0 for a checkpoint from before
    they were kept or with unreadable metadata. A reshard onto more ranks finds none of its own."""
    try:
        meta = read_meta(path)
        plan = meta.get("plan") or {}
        world = math.prod(int(plan.get(k) or 1) for k in ("dp", "tp", "pp", "cp"))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0
    # recorded since a one-rank writer's lost rank-0.pt looked like a checkpoint without them
    kept = meta.get("rank_states", any(Path(path).glob("rank-*.pt")))
    return world if kept else 0


def load_rank_state(path: Path, rank: int) -> dict | None:
    """What `save` kept of this rank alone (RNG states); None for a checkpoint without it."""
    import torch

    file = rank_state_file(path, rank)
    if not file.is_file():
        if rank < _rank_files_written(path):  # its writer kept one for this rank: lost since
            raise UnreadableFileError(f"{file.name} is missing")
        # a checkpoint written before per-rank states were kept, or by fewer ranks (--force-resume
        # reshards it onto more: the new ranks start their own RNG streams)
        return None
    try:
        return torch.load(file, weights_only=False)
    except ImportError:  # a package gone since the save: not the file's damage
        raise
    except Exception as err:  # noqa: BLE001 - garbage raises anything (KeyError, AttributeError, MemoryError...)
        why = (str(err).strip().splitlines() or [""])[0]
        raise UnreadableFileError(f"{file.name} does not read back ({type(err).__name__}: {why})") from err


def save(root: str | Path, step: int, chunks, optimizers, meta: dict, rank: int, barrier,
         rank_state: dict | None = None) -> Path:
    """Collective: every rank calls it. Returns the published folder.

    `rank_state` is this rank's own (its RNG states differ from every other rank's, so DCP,
    which keeps one copy of a replicated key, cannot hold it): one file per rank."""
    import torch
    import torch.distributed.checkpoint as dcp

    root = Path(root)
    tmp, final = root / f".step-{step}.tmp", root / f"step-{step}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a crash mid-save
    barrier()
    dcp.save(train_state(chunks, optimizers), checkpoint_id=str(tmp))
    if rank_state is not None:
        file = rank_state_file(tmp, rank)
        torch.save(rank_state, file)
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    barrier()
    if rank == 0:
        (tmp / META).write_text(json.dumps({**meta, "step": step, "rank_states": rank_state is not None}, indent=2) + "\n")
        _fsync_tree(tmp)
        (tmp / MARKER).write_text("ok\n")
        _fsync_tree(tmp)
        if final.exists():  # the same step saved again after a restart
            old = root / f".step-{step}.old"
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        tmp.rename(final)
        _fsync_dir(root)
    barrier()
    return final
