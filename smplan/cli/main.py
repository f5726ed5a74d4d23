"""`smplan` entry point: a lazy command group and the one place user errors become exit 2."""

from __future__ import annotations

import importlib

import click

from smplan import __version__
from smplan.errors import is_user_error

# name -> "module:attribute"; a command's module is imported only when it runs or `smplan --help`
# lists its first line, so one broken command cannot take down the others. Those modules import
# their heavy libraries (torch) inside the functions that need them: `smplan --help` stays fast
# (tests/cli/test_conventions_cli.py checks that it imports no torch).
COMMANDS = {
    "hw": "smplan.cli.hw:hw",
    "stack": "smplan.cli.stack:stack",
    "profile": "smplan.cli.profile:profile",
    "plan": "smplan.cli.plan:plan",
    "simulate": "smplan.cli.simulate:simulate",
    "reliability": "smplan.cli.reliability:reliability",
    "whatif": "smplan.cli.whatif:whatif",
    "execute": "smplan.cli.execute:execute",
    "calibrate": "smplan.cli.calibrate:calibrate",
    "monitor": "smplan.cli.monitor:monitor",
    "report": "smplan.cli.report:report",
    "export": "smplan.cli.export:export",
}


def _available(name: str) -> bool:
    module = COMMANDS[name].split(":")[0]
    return importlib.util.find_spec(module) is not None


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return [name for name in COMMANDS if _available(name)]

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as err:  # Ctrl-C: one line and 130, not click's "Aborted!" and 1
            raise Interrupted(str(err) or "interrupted") from None
        except click.exceptions.NoArgsIsHelpError:  # `smplan hw` alone: its help, as click shows it
            raise
        except click.UsageError as err:  # click's "Usage: / Try / Error:" block, as one line
            raise UserError(usage_line(err)) from None
        except OSError as err:
            if err.filename is None:  # not about a path the user gave: a bug, keep the traceback
                raise
            raise UserError(path_line(err)) from None
        except Exception as err:
            if is_user_error(err):
                raise UserError(str(err)) from None
            raise

    def make_context(self, info_name, args, parent=None, **extra):
        try:  # `smplan --bogus`: the group's own options, parsed before invoke
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:  # `smplan` alone: the help
            raise
        except click.UsageError as err:
            raise UserError(usage_line(err)) from None

    def get_command(self, ctx, name):
        if name not in COMMANDS or not _available(name):
            return None
        module, attr = COMMANDS[name].split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="smplan")
def cli() -> None:
    """Plan, simulate and run distributed training.

    \b
    Typical flow:
      smplan hw list                                   # bundled hardware profiles
      smplan stack list                                # bundled software stacks (--stack)
      smplan profile examples/gpt.py:gpt3_175b         # what the model costs
      smplan plan examples/gpt.py:gpt3_175b --hw a100x8 --nodes 128 -o plan.json
      smplan simulate plan.json --gantt step.png       # step time, timeline
      smplan reliability plan.json --tokens 1.5e12     # the whole run under failures
      smplan whatif examples/gpt.py:gpt3_175b --hw a100x8 --vary nodes=64,128 --tokens 3e11
                                                       # sweep, chart, recommend (-o REPORT_DIR)
      smplan execute plan.json --steps 20              # run it for real

    \b
    Environment:
      SMPLAN_CACHE_DIR       where model profiles are cached (default ~/.cache/smplan)
      SMPLAN_VALIDATION_DIR  published measurements benchmarks/ read (default ../shared/validation, beside the checkout)
      SMPLAN_FAIL_AT_STEP, SMPLAN_FAIL_RANK, SMPLAN_SLOW_RANK
                             fault injection for the executor's tests (kill or slow a rank);
                             never set them for a real run
    """


def usage_line(err: click.UsageError) -> str:
    """A click usage error (unknown option, value out of range, missing argument) as one line
    that names the command's --help."""
    message = err.format_message().rstrip(".")
    command = err.ctx.command_path if err.ctx is not None else "smplan"
    return f"{message}; see '{command} --help'"


def path_line(err: OSError) -> str:
    """A file the command could not read or write (permission denied, read-only file system,
    a missing folder) as one line: what, where, and what to do."""
    reason = (err.strerror or type(err).__name__).lower()
    return f"cannot use {err.filename}: {reason}; choose another path or fix its permissions"


class UserError(click.ClickException):
    """One line on stderr, exit code 2, no traceback."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"error: {self.message}", err=True)


class RunFailed(click.ClickException):
    """A run that started and failed (a rank's exception, a signal): "error: ..." as every other
    error line, exit code 1 (143 for SIGTERM; not a wrong input's 2); its message may go on with the
    rank's lines."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code  # 128 + the signal for a run a signal stopped (executor.LaunchError)

    def show(self, file=None) -> None:
        click.echo(f"error: {self.message}", err=True)


class Interrupted(click.ClickException):
    """Ctrl-C: one line on stderr and exit code 130 (128 + SIGINT, as a shell reports it)."""

    exit_code = 130

    def show(self, file=None) -> None:
        click.echo(self.message, err=True)


def main() -> None:
    cli(prog_name="smplan")
