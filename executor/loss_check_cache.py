"""The models whose loss was already seen to take their forward's outputs, kept on disk.

validate_plan runs a model file's forward on the meta device before a launch, to refuse in one
line a loss that cannot take what the forward returns (validate._check_default_loss and
_check_own_loss). In a fresh process that forward costs seconds (2.3 s for examples/gpt.py:tiny
on 2 cores: torch's Python meta kernels and torch._dynamo are imported at its first call), paid
again by every resume, second layout or longer run of the same model. A check that passed is
recorded here, and the next launch of the same model skips it.

Key: the model file's sha256, that of each module it imports from its own folder (as
planner.profile_cache tracks them), the builder, its arguments, the micro-batch batch() is
called with, whether the loss is the file's own, and CHECK_VERSION. Code imported from
elsewhere is not tracked, as in the profile cache. Entries are empty files under
$SMPLAN_CACHE_DIR/loss_checked/; a cache that cannot be written only costs the speed-up.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from smplan.planner.profile_cache import cache_dir, key

CHECK_VERSION = 1  # bump when the loss checks accept something else


def _entry(model_file, args: dict, micro_batch: int, own_loss: bool) -> Path | None:
    if not getattr(model_file, "sha256", ""):
        return None  # no file digest (not a model file): not kept
    try:
        imported = {str(f): hashlib.sha256(Path(f).read_bytes()).hexdigest()
                    for f in getattr(model_file, "local_files", ())}
    except OSError:
        return None  # a module it imported is gone: check again
    digest = key(file_sha256=model_file.sha256, builder=model_file.builder_name, args=args, imported=imported,
                 micro_batch=micro_batch, own_loss=own_loss, version=CHECK_VERSION)
    return cache_dir() / "loss_checked" / digest


def passed_before(model_file, args: dict, micro_batch: int, own_loss: bool) -> bool:
    entry = _entry(model_file, args, micro_batch, own_loss)
    return entry is not None and entry.is_file()


def record_pass(model_file, args: dict, micro_batch: int, own_loss: bool) -> None:
    entry = _entry(model_file, args, micro_batch, own_loss)
    if entry is None:
        return
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.touch()
    except OSError:
        pass  # read-only or full: the next launch checks again
