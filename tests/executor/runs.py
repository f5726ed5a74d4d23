"""Running `smplan execute` for real in tests: a subprocess with a hard timeout, and a
/proc scan afterwards so that no process of the run outlives it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPT_TINY = str(ROOT / "examples" / "gpt.py") + ":tiny"
CLI = "from smplan.cli.main import main; main()"


def _live_processes():
    """(pid, command line, /proc/PID/stat's fields after the name) of every process but this one
    and zombies (psutil-free: /proc); field 0 is the state, 3 the session."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = Path(f"/proc/{entry}/stat").read_text().split(") ")[-1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            yield int(entry), cmdline, fields


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains `text`."""
    return [pid for pid, cmdline, _ in _live_processes() if text in cmdline]


def processes_in_session(session_id: int) -> list[int]:
    """Live processes of session `session_id`. A launcher started with start_new_session=True leads
    one; its fork server and the workers forked from it stay in it (their command line is the fork
    server's, which names no run folder)."""
    return [pid for pid, _, fields in _live_processes() if int(fields[3]) == session_id]


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# gloo on CPU, not smplan's Python: a worker killed by SIGSEGV or SIGABRT inside the C++ transport
# ("rank 0 killed by signal 11", ~1 run in 100 of the tp=2 runs on 2 busy cores). A fresh run is
# retried once; a run that continues an existing run directory is never retried.
GLOO_CRASHES = ("killed by signal 11", "killed by signal 6")


def run_execute(plan: str, out: Path, *args: str, timeout: float = 120, env: dict | None = None,
                model: str = GPT_TINY) -> subprocess.CompletedProcess:
    """`smplan execute PLAN --model MODEL --out OUT ARGS...`; kills the run and fails on timeout."""
    fresh = not Path(out).exists() or not any(Path(out).iterdir())
    result = _run_execute_once(plan, out, *args, timeout=timeout, env=env, model=model)
    if result.returncode and fresh and any(c in result.stdout for c in GLOO_CRASHES):
        print(f"retrying a gloo crash once:\n{result.stdout[-1500:]}", file=sys.stderr)
        for entry in Path(out).iterdir():
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        result = _run_execute_once(plan, out, *args, timeout=timeout, env=env, model=model)
    return result


def _run_execute_once(plan: str, out: Path, *args: str, timeout: float, env: dict | None,
                      model: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", CLI, "execute", plan, "--model", model, "--out", str(out), *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, start_new_session=True, cwd=ROOT)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        kill_all(processes_mentioning(str(out)))
        stdout, _ = proc.communicate()
        raise AssertionError(f"smplan execute {plan} ran past {timeout}s:\n{stdout[-4000:]}") from None
    leftovers = _wait_gone(str(out), proc.pid)
    kill_all(leftovers)
    assert not leftovers, f"processes left behind by the run: {leftovers}"
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, "")


def _wait_gone(text: str, session_id: int, within_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while True:
        left = sorted(set(processes_mentioning(text)) | set(processes_in_session(session_id)))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def rank_logs(out: Path) -> str:
    """Every rank's stdout.log and stderr.log of every attempt under OUT/elastic: where the test
    hooks' lines of ranks other than local rank 0 land (the console shows local rank 0 only)."""
    return "".join(log.read_text(errors="replace") for log in sorted(Path(out).glob("elastic/*/attempt_*/*/std*.log")))


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def checkpoint_state(step_dir: Path, tmp_path: Path) -> dict:
    """A DCP checkpoint folder as one flat {dotted key: value} dict (for bit-for-bit checks)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = tmp_path / f"{step_dir.parent.parent.name}-{step_dir.name}.pt"
    dcp_to_torch_save(str(step_dir), str(path))
    return dict(_flatten(torch.load(path, weights_only=False)))


def _flatten(obj, prefix=""):
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _flatten(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), obj


def assert_same_state(a: dict, b: dict) -> None:
    """Two checkpoint_state dicts hold the same keys and bit-identical values."""
    import torch

    assert a.keys() == b.keys() and any(k.startswith("model.") for k in a)
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def spawn_workers(fn, world: int, spec: str, tmp_path, timeout_s: float) -> None:
    """fn(rank, world, spec, init_file) on `world` spawned processes (a file:// rendezvous in
    tmp_path); fails past timeout_s and kills whatever is still alive, on success or failure."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=(world, spec, str(tmp_path / "init")), nprocs=world,
                             start_method="spawn", join=False)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, f"{spec}: workers ran past {timeout_s:g} s"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
