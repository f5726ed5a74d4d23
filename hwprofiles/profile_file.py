"""Write a calibrated profile: the original TOML with a new `[efficiency]` table.

The rest of the file is kept byte for byte, so the comments that cite each number's
source (datasheet, probe) survive calibration.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from .cluster import Efficiency, HardwareProfileError
from .loader import PROFILE_DIR, load_cluster

_TABLE = re.compile(r"^\s*\[([^\]]+)\]")


def profile_path(name_or_path: str) -> Path:
    """The file behind `--hw NAME|PATH` (same lookup as `loader.read_profile`)."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise HardwareProfileError(f"hardware file {str(path)!r} does not exist; check the path or run `smplan hw probe -o {path}`")
        return path
    bundled = PROFILE_DIR / f"{name_or_path}.toml"
    if not bundled.is_file():
        raise HardwareProfileError(f"unknown hardware profile {name_or_path!r}; use a bundled name (smplan hw list) or a .toml path")
    return bundled


def with_efficiency(text: str, efficiency: Efficiency, notes: list[str] | tuple[str, ...] = ()) -> str:
    """`text` without its `[efficiency]` table, then a new one holding `efficiency`."""
    kept, skipping = [], False
    for line in text.splitlines():
        match = _TABLE.match(line)
        if match:
            skipping = match.group(1).strip() == "efficiency"
        if not skipping:
            kept.append(line)
    while kept and not kept[-1].strip():
        kept.pop()
    table = ["", *(f"# {n}" for n in notes), "[efficiency]"]
    for f in dataclasses.fields(efficiency):
        table.append(f"{f.name} = {float(getattr(efficiency, f.name)):.6g}")
    return "\n".join(kept + table) + "\n"


def write_profile(text: str, path: str | Path, force: bool = False) -> Path:
    """Write `text` to `path` and load it back (it must pass validation); never clobber silently."""
    path = Path(path)
    if path.exists() and not force:
        raise HardwareProfileError(f"{path} exists; pass --force to overwrite it or choose another -o")
    if path.parent and not path.parent.exists():
        raise HardwareProfileError(f"folder {str(path.parent)!r} does not exist; create it or choose another -o")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    try:
        load_cluster(str(tmp))
    except HardwareProfileError as err:
        tmp.unlink()
        raise HardwareProfileError(f"the calibrated profile would not load ({err}); nothing written") from None
    tmp.replace(path)
    return path
