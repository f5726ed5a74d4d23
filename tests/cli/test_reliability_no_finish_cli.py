"""`smplan reliability` on a run that does not finish: the cause as the simulation saw it, exit 2,
and with --json the run marked as whatif marks such a point (feasible: false, the reason)."""

import json

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

GPT = f"{EXAMPLES / 'gpt.py'}:tiny"
# 4,096 GPUs of 20,000 h fail every 4.9 h; with no spare each waits 48 h for its node, cut short by the next
STARVED = ["reliability", GPT, "--hw", "a100x8", "--nodes", "512", "--plan", "dp=4096,mbs=1,gbs=4096", "--days", "1",
           "--mtbf-hours", "20000", "--spares", "0", "--repair-hours", "48", "--seeds", "5"]


def test_a_run_that_does_not_finish_names_the_spare_pool_in_one_line():
    result = _runner().invoke(cli, STARVED)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: the run does not finish")
    assert "--spares" in result.stderr and "--repair-hours" in result.stderr
    assert "--checkpoint-minutes" not in result.stderr


def test_json_prints_the_run_marked_as_not_finishing_then_exits_2():
    # it printed nothing on stdout: a script had only the exit code, whatif's record marks the point
    result = _runner().invoke(cli, [*STARVED, "--json"])
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["feasible"] is False and data["reason"] in result.stderr
    assert data["spares"] == 0 and data["num_gpus"] == 4096 and "goodput_mean" not in data
    fine = _runner().invoke(cli, [*STARVED[:-6], "--seeds", "5", "--json"])
    assert fine.exit_code == 0, fine.output
    assert json.loads(fine.stdout)["feasible"] is True and json.loads(fine.stdout)["reason"] is None


def _runner():
    from click.testing import CliRunner

    return CliRunner()


def test_a_given_interval_that_makes_no_progress_is_refused_at_once_naming_it():
    # it was simulated for seconds, then refused with a count of failures that did not apply to it
    args = ["reliability", GPT, "--hw", "a100x8", "--plan", "dp=8,mbs=1,gbs=8", "--days", "30",
            "--checkpoint-interval-min", "100000", "--mtbf-hours", "5"]
    result = _runner().invoke(cli, args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: the run does not finish: checkpointing every 1e+05 min")
    assert "give a shorter --checkpoint-interval-min" in result.stderr
