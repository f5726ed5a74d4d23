"""Where the published measurements are: the one setting every benchmark reads.

The validation folder is third-party data (see its README): it is never copied into this
repository, only found. In order of precedence:
    --validation-dir DIR             (every benchmark that reads published runs takes it)
    SMPLAN_VALIDATION_DIR=DIR        (environment)
    ../shared/validation             (beside the checkout)
No other module names the folder.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

ENV_VAR = "SMPLAN_VALIDATION_DIR"
DEFAULT = Path(__file__).resolve().parent.parent.parent / "shared" / "validation"


class ValidationDirError(ValueError):
    """The validation folder cannot be found; the message says what to set."""


def add_validation_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--validation-dir", metavar="DIR", default=None,
        help=f"folder of published measurements (default: ${ENV_VAR}, else {DEFAULT.parent.name}/{DEFAULT.name} "
             "beside the checkout)",
    )


def resolve_validation_dir(option: str | None = None) -> Path:
    """The folder from the option, else the variable, else the default; checked to exist."""
    if option:
        where, folder = "--validation-dir", Path(option)
    elif os.environ.get(ENV_VAR):
        where, folder = ENV_VAR, Path(os.environ[ENV_VAR])
    else:
        where, folder = "the default", DEFAULT
    if not folder.is_dir():
        raise ValidationDirError(
            f"no validation folder at {folder} ({where}); pass --validation-dir DIR or set {ENV_VAR}=DIR "
            "to the folder of published measurements (e.g. shared/validation)"
        )
    return folder


def validation_file(folder: Path, name: str) -> Path:
    """`folder/name`, or a one-line error naming the file and the folder."""
    path = folder / name
    if not path.is_file():
        raise ValidationDirError(f"{folder} has no {name}; point --validation-dir (or {ENV_VAR}) at the "
                                 "folder of published measurements")
    return path
