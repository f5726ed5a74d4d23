"""Silence what other libraries log at import that says nothing about the user's run.

torchao (imported by transformers whenever it is installed, and by `dtype=fp8` runs) logs a
warning per prebuilt C++ extension that does not load against this torch build, and torch's
pytree one per enum torchao registers; float8 training and everything smplan does use none of
them. Their errors still show.
"""

from __future__ import annotations

import logging

QUIET_AT_IMPORT = ("torchao", "torch.utils._pytree")


def quiet_library_logs() -> None:
    """Raise those libraries' loggers to ERROR (before they are imported, or after)."""
    for name in QUIET_AT_IMPORT:
        logging.getLogger(name).setLevel(logging.ERROR)
