"""Which exceptions are the user's mistake: one rule for the CLI and for commands that keep
going past a bad case (whatif's points)."""

from __future__ import annotations

# Every package installs under the one import name (pyproject's package-dir): smplan.planner,
# smplan.executor, ... all report "smplan" as their top-level module.
OUR_PACKAGE = "smplan"


def is_user_error(err: BaseException) -> bool:
    """A ValueError raised by one of our packages is the user's mistake (bad input, a plan that
    cannot run), shown as one line; any other exception is a bug and keeps its traceback."""
    return isinstance(err, ValueError) and type(err).__module__.split(".")[0] == OUR_PACKAGE
