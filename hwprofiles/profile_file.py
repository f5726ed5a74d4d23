"""Write a calibrated profile: the original TOML with a new `[efficiency]` table and the
values that `--hw-set` changed.

The rest of the file is kept byte for byte, so the comments that cite each number's
source (datasheet, probe) survive calibration.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

from .cluster import Efficiency, HardwareProfileError, from_dict
from .loader import PROFILE_DIR, load_cluster
from .paths import toml_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_TABLE = re.compile(r"^\s*\[([^\]]+)\]")


def profile_path(name_or_path: str) -> Path:
    """The file behind `--hw NAME|PATH` (same lookup as `loader.read_profile`)."""
    path = toml_path(name_or_path, PROFILE_DIR)
    if path is None:
        raise HardwareProfileError(f"unknown hardware profile {name_or_path!r}; use a bundled name (smplan hw list) or a .toml path")
    if not path.is_file():
        raise HardwareProfileError(f"hardware file {str(path)!r} does not exist; check the path or run `smplan hw probe -o {path}`")
    return path


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
        value = getattr(efficiency, f.name)
        table.append(f"{f.name} = {value!r}" if isinstance(value, str) else f"{f.name} = {float(value):.6g}")
    return "\n".join(kept + table) + "\n"


def with_values(text: str, values: dict[str, object], note: str = "set by --hw-set") -> str:
    """`text` with each dotted key (`inter_node.bandwidth_gbps`) set to its value, in place
    where the key already is, else under its table (added at the end if missing). Each
    changed line carries `# note`. Raises HardwareProfileError if the result would not
    read back with exactly these values (e.g. the file writes the table inline)."""
    lines = text.splitlines()
    for key, value in values.items():
        table, _, leaf = key.rpartition(".")
        lines = _set_line(lines, table, leaf, f"{leaf} = {_toml_value(value)}  # {note}")
    out = "\n".join(lines) + "\n"
    try:
        want = from_dict(tomllib.loads(text)).with_overrides(values)
        got = from_dict(tomllib.loads(out))
        wrong = [k for k in values if got.get(k) != want.get(k)]
    except (tomllib.TOMLDecodeError, HardwareProfileError) as err:
        wrong = [f"{', '.join(values)} ({err})"]
    if wrong:
        raise HardwareProfileError(
            f"cannot write {', '.join(wrong)} into a copy of this profile's TOML; edit the source "
            "file to hold the value instead of passing it as --hw-set"
        )
    return out


def _table_name(line: str) -> str | None:
    match = _TABLE.match(line)
    if not match or line.lstrip().startswith("[["):
        return None
    return "".join(match.group(1).split()).replace('"', "").replace("'", "")


def _set_line(lines: list[str], table: str, leaf: str, new: str) -> list[str]:
    key_line = re.compile(rf"^\s*{re.escape(leaf)}\s*=")
    current, header, first_table = "", None, None
    for i, line in enumerate(lines):
        name = _table_name(line)
        if name is not None:
            current = name
            first_table = i if first_table is None else first_table
            if name == table:
                header = i
        elif current == table and key_line.match(line):
            return [*lines[:i], new, *lines[i + 1:]]
    if header is not None:
        return [*lines[:header + 1], new, *lines[header + 1:]]
    if not table:  # a top-level key goes before the first table
        at = len(lines) if first_table is None else first_table
        while at > 0 and not lines[at - 1].strip():
            at -= 1
        return [*lines[:at], new, *lines[at:]]
    return [*lines, "", f"[{table}]", new]


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def check_writable(path: str | Path, force: bool = False, option: str = "-o") -> Path:
    """Reject an output path before any work is spent on it: an existing file needs `force`."""
    path = Path(path)
    if path.exists() and not force:
        raise HardwareProfileError(f"{path} exists; pass --force to overwrite it or choose another {option}")
    if path.is_dir():
        raise HardwareProfileError(f"{path} is a folder; choose a file name for {option}")
    if not path.parent.is_dir():
        raise HardwareProfileError(f"folder {str(path.parent)!r} does not exist; create it or choose another {option}")
    return path


def write_profile(text: str, path: str | Path, force: bool = False) -> Path:
    """Write `text` to `path` only if it loads back (passes validation): through a temporary
    file and an atomic rename, so a failure leaves whatever was at `path` untouched."""
    return write_checked(text, path, lambda p: load_cluster(p), "profile", force)


def write_checked(text: str, path: str | Path, load, what: str, force: bool = False, option: str = "-o") -> Path:
    """Write `text` to `path` only if `load(a temporary copy)` accepts it, then rename it into place;
    a HardwareProfileError (or subclass) from `load` becomes one line naming `path`."""
    path = check_writable(path, force, option)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        try:
            load(str(tmp))
        except HardwareProfileError as err:
            why = str(err).replace(str(tmp), str(path))
            raise type(err)(f"the {what} would not load ({why}); nothing written to {path}") from None
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
