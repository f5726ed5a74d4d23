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
    assert line.startswith("error: checkpoint") and "layout: cp 1 -> 2" in line, line  # the default, not "(unset)"
    assert "--force-resume" in line


def test_layout_keys_at_their_defaults_leave_older_checkpoints_resumable():
    plan, model_file = resolve_plan(PLAN, model=GPT_TINY)
    assert not {"ep", "cp", "grad_compress"} & fingerprint_inputs(plan, model_file.sha256)["layout"].keys()
    assert fingerprint_inputs(plan.replace(cp=2, dp=1), model_file.sha256)["layout"]["cp"] == 2


def _as_an_older_smplan_wrote_it(out, plan_text: str):
    """The run's checkpoint and run_config.json under the fingerprint smplan computed before the trained
    seq_len, ep, cp and grad_compress joined it (aafc8c5): the plan's own seq_len, none of those keys."""
    import json

    from smplan.executor.config import hash_key

    plan, model_file = resolve_plan(plan_text, model=GPT_TINY)
    older = fingerprint_inputs(plan, model_file.sha256)  # an inline plan: seq_len null
    for key in ("ep", "cp", "grad_compress"):
        older["layout"].pop(key, None)
    for path in (out / "checkpoints" / "step-2" / "smplan.json", out / "run_config.json"):
        data = json.loads(path.read_text())
        data.update(fingerprint=hash_key(older), fingerprint_inputs=older)
        path.write_text(json.dumps(data))
    return hash_key(older)


@pytest.mark.parametrize("plan_text", [PLAN, "cp=2,mbs=1,gbs=2"])
def test_a_run_an_older_smplan_started_continues_under_its_own_fingerprint(cli_runner, tmp_path, monkeypatch,
                                                                           plan_text):
    """A review: every inline-plan run of aafc8c5 (seq_len null), and its cp=2 runs, were refused."""
    out = finished_run(tmp_path / "run", plan_text=plan_text)
    older = _as_an_older_smplan_wrote_it(out, plan_text)
    seen = {}

    def launched(cfg, *args, **kwargs):
        seen["fingerprint"] = cfg.fingerprint
        raise AssertionError("launched")

    monkeypatch.setattr("smplan.executor.run.launch_local", launched)
    assert _continue(cli_runner, plan_text, out, "--model", GPT_TINY) == "launched"
    assert seen["fingerprint"] == older  # its next checkpoints keep it: they prune and fall back as before


@pytest.mark.parametrize("change", ["cp=2,mbs=1,gbs=2", "grad_compress=bf16,dp=1,mbs=1,gbs=2"])
def test_a_plan_files_run_continued_with_a_later_key_changed_is_refused(cli_runner, tmp_path, no_launch, change):
    """With seq_len in the plan, the older definition hashes a cp=1 and a cp=2 run alike: a review
    found cp=2 and grad_compress=bf16 continued such a checkpoint unasked."""
    plan, _ = resolve_plan(PLAN, model=GPT_TINY)
    path = tmp_path / "plan.json"
    plan.replace(seq_len=16).save(path)
    out = finished_run(tmp_path / "run", plan_text=str(path))
    changed = change.split(",")[0].split("=")[0]
    default = {"cp": "1", "grad_compress": "none"}[changed]  # left out of the layout at it; named by it
    other, _ = resolve_plan(change, model=GPT_TINY)
    other_path = tmp_path / "other.json"
    other.replace(seq_len=16).save(other_path)  # a plan file too: seq_len given in both
    for older in (False, True):  # this version's checkpoint, and one as an older smplan wrote it
        if older:
            _as_an_older_smplan_wrote_it(out, str(path))
        line = _continue(cli_runner, str(other_path), out)
        assert line.startswith("error: checkpoint") and f"layout: {changed} {default} -> " in line, (older, line)


def test_a_checkpoint_that_keeps_no_plan_is_not_taken_for_an_older_smplans():
    """Whether ep, cp and grad_compress changed is unknown there: no older fingerprint is taken, and a
    refusal names only what the inputs show (it named "ep (unset) -> 1" and the like)."""
    from smplan.executor.config import continued_inputs, hash_key

    plan, model_file = resolve_plan(PLAN, model=GPT_TINY)
    older = fingerprint_inputs(plan, model_file.sha256)  # seq_len null: the older definition, at defaults
    ours = fingerprint_inputs(plan.replace(seq_len=16), model_file.sha256)
    meta = {"fingerprint": hash_key(older), "fingerprint_inputs": older}
    assert continued_inputs(meta, plan, model_file.sha256, ours) == (ours, hash_key(ours), older)
    with_plan = {**meta, "plan": plan.to_dict()}
    assert continued_inputs(with_plan, plan, model_file.sha256, ours) == (older, hash_key(older), older)
