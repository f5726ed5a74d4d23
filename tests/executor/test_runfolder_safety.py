"""A launch into a run folder leaves the run there as it was until the new run has started:
another model's checkpoint is refused before anything starts, and records a failed start
rewrote go back; a stop after the last step does not offer a resume (single process, no launch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from smplan.executor import checkpoint, run_dir
from smplan.executor.checkpoint import CheckpointMismatchError
from smplan.executor.metrics import STOPPED_FILE, SUMMARY_FILE, mark_stopped
from smplan.planner.model_file import load_model_file

from tests.executor.runs import GPT_TINY

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp.save in one process


def _dcp_checkpoint(path: Path, model) -> Path:
    """A step-N folder holding `model`'s weights as train_state's "model" part (one process, no group)."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": model.state_dict()}, checkpoint_id=str(path))
    return path


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    model = load_model_file(GPT_TINY).build({}, device="cpu")
    return _dcp_checkpoint(tmp_path_factory.mktemp("ckpt") / "step-2", model)


@pytest.mark.parametrize(("args", "says"), [
    ({"layers": 6}, "it lacks 24 of the model's"),  # a bigger model: DCP would fail on every rank after the launch
    ({"layers": 2}, "it has 24 tensors the model lacks"),  # a smaller one: DCP would load two of four blocks silently
    ({"hidden": 64}, "as (64, 32), where the model has (64, 64)"),
])
def test_another_models_checkpoint_is_refused_in_one_line(tiny_checkpoint, args, says):
    other = load_model_file(GPT_TINY).build(args, device="meta")
    with pytest.raises(CheckpointMismatchError, match="holds another model") as err:
        checkpoint.check_model(tiny_checkpoint, other, "pass another -o/--output")
    assert says in str(err.value) and "\n" not in str(err.value)
    checkpoint.check_model(tiny_checkpoint, load_model_file(GPT_TINY).build({}, device="meta"), "unused")


def test_the_advice_names_what_starts_afresh(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert "another -o/--output" in run_dir.start_afresh(tmp_path, None)  # RUN/checkpoints: a new run folder
    assert "-o/--output and --checkpoint-dir" in run_dir.start_afresh(tmp_path, "ck")  # RUN holds steps
    assert run_dir.start_afresh(tmp_path / "new", "ck") == "pass another --checkpoint-dir to start afresh"


def _finished_run(folder: Path) -> dict[str, bytes]:
    folder.mkdir()
    (folder / "run_config.json").write_text(json.dumps({"plan": {}, "fingerprint": "a", "steps": 2}))
    (folder / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (folder / SUMMARY_FILE).write_text('{"steps": 2}\n')
    (folder / "ranks").mkdir()
    (folder / "ranks" / "rank-00003.jsonl").write_text('{"step": 2, "rank": 3}\n')
    ckpt = folder / "checkpoints" / "step-2"
    ckpt.mkdir(parents=True)
    (ckpt / checkpoint.META).write_text('{"fingerprint": "a", "step": 2}')
    (ckpt / checkpoint.MARKER).write_text("ok\n")
    return {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_records_of_a_launch_that_never_started_go_back(tmp_path):
    out = tmp_path / "run"
    before = _finished_run(out)
    earlier = run_dir.claim_run_dir(out, str(out / "checkpoints"), world=2)
    assert not (out / SUMMARY_FILE).exists() and not (out / "ranks" / "rank-00003.jsonl").exists()
    (out / "run_config.json").write_text('{"plan": {"other": 1}, "fingerprint": "b"}')  # launch_local's
    mark_stopped(out, "failed", "rank 0 exited with code 1")
    assert not earlier.started(out)  # the workers rewrite metrics.jsonl only once they resumed
    earlier.put_back()
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_launch_that_started_is_not_undone(tmp_path):
    out = tmp_path / "run"
    _finished_run(out)
    earlier = run_dir.claim_run_dir(out, str(out / "checkpoints"), world=2)
    (out / "metrics.jsonl").unlink()  # a new inode: the stamp differs even within the clock's tick
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')  # the workers' rewrite (later: a new mtime)
    assert earlier.started(out)


def test_a_stop_after_the_last_step_offers_no_resume(tmp_path):
    # Ctrl-C in the agent's shutdown, after rank 0 wrote summary.json: the run is finished
    out = tmp_path / "run"
    _finished_run(out)
    mark_stopped(out, "interrupted", "stopped with Ctrl-C; the same `smplan execute` command resumes it from step-2")
    assert not (out / STOPPED_FILE).exists()
    # between the last step and the summary: the record says it ran every step
    (out / SUMMARY_FILE).unlink()
    mark_stopped(out, "interrupted", "stopped with Ctrl-C; the same `smplan execute` command resumes it from step-2")
    detail = json.loads((out / STOPPED_FILE).read_text())["detail"]
    assert "every step ran" in detail and "resumes" not in detail
    # a step short of the end: the launcher's word stands
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    mark_stopped(out, "interrupted", "stopped with Ctrl-C; resumes it from step-1")
    assert json.loads((out / STOPPED_FILE).read_text())["detail"] == "stopped with Ctrl-C; resumes it from step-1"
    # a failure records its exception line as given, after the last step too (a review found the detail there);
    # a signal's stop, without one, records none
    mark_stopped(out, "failed", "rank 0 exited with code 1: ValueError: x", "ValueError: x")
    assert json.loads((out / STOPPED_FILE).read_text())["cause"] == "ValueError: x"
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    mark_stopped(out, "failed", "rank 0 exited with code 1: ValueError: x", "ValueError: x")
    assert json.loads((out / STOPPED_FILE).read_text())["cause"] == "ValueError: x"
    mark_stopped(out, "failed", "rank 0 killed by signal 9")
    assert "cause" not in json.loads((out / STOPPED_FILE).read_text())


def test_export_says_why_a_run_has_no_checkpoint(tmp_path):
    from smplan.executor.export import ExportError, pick_checkpoint

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run_config.json").write_text(json.dumps({"plan": {}, "checkpoint_every": 0}))
    with pytest.raises(ExportError, match="it ran without --checkpoint-every.*into a new -o/--output"):
        pick_checkpoint(run_dir)
    (run_dir / "run_config.json").write_text(json.dumps({"plan": {}, "checkpoint_every": 5}))
    with pytest.raises(ExportError, match="stopped before its first one was complete; run the same smplan execute"):
        pick_checkpoint(run_dir)
