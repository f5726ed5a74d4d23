"""How `--hw` and `--stack` tell a bundled name from a path to a TOML file."""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def is_path(name_or_path: str) -> bool:
    """`--hw` / `--stack` take a path when the text ends in .toml or names an existing file,
    else a bundled name: a folder of the same name in the working directory (a `torchtitan`
    checkout, a `whatif -o h100x8` report) does not hide the bundled profile."""
    path = Path(name_or_path)
    return path.suffix == ".toml" or path.is_file()


def recorded_ref(name_or_path: str) -> str:
    """A --hw or --stack value as a plan file records it: a bundled name, or a path made
    absolute (`is_path`'s rule), so the file simulates from any folder on the hardware it names."""
    return str(Path(name_or_path).resolve()) if is_path(name_or_path) else name_or_path


def same_toml(a: str, b: str, folder: Path) -> bool:
    """Whether two --hw (or --stack) values name one file: equal, or a bundled name (looked up in
    `folder`) and a path, or two paths, that resolve to it."""
    if a == b:
        return True
    path_a, path_b = toml_path(a, folder), toml_path(b, folder)
    return path_a is not None and path_b is not None and path_a.resolve() == path_b.resolve()


def toml_path(name_or_path: str, folder: Path) -> Path | None:
    """The file `name_or_path` means (`is_path`'s rule; names are looked up in `folder`), or
    None for a name with no bundled file. A path is returned whether or not it exists."""
    if is_path(name_or_path):
        return Path(name_or_path)
    bundled = folder / f"{name_or_path}.toml"
    return bundled if bundled.exists() else None


def looks_like_folder(name_or_path: str) -> bool:
    """A text that is no bundled name but a path to a folder (`--hw runs/`): a bare name that is also
    a folder here (`mine`) is still read as a name (is_path's rule)."""
    return ("/" in name_or_path or os.sep in name_or_path) and Path(name_or_path).is_dir()


def did_you_mean(name: str, names: list[str]) -> str:
    """' (did you mean X?)' for the closest of `names`, case aside (`H100x8`, `torchtian`), else ''."""
    lowered = {n.lower(): n for n in names}
    near = difflib.get_close_matches(name.lower(), list(lowered), n=1)
    return f" (did you mean {lowered[near[0]]!r}?)" if near else ""


def read_toml(path: Path, what: str, error: type[Exception]) -> dict:
    """Parsed TOML of `path` (a "hardware file", a "stack file"); any problem is one `error` line."""
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise error(f"{what} {str(path)!r} is not valid TOML: {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"cannot read {what} {str(path)!r}: {err}") from None
    except ValueError:  # int() refuses literals over sys.get_int_max_str_digits() (4300) digits
        raise error(f"{what} {str(path)!r} has a number over {sys.get_int_max_str_digits()} digits long; "
                    "no value is that large, fix it") from None
