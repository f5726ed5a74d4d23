"""What a continuation compares with its checkpoint (config.fingerprint): the sequence length the
run trains at, not whether the plan spelled it; ep, cp and gradient compression as layout keys
(a review continued an ep=1 checkpoint as ep=2 unasked). One process, no launch."""

from __future__ import annotations

import pytest
from smplan.executor.config import fingerprint_inputs
from smplan.executor.run import resolve_plan

from smplan.cli.main import cli
from tests.executor.finished_run import PLAN, finished_run
from tests.executor.runs import GPT_TINY

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp.save in one process


@pytest.fixture
def no_launch(monkeypatch):
    def launched(*args, **kwargs):
        raise AssertionError("launched")

    monkeypatch.setattr("smplan.executor.run.launch_local", launched)


def _continue(cli_runner, plan: str, out, *args) -> str:
    result = cli_runner.invoke(cli, ["execute", plan, *args, "--steps", "4", "-o", str(out)])
    if str(result.exception) == "launched":
        return "launched"
    assert result.exit_code == 2, result.output
    return result.output.strip().splitlines()[-1]


def test_an_inline_plans_run_continues_from_the_plan_file_of_the_same_plan(cli_runner, tmp_path, no_launch):
    out = finished_run(tmp_path / "run")  # inline: the plan has no seq_len, the model trains at its own 16
    plan, _ = resolve_plan(PLAN, model=GPT_TINY)
    path = tmp_path / "plan.json"
    plan.replace(seq_len=16).save(path)  # what `smplan plan` writes: the model's seq_len
    assert _continue(cli_runner, str(path), out) == "launched"


def test_cp_is_part_of_the_layout_a_continuation_must_match(cli_runner, tmp_path, no_launch):
    out = finished_run(tmp_path / "run")
    line = _continue(cli_runner, "cp=2,mbs=1,gbs=2", out, "--model", GPT_TINY)
    assert line.startswith("error: checkpoint") and "layout: cp (unset) -> 2" in line, line
    assert "--force-resume" in line


def test_layout_keys_at_their_defaults_leave_older_checkpoints_resumable():
    plan, model_file = resolve_plan(PLAN, model=GPT_TINY)
    assert not {"ep", "cp", "grad_compress"} & fingerprint_inputs(plan, model_file.sha256)["layout"].keys()
    assert fingerprint_inputs(plan.replace(cp=2, dp=1), model_file.sha256)["layout"]["cp"] == 2
