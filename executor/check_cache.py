"""The checks of a model that validate_plan has seen it pass, kept on disk.

validate_plan runs a model file's forward on the meta device before a launch: to refuse in one
line a loss that cannot take what the forward returns (validate._check_default_loss and
_check_own_loss), a model that cannot be cut into pipeline stages (pp > 1), expert banks that
cannot be split (ep > 1). In a fresh process the first such forward costs seconds (2.3 s for
examples/gpt.py:tiny on 2 cores: torch's Python meta kernels and torch._dynamo are imported at
its first call), paid again by every resume, second layout or longer run of the same model. A
check that passed is recorded here by its name, and the next launch of the same model skips it.

Key: the check's name, the model file's sha256, that of each module it imports from its own
folder (as planner.profile_cache tracks them), the builder, its arguments, the micro-batch
batch() is called with, and CHECK_VERSION. Code imported from elsewhere is not tracked, as in
the profile cache. Entries are empty files under $SMPLAN_CACHE_DIR/checks_passed/; a cache that
cannot be written only costs the speed-up.
"""

from __future__ import annotations

from pathlib import Path

from smplan.planner.profile_cache import cache_dir, file_sha256, key

CHECK_VERSION = 1  # bump when a check accepts something else


def _entry(check: str, model_file, args: dict, micro_batch: int) -> Path | None:
    if not getattr(model_file, "sha256", ""):
        return None  # no file digest (not a model file): not kept
    imported = {str(f): file_sha256(f) for f in getattr(model_file, "local_files", ())}
    if None in imported.values():
        return None  # a module it imported is gone or unreadable: check again
    digest = key(check=check, file_sha256=model_file.sha256, builder=model_file.builder_name, args=args,
                 imported=imported, micro_batch=micro_batch, version=CHECK_VERSION)
    return cache_dir() / "checks_passed" / digest


def passed_before(check: str, model_file, args: dict, micro_batch: int) -> bool:
    entry = _entry(check, model_file, args, micro_batch)
    return entry is not None and entry.is_file()


def record_pass(check: str, model_file, args: dict, micro_batch: int) -> None:
    entry = _entry(check, model_file, args, micro_batch)
    if entry is None:
        return
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.touch()
    except OSError:
        pass  # read-only or full: the next launch checks again
