"""`smplan execute -o RUN` into a folder holding a finished run: what is refused (the run there is
left as it was), and a continuation that fails to load its checkpoint is recorded as stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from smplan.executor.run_lock import LOCK_FILE

from tests.executor.runs import run_execute

ARGS = ("--steps", "2", "--checkpoint-every", "2")


def _records(out: Path) -> dict[str, bytes]:
    """Everything of the run but the workers' logs (a launch adds its own)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and "elastic" not in p.parts and p.name != LOCK_FILE}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    result = run_execute("mbs=1,gbs=2", out, *ARGS)
    assert result.returncode == 0, result.stdout[-3000:]
    return out


@pytest.mark.parametrize(("args", "says"), [
    # another model: refused before launch, without offering --force-resume
    (("--arg", "layers=6", "--force-resume"), "holds another model: it lacks 24 of the model's"),
    (("--arg", "layers=2"), "holds another model: it has 24 tensors the model lacks"),
    # the same model under another plan: a new -o starts afresh (not another --checkpoint-dir)
    (("--nproc-per-node", "2"), "pass another -o/--output to start afresh"),
])
def test_another_run_is_refused_in_one_line_and_the_folder_kept(finished, args, says):
    before = _records(finished)
    plan = "dp=2,mbs=1,gbs=2" if "--nproc-per-node" in args else "mbs=1,gbs=2"
    result = run_execute(plan, finished, "--steps", "4", *args)
    assert result.returncode == 2, result.stdout[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in result.stdout, result.stdout
    if "another -o/--output" in says:
        assert "--checkpoint-dir" not in lines[0] and "--force-resume" in lines[0]
    assert _records(finished) == before


def test_a_resume_that_fails_to_load_is_recorded_as_stopped(finished, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished, out)
    for shard in (out / "checkpoints" / "step-2").glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:10])  # damaged after it was written: every rank fails to load it
    before = _records(out)
    result = run_execute("mbs=1,gbs=2", out, "--steps", "4")
    assert result.returncode == 1 and "could not be read" in result.stdout, result.stdout[-3000:]
    after = _records(out)  # the continuation's stop, not the 2-step part's summary (monitor: "stopped (failed)")
    assert "summary.json" not in after and json.loads(after["stopped.json"])["reason"] == "failed"
    kept = {name for name in before if name.startswith("checkpoints/") or name == "metrics.jsonl"}
    assert {name: after[name] for name in kept} == {name: before[name] for name in kept}  # steps, checkpoints
