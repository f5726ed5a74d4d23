"""Checks of command-line values that click's own types let through: NaN and infinite
numbers, output files in missing folders or with the wrong suffix, files that exist."""

from __future__ import annotations

import errno
import math
import os
import tempfile
from pathlib import Path

import click

from .main import UserError


class FiniteFloat(click.ParamType):
    """A finite float greater than 0 (or >= 0), at most `max_value`: click's FloatRange
    accepts "nan" and "inf", which then crash (or hang) far from the option."""

    name = "float"

    def __init__(self, allow_zero: bool = False, max_value: float | None = None, limit_note: str = ""):
        self.allow_zero = allow_zero
        self.max_value = max_value
        self.limit_note = limit_note

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            number = value
        else:
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise UserError(f"{_opt(param)} must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise UserError(f"{_opt(param)} must be a finite number, got {value}")
        if number < 0 or (number == 0 and not self.allow_zero):
            bound = "0 or more" if self.allow_zero else "greater than 0"
            raise UserError(f"{_opt(param)} must be {bound}, got {value}")
        if self.max_value is not None and number > self.max_value:
            note = f" ({self.limit_note})" if self.limit_note else ""
            raise UserError(f"{_opt(param)} must be at most {self.max_value:g}{note}, got {value}")
        return number


def _opt(param) -> str:
    return param.opts[0] if param is not None and param.opts else "the value"


def image_suffixes() -> list[str]:
    """The file types matplotlib can save ("png", "svg", "pdf", ...)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return sorted(Figure().canvas.get_supported_filetypes())


def check_output_file(path: str | None, option: str, force: bool, suffixes: list[str] | None = None) -> None:
    """Refuse an output path before any work: a missing folder, a suffix not in `suffixes`,
    or an existing file without --force."""
    if not path:
        return
    target = Path(path)
    folder = target.parent
    if not folder.is_dir():
        raise UserError(f"{option} {path}: folder {folder} does not exist; create it or choose another path")
    if suffixes is not None:
        suffix = target.suffix.lower().lstrip(".")
        if suffix not in suffixes:
            shown = ", ".join("." + s for s in suffixes)
            raise UserError(f"{option} {path}: unknown image type {target.suffix or '(no suffix)'}; use one of {shown}")
    if target.is_dir():
        raise UserError(f"{option} {path} is a folder; give a file path")
    if target.exists() and not force:
        raise UserError(f"{option} {path} exists; pass --force to overwrite it")
    check_can_write(path, option)


def check_can_write(path: str | None, option: str, folder: bool = False) -> None:
    """Refuse, before any work, an output the user cannot write: the nearest folder of `path`
    that exists (of a file's folder, or of a `folder` that will be created) must take a new
    file. Permissions, read-only and pseudo file systems only show when one is made."""
    if not path:
        return
    target = Path(path).absolute()
    if not folder:
        if target.is_dir():
            raise UserError(f"{option} {path} is a folder; give a file path")
        if target.is_file():  # replacing it (--force) needs the file, not its folder, writable
            if not os.access(target, os.W_OK):
                raise UserError(f"{option} {path}: the file is not writable; choose another path")
            return
        if not target.parent.is_dir():
            raise UserError(f"{option} {path}: folder {target.parent} does not exist; create it or choose another path")
    start = target if folder else target.parent
    while not start.exists() and start != start.parent:
        start = start.parent
    if not start.is_dir():
        raise UserError(f"{option} {path}: {start} is a file, not a folder; choose another path")
    try:
        handle, probe = tempfile.mkstemp(dir=start, prefix=".smplan-write-check-")
    except OSError as err:
        reason = (err.strerror or type(err).__name__).lower()
        if err.errno == errno.ENOENT:  # a folder that is there but takes no files (/proc, /sys)
            reason = "it takes no new files"
        raise UserError(f"{option} {path}: cannot write in {start} ({reason}); choose another path") from None
    os.close(handle)
    os.unlink(probe)
