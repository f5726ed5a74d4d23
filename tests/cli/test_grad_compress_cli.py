"""grad_compress through the CLI: simulate prices it, plan keeps none unless fixed, whatif sweeps it."""

from __future__ import annotations

import json

import pytest

from smplan import report
from smplan.cli.main import cli
from tests.report.chart_data import lines

# a dp-heavy plan of a GPT wide enough for its gradients to matter, across 2 nodes on a slow NIC
MODEL = ["examples/gpt.py:tiny", "--arg", "hidden=1024", "--arg", "heads=8", "--arg", "vocab=1024"]
SLOW = ["--hw", "a100x8", "--nodes", "2", "--hw-set", "inter_node.bandwidth_gbps=1"]


def _simulate(cli_runner, plan: str) -> dict:
    result = cli_runner.invoke(cli, ["simulate", *MODEL, *SLOW, "--plan", plan, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_powersgd_lowers_simulated_dp_communication(cli_runner):
    base = "dp=16,mbs=1,gbs=16,zero=0,overlap_dp=0"
    none = _simulate(cli_runner, base)
    psgd = _simulate(cli_runner, base + ",grad_compress=powersgd:4")
    assert none["plan"]["grad_compress"] == "none" and psgd["plan"]["grad_compress"] == "powersgd:4"
    assert psgd["breakdown"]["dp_comm_exposed"] < 0.5 * none["breakdown"]["dp_comm_exposed"]
    assert psgd["step_time_s"] < none["step_time_s"]
    # the error-feedback residual: the gradients once more
    grads = none["memory_breakdown_gib"]["gradients"]
    assert psgd["memory_breakdown_gib"]["gradients"] == pytest.approx(2 * grads)
    # bf16 changes nothing for bf16 gradients, and halves fp32 ones' bytes
    assert _simulate(cli_runner, base + ",grad_compress=bf16")["step_time_s"] == pytest.approx(none["step_time_s"])
    fp32 = _simulate(cli_runner, base + ",dtype=fp32")
    fp32_bf16 = _simulate(cli_runner, base + ",dtype=fp32,grad_compress=bf16")
    assert fp32_bf16["breakdown"]["dp_comm_exposed"] == pytest.approx(0.5 * fp32["breakdown"]["dp_comm_exposed"],
                                                                      rel=0.05)


def test_powersgd_with_zero_is_one_line(cli_runner):
    result = cli_runner.invoke(cli, ["simulate", *MODEL, *SLOW, "--plan", "dp=16,zero=2,grad_compress=powersgd:4"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs zero=0" in lines[0] and "Traceback" not in result.output


def test_plan_keeps_none_unless_fixed(cli_runner):
    def best(*extra):
        result = cli_runner.invoke(cli, ["plan", *MODEL, *SLOW, "--global-batch", "16", "--json", *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["plans"][0]

    default = best()
    assert default["grad_compress"] == "none"
    fixed = best("--fix", "grad_compress=powersgd:4")
    assert fixed["grad_compress"] == "powersgd:4" and fixed["zero"] == 0
    assert fixed["plan"]["grad_compress"] == "powersgd:4"
    refused = cli_runner.invoke(cli, ["plan", *MODEL, *SLOW, "--fix", "grad_compress=powersgd:4,zero=1"])
    assert refused.exit_code == 2 and "needs zero=0" in refused.output


def test_whatif_varies_grad_compress_against_bandwidth(cli_runner, tmp_path):
    out = tmp_path / "r"
    result = cli_runner.invoke(cli, ["whatif", *MODEL, "--hw", "a100x8", "--nodes", "2", "--jobs", "1", "--seeds", "3",
                                     "--vary", "grad_compress=none,powersgd:4",
                                     "--vary", "inter_node.bandwidth_gbps=1,100", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    points = json.loads(result.stdout)["points"]
    step = {(p["settings"]["grad_compress"], p["settings"]["inter_node.bandwidth_gbps"]):
            p["figures"]["step_time_s"] for p in points}
    assert [p["plan"]["grad_compress"] for p in points] == ["none", "none", "powersgd:4", "powersgd:4"]
    assert step[("powersgd:4", 1)] < step[("none", 1)]
    assert (out / "index.html").exists()
    record = report.load(out / "points.json")
    assert (out / record["charts"]["versus"]).exists()
    drawn = lines(report.draw_chart("versus", record).axes[0])
    assert drawn["grad_compress=powersgd:4"][0] == [1, 100]
    assert drawn["grad_compress=powersgd:4"][1] == pytest.approx([step[("powersgd:4", 1)], step[("powersgd:4", 100)]])
    bad = cli_runner.invoke(cli, ["whatif", *MODEL, "--hw", "a100x8", "--vary", "grad_compress=none,zip",
                                  "-o", str(tmp_path / "b")])
    assert bad.exit_code == 2 and bad.output.startswith("error: --vary grad_compress")
