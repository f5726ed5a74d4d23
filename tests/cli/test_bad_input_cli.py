"""Bad command-line values: one line, exit 2, before any work, nothing overwritten."""

import pytest

from smplan.cli.main import cli

TINY = "examples/gpt.py:tiny"
SIM = ["simulate", TINY, "--hw", "a100x8", "--plan", "dp=2,mbs=1,gbs=8"]


def _error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("extra, says", [
    (["--gantt", "{tmp}/missing/g.png"], "does not exist"),
    (["--gantt", "{tmp}/g.txt"], "unknown image type"),
    (["--trace", "{tmp}/missing/t.json"], "does not exist"),
    (["--ps-servers", "2"], "--dp-pattern ps"),
])
def test_simulate_refuses_before_work(cli_runner, tmp_path, extra, says):
    result = cli_runner.invoke(cli, SIM + [e.format(tmp=tmp_path) for e in extra])
    assert result.exit_code == 2
    assert says in _error_line(result)


@pytest.mark.parametrize("option", ["--trace", "--gantt"])
def test_simulate_does_not_overwrite_without_force(cli_runner, tmp_path, option):
    target = tmp_path / ("t.json" if option == "--trace" else "g.png")
    target.write_text("the user's file")
    result = cli_runner.invoke(cli, SIM + [option, str(target)])
    assert result.exit_code == 2 and "--force" in _error_line(result)
    assert target.read_text() == "the user's file"
    forced = cli_runner.invoke(cli, SIM + [option, str(target), "--force"])
    assert forced.exit_code == 0, forced.output
    assert target.read_bytes() != b"the user's file"


@pytest.mark.parametrize("args", [["--days", "inf"], ["--days", "nan"], ["--days", "0"], ["--days", "-1"],
                                  ["--days", "1e6"], ["--tokens", "1e30"], ["--tokens", "inf"]])
def test_reliability_refuses_unbounded_runs(cli_runner, args):
    result = cli_runner.invoke(cli, ["reliability", TINY, "--hw", "a100x8", "--plan", "dp=2,mbs=1,gbs=8", *args])
    assert result.exit_code == 2
    assert args[0] in _error_line(result)


@pytest.mark.parametrize("lr", ["-1", "0", "nan"])
def test_execute_refuses_a_bad_learning_rate_before_launch(cli_runner, tmp_path, lr):
    result = cli_runner.invoke(cli, ["execute", "dp=2,mbs=1,gbs=4", "--model", TINY, "--lr", lr,
                                     "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "--lr" in _error_line(result)
    assert not (tmp_path / "run").exists()
