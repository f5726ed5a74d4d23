"""Ctrl-C in any verb: one line on stderr and exit code 130, not click's "Aborted!" and 1."""

import os
import signal
import subprocess
import sys
import time

import pytest

from smplan.cli.main import cli
from tests.conftest import ROOT


def test_ctrl_c_during_plan_is_one_line_and_130(cli_runner, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("smplan.cli.plan.plan_model", interrupted)
    result = cli_runner.invoke(cli, ["plan", "examples/gpt.py:tiny", "--hw", "a100x8"])
    assert result.exit_code == 130
    assert "Aborted" not in result.output
    assert [line for line in result.output.splitlines() if line.strip()] == ["interrupted"]


def _start_execute(out):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from smplan.cli.main import main; main()", "execute", "dp=2,mbs=1,gbs=2",
         "--model", str(ROOT / "examples" / "gpt.py:tiny"), "--out", str(out), "--steps", "100000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out / "metrics.jsonl").is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    return proc


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_to_execute_is_one_line_and_records_the_stop(tmp_path):
    """A closed terminal or a scheduler's kill (SIGTERM) ends like Ctrl-C: workers gone, the run
    directory kept, stopped.json for `monitor --follow`, and no agent traceback."""
    out = tmp_path / "run"
    proc = _start_execute(out)
    try:
        assert (out / "metrics.jsonl").is_file(), "the run never started a step"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1, err
    assert "Traceback" not in err and f"stopped by SIGTERM; run directory kept at {out}" in err
    assert "stopped by SIGTERM" in (out / "stopped.json").read_text()
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_during_execute_stops_workers_and_keeps_run_dir(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from smplan.cli.main import main; main()", "execute", "dp=2,mbs=1,gbs=2",
         "--model", str(ROOT / "examples" / "gpt.py:tiny"), "--out", str(out), "--steps", "100000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").is_file() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert (out / "metrics.jsonl").is_file(), "the run never started a step"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert f"interrupted; run directory kept at {out}" in err
    assert out.is_dir() and (out / "run_config.json").is_file()
    assert '"reason": "interrupted"' in (out / "stopped.json").read_text()  # monitor --follow stops on it
    # no worker outlives the launcher: its process group is empty
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)
