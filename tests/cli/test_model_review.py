"""Findings of the own-models review: simulate refuses what the model cannot run, a model file
imports its neighbours, headers show the sequence, --json carries the notes."""

import pytest

from smplan.cli.main import cli
from tests.conftest import ROOT

INPUTS = str(ROOT / "tests" / "model" / "inputs_models.py")


@pytest.mark.parametrize(("ref", "plan", "said"), [
    (f"{INPUTS}:tied", "pp=2,dp=4,mbs=1,gbs=8", "pp=2: "),  # a weight tied across pipeline pieces
    (INPUTS, "cp=2,dp=4,mbs=1,gbs=8", "cp=2: inputs_models.py defines no context_parallel"),
])
def test_simulate_refuses_a_layout_the_model_cannot_run(cli_runner, ref, plan, said):
    result = cli_runner.invoke(cli, ["simulate", ref, "--hw", "a100x8", "--plan", plan])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: " + said) and line.endswith("=1"), result.output
    assert "Traceback" not in result.output
