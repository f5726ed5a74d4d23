import json

import pytest

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

GPT = f"{EXAMPLES / 'gpt.py'}:tiny"
FIGURES = ("step_time_s", "tokens_per_s", "samples_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu",
           "peak_memory_gib", "bubble_fraction", "breakdown", "usd_per_step")


def _one_error_line(result):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output


def test_simulate_model_inline_json(cli_runner, tmp_path):
    trace, gantt = tmp_path / "step.json", tmp_path / "step.png"
    result = cli_runner.invoke(cli, ["simulate", GPT, "--hw", "a100x8", "--plan", "tp=2,pp=2,dp=2,mbs=1,gbs=16",
                                     "--json", "--trace", str(trace), "--gantt", str(gantt)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in FIGURES:
        assert key in data
    assert data["step_time_s"] > 0 and len(data["stage_utilisation"]) == 2
    assert json.loads(trace.read_text())["traceEvents"]
    assert gantt.read_bytes()[:4] == b"\x89PNG"


def test_simulate_plan_file_table(cli_runner, tmp_path):
    from smplan.planner import plan_from_inline, profile_model

    profile = profile_model(GPT)
    plan = plan_from_inline("pp=2,dp=4,mbs=1,gbs=32", model=GPT, hw="a100x8", nodes=1, gpus_per_node=8,
                            num_blocks=profile.num_blocks)
    path = tmp_path / "plan.json"
    plan.save(path)
    result = cli_runner.invoke(cli, ["simulate", str(path)])
    assert result.exit_code == 0, result.output
    assert "step time" in result.output and "per-stage time, % of the step" in result.output
    off = cli_runner.invoke(cli, ["simulate", str(path), "--no-contention", "--json"])
    data = json.loads(off.output)
    assert data["contention"] is False
    if data["closed_form_step_time_s"] is not None:
        assert data["step_time_s"] == pytest.approx(data["closed_form_step_time_s"], rel=0.05)


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "missing-plan.json"],
        ["simulate", GPT, "--plan", "tp=2"],  # no --hw
        ["simulate", GPT, "--hw", "a100x8"],  # no --plan
        ["simulate", GPT, "--hw", "a100x8", "--plan", "tp=3"],  # tp does not divide the heads / cluster
        ["simulate", GPT, "--hw", "a100x8", "--plan", "bogus=1"],
        ["simulate", GPT, "--hw", "a100x8", "--plan", "dp=64"],  # more GPUs than the node
        ["simulate", GPT, "--hw", "nope", "--plan", "dp=1"],
        ["simulate", GPT, "--hw", "a100x8", "--plan", "dp=1", "--hw-set", "inter_node.bandwidth_gbps=0"],
    ],
)
def test_simulate_bad_inputs_one_line_exit_2(cli_runner, args):
    _one_error_line(cli_runner.invoke(cli, args))


def test_simulate_bad_plan_json(cli_runner, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _one_error_line(cli_runner.invoke(cli, ["simulate", str(bad)]))


def test_plan_that_does_not_fit_is_simulated_with_a_warning(cli_runner):
    # A 1 GiB GPU cannot hold even the tiny GPT's activations at this batch: the user's own
    # configuration is still simulated, but the output says it would run out of memory.
    args = ["simulate", GPT, "--hw", "a100x8", "--hw-set", "gpu.memory_gib=0.01", "--plan", "tp=1,pp=1,dp=8,mbs=8,gbs=64"]
    text = cli_runner.invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "warning: the fullest GPU needs" in text.output and "run out of memory" in text.output
    data = json.loads(cli_runner.invoke(cli, [*args, "--json"]).output)
    assert data["fits_memory"] is False and data["peak_memory_gib"] > data["memory_capacity_gib"] > 0
    ok = json.loads(cli_runner.invoke(cli, ["simulate", GPT, "--hw", "a100x8", "--plan", "tp=1,pp=1,dp=8,mbs=1,gbs=8",
                                            "--json"]).output)
    assert ok["fits_memory"] is True
