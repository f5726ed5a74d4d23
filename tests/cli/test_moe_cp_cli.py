"""ep, cp and fp8 through the CLI: plan table and JSON, simulate --plan, one-line refusals."""

import json

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

MOE = str(EXAMPLES / "moe.py") + ":tiny"
GPT = str(EXAMPLES / "gpt.py") + ":tiny"


def test_plan_table_and_json_show_ep_and_cp(cli_runner):
    result = cli_runner.invoke(cli, ["plan", MOE, "--hw", "h100x8", "--nodes", "1", "--global-batch", "16",
                                     "--fix", "ep=2", "--fix", "cp=2", "--top", "1"])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if line.startswith("#"))
    assert " ep " in header and " cp " in header
    result = cli_runner.invoke(cli, ["plan", MOE, "--hw", "h100x8", "--nodes", "1", "--global-batch", "16",
                                     "--fix", "ep=2,cp=2,dtype=fp8", "--top", "1", "--json"])
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["plans"][0]
    assert (best["ep"], best["cp"], best["dtype"]) == (2, 2, "fp8")
    assert best["plan"]["ep"] == 2 and best["plan"]["version"] == 2


def test_plan_file_round_trips_through_simulate(cli_runner, tmp_path):
    out = tmp_path / "plan.json"
    result = cli_runner.invoke(cli, ["plan", MOE, "--hw", "h100x8", "--nodes", "1", "--global-batch", "16",
                                     "--fix", "ep=4", "--top", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["ep"] == 4
    result = cli_runner.invoke(cli, ["simulate", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert "ep_all_to_all" in json.loads(result.output)["breakdown"]


def test_simulate_inline_plan_with_ep_and_cp(cli_runner):
    result = cli_runner.invoke(cli, ["simulate", MOE, "--hw", "h100x8", "--plan", "dp=2,ep=2,cp=2,tp=2,gbs=4",
                                     "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["step_time_s"] > 0


def test_refusals_are_one_line_exit_2(cli_runner):
    for args, says in (
        (["plan", GPT, "--hw", "h100x8", "--nodes", "1", "--fix", "ep=2"], "needs routed experts"),
        (["plan", MOE, "--hw", "a100x8", "--nodes", "1", "--fix", "dtype=fp8"], "FP8 tensor cores"),
        (["simulate", MOE, "--hw", "h100x8", "--plan", "dp=3,ep=2"], "must divide tp*cp*dp=3"),
        (["simulate", MOE, "--hw", "h100x8", "--plan", "cp=3,dp=2"], "2*cp=6"),
    ):
        result = cli_runner.invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        assert says in result.output and "Traceback" not in result.output
