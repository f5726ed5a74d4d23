"""One capability rule: a dimension the executor would reject is never offered by the planner."""

import json
from pathlib import Path

import pytest
from smplan.planner import profile_model

from smplan.cli.main import cli
from tests.executor.runs import metrics, run_execute

RESNET = str(Path(__file__).with_name("resnet_like.py"))
GPT = "examples/gpt.py:tiny"


def test_the_profile_says_why_pipeline_stages_cannot_be_cut():
    why = profile_model(RESNET, cache=False).unsupported["pp"]
    assert why.startswith("ResNet.forward does not skip the layers another stage holds")
    assert profile_model(GPT, cache=False).unsupported == {}


def test_the_planner_offers_no_pipeline_and_says_why(cli_runner):
    result = cli_runner.invoke(cli, ["plan", RESNET, "--hw", "a100x8", "--top", "20", "--json"])
    assert result.exit_code == 0, result.output
    assert {p["pp"] for p in json.loads(result.stdout)["plans"]} == {1}
    explained = cli_runner.invoke(cli, ["plan", RESNET, "--hw", "a100x8", "--explain"])
    assert "pp not offered: ResNet.forward does not skip" in explained.stdout
    fixed = cli_runner.invoke(cli, ["plan", RESNET, "--hw", "a100x8", "--fix", "pp=2"])
    assert fixed.exit_code == 2 and "pp=2: ResNet.forward does not skip" in fixed.output


def test_execute_refuses_the_pipeline_with_the_same_reason(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["execute", "pp=2,mbs=1,gbs=2", "--model", RESNET, "-o", str(tmp_path / "r")])
    assert result.exit_code == 2 and "pp=2: ResNet.forward does not skip" in result.output


@pytest.mark.parametrize("plan", ["dp=2,mbs=2,gbs=4", "dp=2,zero=3,mbs=2,gbs=4"])
def test_a_resnet_trains_data_parallel(tmp_path, plan):
    result = run_execute(plan, tmp_path / "run", "--steps", "3", model=RESNET, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    losses = [r["loss"] for r in metrics(tmp_path / "run")]
    assert len(losses) == 3 and all(loss == loss for loss in losses)


CONV1D = str(Path(__file__).with_name("conv1d_gpt.py"))


def test_tensor_parallelism_is_off_for_modules_torch_cannot_shard(cli_runner, tmp_path):
    why = profile_model(CONV1D, cache=False).unsupported["tp"]
    assert why.startswith("tp_plan() shards c_fc, a Conv1D")
    planned = cli_runner.invoke(cli, ["plan", CONV1D, "--hw", "a100x8", "--top", "20", "--json"])
    assert planned.exit_code == 0, planned.output
    assert {p["tp"] for p in json.loads(planned.stdout)["plans"]} == {1}
    fixed = cli_runner.invoke(cli, ["plan", CONV1D, "--hw", "a100x8", "--fix", "tp=2"])
    assert fixed.exit_code == 2 and "tp=2: tp_plan() shards c_fc, a Conv1D" in fixed.output
    run = cli_runner.invoke(cli, ["execute", "tp=2,mbs=1,gbs=2", "--model", CONV1D, "-o", str(tmp_path / "r")])
    assert run.exit_code == 2 and "tp=2: tp_plan() shards c_fc, a Conv1D" in run.output
    assert not (tmp_path / "r").exists()
