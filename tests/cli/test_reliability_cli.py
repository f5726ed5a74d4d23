import json

import pytest

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

GPT = f"{EXAMPLES / 'gpt.py'}:tiny"
BASE = ["reliability", GPT, "--hw", "a100x8", "--nodes", "512", "--plan", "dp=4096,mbs=1,gbs=4096"]


def test_reliability_json(cli_runner):
    result = cli_runner.invoke(cli, BASE + ["--days", "10", "--checkpoint-minutes", "5", "--seeds", "20", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in ("goodput_mean", "goodput_p10", "goodput_p50", "goodput_p90", "wall_mean_s", "wall_p10_s",
                "wall_p50_s", "wall_p90_s", "failures_mean", "best_interval_s", "young_interval_s",
                "daly_interval_s", "interval_s"):
        assert key in data
    assert 0 < data["goodput_mean"] < 1
    assert data["best_interval_s"] == pytest.approx(data["daly_interval_s"], rel=0.3)


def test_reliability_table_tokens_and_options(cli_runner):
    result = cli_runner.invoke(cli, BASE + ["--tokens", "1e10", "--checkpoint-interval-min", "30", "--mtbf-hours", "20000",
                                            "--restart-minutes", "5", "--async-checkpoint", "--spares", "8",
                                            "--weibull-shape", "1.2", "--seeds", "10"])
    assert result.exit_code == 0, result.output
    assert "goodput" in result.output and "Daly" in result.output and "used (given)" in result.output
    # the write time's assumption is printed: every node writes its shard at the profile's rate,
    # up to the file system's ceiling (512 x 5 GB/s is past it)
    assert ("512 nodes writing 5 GB/s each, capped at the file system's 2000 GB/s; --checkpoint-minutes sets it, "
            "async: blocks") in result.output
    given = cli_runner.invoke(cli, BASE + ["--days", "1", "--checkpoint-minutes", "5", "--seeds", "5"])
    assert "checkpoint 5.00 min (" in given.output and "writing" not in given.output


@pytest.mark.parametrize(
    "extra",
    [
        [],  # neither --days nor --tokens
        ["--days", "1", "--tokens", "5"],
        ["--days", "-1"],
        ["--days", "1", "--checkpoint-interval-min", "soon"],
        ["--days", "1", "--checkpoint-interval-min", "0"],
        ["--days", "1", "--mtbf-hours", "0"],
        ["--days", "1", "--weibull-shape", "100"],
        # an asynchronous write must end before the next one starts
        ["--days", "1", "--async-checkpoint", "--checkpoint-minutes", "60", "--checkpoint-interval-min", "5"],
    ],
)
def test_reliability_bad_inputs_one_line_exit_2(cli_runner, extra):
    result = cli_runner.invoke(cli, BASE + extra)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output


def test_reliability_missing_plan_file(cli_runner):
    result = cli_runner.invoke(cli, ["reliability", "nope.json", "--days", "1"])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_reliability_warns_of_a_plan_that_does_not_fit(cli_runner):
    """Goodput of a plan that runs out of memory is no run's: the same warning as `simulate`."""
    args = ["reliability", GPT, "--hw", "a100x8", "--hw-set", "gpu.memory_gib=0.01", "--plan",
            "tp=1,pp=1,dp=8,mbs=8,gbs=64", "--tokens", "1e9", "--seeds", "3"]
    text = cli_runner.invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert text.stderr.startswith("warning: the fullest GPU needs") and "run out of memory" in text.stderr
    data = json.loads(cli_runner.invoke(cli, [*args, "--json"]).stdout)
    assert data["fits_memory"] is False and data["peak_memory_gib"] > data["memory_capacity_gib"] > 0
    fits = cli_runner.invoke(cli, ["reliability", GPT, "--hw", "a100x8", "--plan", "dp=8,mbs=1,gbs=8", "--tokens",
                                   "1e9", "--seeds", "3", "--json"])
    assert json.loads(fits.stdout)["fits_memory"] is True and "warning" not in fits.stderr
