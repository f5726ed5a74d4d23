"""A continuation of a finished run that fails, or is stopped, before its first new step (every
checkpoint damaged, a rank's crash in the model build) leaves the folder saying so: stopped.json,
not the earlier part's summary.json, so `smplan monitor` does not call it finished (no launch: the
launcher's failure is played in this process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from smplan.executor.launch import LaunchError
from smplan.executor.metrics import RUN_CONFIG_FILE, STOPPED_FILE, SUMMARY_FILE, mark_stopped

from smplan.cli.main import cli
from tests.executor.finished_run import PLAN, finished_run
from tests.executor.runs import GPT_TINY

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp.save in one process


def _failing_launch(cfg, *args, **kwargs):
    """launch_local when every rank fails to load the checkpoint: its config written, its stop recorded."""
    cfg.save(Path(cfg.out_dir) / RUN_CONFIG_FILE)
    mark_stopped(cfg.out_dir, "failed", "rank 0 exited with code 1: error: no checkpoint of this run could be read")
    raise LaunchError("training failed after 0 restart(s): rank 0 exited with code 1", run_dir=Path(cfg.out_dir))


def test_a_continuation_that_fails_to_resume_is_recorded_as_stopped(cli_runner, tmp_path, monkeypatch):
    out = finished_run(tmp_path / "run", steps=2)
    monkeypatch.setattr("smplan.executor.run.launch_local", _failing_launch)
    result = cli_runner.invoke(cli, ["execute", PLAN, "--model", GPT_TINY, "--steps", "4", "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert not (out / SUMMARY_FILE).exists()  # the 2-step part's: the folder's run now asks for 4
    assert json.loads((out / STOPPED_FILE).read_text())["reason"] == "failed"
    shown = cli_runner.invoke(cli, ["monitor", str(out)]).output
    assert "stopped (failed)" in shown and "step 2/4" in shown and "finished" not in shown, shown


def test_a_launch_that_ends_before_any_worker_starts_changes_nothing(cli_runner, tmp_path, monkeypatch):
    out = finished_run(tmp_path / "run", steps=2)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def no_agent(cfg, *args, **kwargs):  # the rendezvous could not start: no worker ran
        raise RuntimeError("the c10d store could not bind")

    monkeypatch.setattr("smplan.executor.run.launch_local", no_agent)
    result = cli_runner.invoke(cli, ["execute", PLAN, "--model", GPT_TINY, "--steps", "4", "-o", str(out)])
    assert isinstance(result.exception, RuntimeError)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_json_carries_the_failure(cli_runner, tmp_path, monkeypatch):
    out = finished_run(tmp_path / "run", steps=2)
    monkeypatch.setattr("smplan.executor.run.launch_local", _failing_launch)
    result = cli_runner.invoke(cli, ["execute", PLAN, "--model", GPT_TINY, "--steps", "4", "-o", str(out), "--json"])
    assert result.exit_code == 1, result.output
    said = json.loads(result.stdout)
    assert said == {"status": "failed", "run_dir": str(out), "exit_code": 1, "summary": None,
                    "reason": "rank 0 exited with code 1: error: no checkpoint of this run could be read"}
    assert result.stderr.splitlines()[-1].startswith("error: training failed")  # the line as without --json
