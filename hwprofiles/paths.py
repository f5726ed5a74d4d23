"""How `--hw` and `--stack` tell a bundled name from a path to a TOML file."""

from __future__ import annotations

from pathlib import Path


def is_path(name_or_path: str) -> bool:
    """`--hw` / `--stack` take a path when the text ends in .toml or names an existing file,
    else a bundled name."""
    path = Path(name_or_path)
    return path.suffix == ".toml" or path.exists()


def toml_path(name_or_path: str, folder: Path) -> Path | None:
    """The file `name_or_path` means (`is_path`'s rule; names are looked up in `folder`), or
    None for a name with no bundled file. A path is returned whether or not it exists."""
    if is_path(name_or_path):
        return Path(name_or_path)
    bundled = folder / f"{name_or_path}.toml"
    return bundled if bundled.exists() else None
