"""Conventions every verb keeps: every option explains itself, one spelling per option."""

import re

import click
import pytest

from smplan.cli.main import cli
from smplan.cli.options import OneSpelling


def _commands(group: click.Group, prefix=()):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


COMMANDS = dict(_commands(cli))


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_every_option_has_help(path):
    missing = [p.opts[0] for p in COMMANDS[path].params
               if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    assert not missing, f"smplan {' '.join(path)}: options without help: {missing}"


# The spelling kept for each concept across verbs, and the ones it replaced.
SPELLINGS = {"--global-batch": "--gbs", "--checkpoint-interval-min": "--checkpoint-interval",
             "--output": "--out", "--nproc-per-node": "--nproc"}


def test_one_spelling_per_option_across_verbs():
    shown = {o for command in COMMANDS.values() for p in command.params if isinstance(p, click.Option)
             for o in p.opts if not (isinstance(p, OneSpelling) and o in p.old_names)}
    for kept, old in SPELLINGS.items():
        assert old not in shown, f"{old} is still shown; it is spelled {kept}"


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_old_spellings_work_but_are_not_in_help(cli_runner, path):
    help_text = cli_runner.invoke(cli, [*path, "--help"]).output
    for p in COMMANDS[path].params:
        if isinstance(p, OneSpelling):
            for old in p.old_names:
                assert f"{old} " not in help_text.replace(",", " ") and f"{old}\n" not in help_text


def test_an_old_spelling_still_parses(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["reliability", "examples/gpt.py:tiny", "--hw", "a100x8", "--plan",
                                     "dp=8,mbs=1,gbs=8", "--days", "1", "--checkpoint-interval", "30",
                                     "--seeds", "2", "--json"])
    assert result.exit_code == 0, result.output


def test_mfu_is_a_fraction_in_json_and_a_percentage_in_tables(cli_runner, tmp_path):
    import json

    big = ["examples/gpt.py:gpt3_175b", "--hw", "a100x8", "--nodes", "16"]
    fixed = ["--fix", "tp=8,pp=8,mbs=1,schedule=1f1b,recompute=full", "--top", "1"]  # a search of seconds
    plan = json.loads(cli_runner.invoke(cli, ["plan", *big, *fixed, "--json"]).stdout)["plans"][0]
    assert 0 < plan["mfu"] < 1
    table = cli_runner.invoke(cli, ["plan", *big, *fixed]).stdout
    assert f"{100 * plan['mfu']:.1f}%" in table
    inline = ["simulate", *big, "--plan", "tp=8,pp=8,dp=2,mbs=1,gbs=64,recompute=full"]
    sim = json.loads(cli_runner.invoke(cli, [*inline, "--json"]).stdout)
    assert 0 < sim["mfu"] < 1
    assert f"{100 * sim['mfu']:.1f}%" in cli_runner.invoke(cli, inline).stdout
    what = cli_runner.invoke(cli, ["whatif", *big[:3], "--vary", "nodes=16", "--plan", "tp=8,pp=8,dp=2,mbs=1,gbs=64",
                                   "-o", str(tmp_path / "r"), "--json"])
    point = json.loads(what.stdout)["points"][0]
    assert 0 < point["figures"]["mfu"] < 1


@pytest.mark.parametrize("command", ["profile", "plan", "simulate", "whatif", "reliability", "calibrate", "execute"])
def test_every_command_that_takes_a_model_names_the_hf_form_in_its_help(cli_runner, command):
    # a review found only the README and the error after a wrong guess taught hf:DIR
    help_text = " ".join(cli_runner.invoke(cli, [command, "--help"]).output.split())
    assert "hf:DIR" in help_text and "config.json" in help_text, help_text


@pytest.mark.parametrize("verb", ["simulate", "whatif", "execute"])
def test_each_verb_taking_an_inline_plan_names_its_keys(cli_runner, verb):
    """A user of `execute "dp=2,ep=2,..."` had no list of the keys but plan's --fix (a review)."""
    from smplan.planner.plan import INLINE_KEYS

    shown = " ".join(cli_runner.invoke(cli, [verb, "--help"], terminal_width=400).output.split())
    short = [min((k for k, f in INLINE_KEYS.items() if f == field), key=len) for field in set(INLINE_KEYS.values())]
    missing = [key for key in short if not re.search(rf" {key}[,;. ]", shown)]
    assert not missing, f"smplan {verb} --help does not name {missing}"


def test_the_command_list_and_executes_help_import_no_torch(cli_runner):
    """`smplan --help` reads each command's first line off its docstring, importing its module:
    `execute`'s imports torch (seconds) only inside the functions that run a plan. Its own
    --help reads the executor's defaults from torch-free modules (smplan.executor loads lazily)."""
    import subprocess
    import sys

    listing = cli_runner.invoke(cli, ["--help"]).output
    assert all(f"  {name} " in listing for (name, *_) in COMMANDS)
    for argv, shown in ((["--help"], "Run PLAN (a plan.json"), (["execute", "--help"], "[default: 0.2]")):
        probe = f"import sys; from smplan.cli.main import main; sys.argv = ['smplan', *{argv!r}]\n" \
                "try:\n    main()\nexcept SystemExit:\n    pass\nassert 'torch' not in sys.modules, 'torch imported'"
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"smplan {' '.join(argv)}: {result.stderr[-2000:]}"
        assert shown in " ".join(result.stdout.split()), result.stdout
