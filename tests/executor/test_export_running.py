"""`smplan export` of a run that is still going, or that was killed before its first
checkpoint: its advice is what `smplan execute` accepts, and a live run is said to be one."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket

import pytest
from smplan.executor.export import ExportError, pick_checkpoint, running_launch

from smplan.cli.main import cli

LOCK = ".smplan.lock"  # executor/run_lock.py's LOCK_FILE


def _killed_run(run_dir, steps: int, every: int):
    """A run folder as a launcher killed with SIGKILL leaves it: steps, no checkpoint, a stale lock file."""
    run_dir.mkdir()
    (run_dir / "run_config.json").write_text(json.dumps({"plan": {}, "checkpoint_every": every, "steps": 200}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 4.0}) + "\n"
                                                   for s in range(1, steps + 1)))
    (run_dir / LOCK).write_text(f"pid 999999 on {socket.gethostname()}, since 2025-01-01 00:00:00")
    return run_dir


@contextlib.contextmanager
def _launch_holding(run_dir):
    """What a live `smplan execute` holds: an exclusive flock on RUN_DIR/.smplan.lock."""
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since now".encode(), 0)
        yield
    finally:
        os.close(fd)


def test_a_run_killed_before_its_first_checkpoint_is_sent_to_a_new_folder(tmp_path, cli_runner):
    # execute refuses this folder ("already holds a run (87 steps) and no checkpoint"): the
    # advice must not be to run the same command again
    run = _killed_run(tmp_path / "krun", steps=87, every=100)
    assert running_launch(run) is None  # the lock file stayed, the lock did not
    result = cli_runner.invoke(cli, ["export", str(run), str(tmp_path / "kexp")])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert "stopped at step 87" in line and "every 100 steps" in line
    assert "new -o/--output with --checkpoint-every N (N at most 87" in line
    assert "same smplan execute command" not in line and not (tmp_path / "kexp").exists()


def test_a_run_stopped_before_any_step_may_run_again_in_place(tmp_path):
    run = _killed_run(tmp_path / "run", steps=0, every=5)
    with pytest.raises(ExportError, match="run the same smplan execute command again"):
        pick_checkpoint(run)


def test_a_live_run_without_a_checkpoint_yet_says_when_it_saves_one(tmp_path, cli_runner):
    run = _killed_run(tmp_path / "run", steps=3, every=50)
    with _launch_holding(run):
        assert running_launch(run).startswith(f"pid {os.getpid()} on ")
        result = cli_runner.invoke(cli, ["export", str(run), str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert "still going" in line and "saves its first at step 50" in line and "new -o" not in line
    assert running_launch(run) is None  # the probe took no lock of its own


def test_a_live_run_is_exported_from_its_newest_checkpoint_with_a_note(tmp_path, cli_runner):
    transformers = pytest.importorskip("transformers")
    from tests.executor.test_export import TINY, make_run

    folder = tmp_path / "llama"
    transformers.LlamaConfig(**TINY).save_pretrained(folder)
    run, _ = make_run(tmp_path, f"hf:{folder}", steps=(2, 5))
    with _launch_holding(run):
        result = cli_runner.invoke(cli, ["export", str(run), str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["step"] == 5 and json.loads(result.stdout)["running"].startswith("pid ")
    (note,) = result.stderr.strip().splitlines()
    assert note.startswith("note: exporting step 5, the newest complete checkpoint, while the run is still going")
    quiet = cli_runner.invoke(cli, ["export", str(run), str(tmp_path / "out2")])  # ended: nothing to say
    assert quiet.exit_code == 0 and "still going" not in quiet.output
