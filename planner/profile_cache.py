"""On-disk cache of ModelProfiles, so profiling a model twice costs one file read.

Key: (sha256 of the model file, builder name, builder args, seq_len, dtype, profiler
version). An entry also records the sha256 of each module the model file's import loaded from
its own folder (`from lm import Block`), by its path in that folder, and is stale once the file
there differs (edited, gone, or another folder's lm.py beside the same model.py: a review found
an edited lm.py priced as before). Code imported from elsewhere (an installed package, a module
imported inside the builder) is not tracked: delete the entry, or the profiles folder, then.
Directory: $SMPLAN_CACHE_DIR, else ~/.cache/smplan; one JSON file per profile under
`profiles/`. A file that does not parse is ignored and rewritten; a cache directory that
cannot be written only costs the speed-up.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from .model_profile import ModelProfile


def cache_dir() -> Path:
    root = os.environ.get("SMPLAN_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "smplan"


def key(**fields) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=repr).encode()).hexdigest()[:32]


def path_for(cache_key: str) -> Path:
    return cache_dir() / "profiles" / f"{cache_key}.json"


def file_sha256(path: str | Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def load(cache_key: str, folder: str | Path | None = None) -> ModelProfile | None:
    """The cached profile, or None when there is none, it does not parse, or a file it depends on
    (by its path in `folder`, the model file's) differs from the one it was stored with."""
    path = path_for(cache_key)
    try:
        data = json.loads(path.read_text())
        if data.get("key") != cache_key:
            return None
        depends = data["depends"]  # every entry records it (PROFILER_VERSION 35)
        if depends and (folder is None or any(file_sha256(Path(folder) / rel) != digest
                                              for rel, digest in depends.items())):
            return None  # a module the model file imports differs: profile again and overwrite
        return ModelProfile.from_dict(data["profile"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # missing or corrupt: profile again and overwrite


def store(cache_key: str, profile: ModelProfile, depends: list[Path] | tuple[Path, ...] = (),
          folder: str | Path | None = None) -> Path | None:
    """Write the entry; `depends`: files in `folder` (the model file's) whose change makes it stale
    (their sha256 is kept by their path there)."""
    path = path_for(cache_key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        digests = {str(Path(file).relative_to(folder)): file_sha256(file)
                   for file in depends if folder and Path(file).is_relative_to(folder)}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"key": cache_key, "profile": profile.to_dict(), "depends": digests}, f)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
        return path
    except OSError:
        return None
