"""`smplan plan` through CliRunner on the tiny GPT preset."""

import json

from smplan.cli.main import cli

TINY = "examples/gpt.py:tiny"


def _lines(output):
    """Output lines less the progress line of a first profiling run (stderr)."""
    return [line for line in output.splitlines() if line.strip() and not line.startswith("profiling ")]


def test_plan_table(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--top", "3"])
    assert result.exit_code == 0, result.output
    for column in ("dp", "tp", "pp", "mbs", "zero", "recompute", "schedule", "step s", "tokens/s", "MFU", "mem GiB"):
        assert column in result.output


def test_plan_json_names(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--global-batch", "16", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["plans"]
    best = data["plans"][0]
    for key in ("dp", "tp", "pp", "micro_batch", "global_batch", "schedule", "zero", "recompute", "stage_blocks",
                "step_time_s", "tokens_per_s", "mfu", "peak_memory_gib"):
        assert key in best
    times = [p["step_time_s"] for p in data["plans"]]
    assert times == sorted(times) and best["global_batch"] == 16


def test_plan_output_and_no_overwrite(cli_runner, tmp_path):
    out = tmp_path / "plan.json"
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "-o", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads(out.read_text())
    assert saved["version"] == 1 and saved["predicted"]["step_time_s"] > 0
    again = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "-o", str(out)])
    assert again.exit_code == 2 and "--force" in again.output
    forced = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "-o", str(out), "--force"])
    assert forced.exit_code == 0, forced.output


def test_plan_fix_and_explain(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "tp=2", "--explain", "--json"])
    assert result.exit_code == 0, result.output
    assert all(p["tp"] == 2 for p in json.loads(result.stdout)["plans"])
    text = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--explain", "--top", "3"])
    assert text.exit_code == 0 and "step time" in text.output


def test_infeasible_requests_one_line_exit_2(cli_runner):
    cases = [
        ["--fix", "tp=16"],
        ["--fix", "tp=3"],
        ["--global-batch", "7", "--fix", "dp=2"],
        ["--fix", "pp=9"],
    ]
    for extra in cases:
        result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", *extra])
        assert result.exit_code == 2, (extra, result.output)
        lines = _lines(result.output)
        assert len(lines) == 1 and lines[0].startswith("error:"), (extra, result.output)
        assert "Traceback" not in result.output


def test_model_too_big_names_nearest_change(cli_runner):
    result = cli_runner.invoke(cli, ["plan", "examples/gpt.py:gpt3_175b", "--hw", "a100x8", "--nodes", "1",
                                     "--global-batch", "8"])
    assert result.exit_code == 2, result.output
    lines = _lines(result.output)
    assert len(lines) == 1 and "smallest change" in lines[0] and "--nodes" in lines[0]
