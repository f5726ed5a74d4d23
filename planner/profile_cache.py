"""On-disk cache of ModelProfiles, so profiling a model twice costs one file read.

Key: (sha256 of the model file, builder name, builder args, seq_len, dtype, profiler
version). Only the model file itself is hashed: a model file that imports code from
elsewhere is not re-profiled when that code changes (pass --no-cache then).
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


def load(cache_key: str) -> ModelProfile | None:
    path = path_for(cache_key)
    try:
        data = json.loads(path.read_text())
        if data.get("key") != cache_key:
            return None
        return ModelProfile.from_dict(data["profile"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # missing or corrupt: profile again and overwrite


def store(cache_key: str, profile: ModelProfile) -> Path | None:
    path = path_for(cache_key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"key": cache_key, "profile": profile.to_dict()}, f)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
        return path
    except OSError:
        return None
