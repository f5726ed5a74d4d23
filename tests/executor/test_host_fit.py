"""execute refuses, before launch, a run this machine cannot start: more local processes than
GPUs, or on CPU less host memory than the model's parameters with gradients and AdamW moments."""

from __future__ import annotations

from smplan.executor.host_fit import (
    GIB,
    available_host_bytes,
    shared_cores_note,
    this_machine_problem,
)

from smplan.cli.main import cli


def test_gpus_bound_the_local_processes():
    assert this_machine_problem(8, 1, 10**9, gpus=8, available_bytes=None) is None
    why = this_machine_problem(16, 1, 10**9, gpus=8, available_bytes=None)
    assert why.startswith("the plan starts 16 processes on this machine, one per GPU, but it has 8")
    assert "--nproc-per-node 8" in why


def test_cpu_needs_four_copies_of_the_parameters_at_least():
    fp32 = 4 * 10**9  # 1e9 parameters at fp32: 14.9 GiB with gradients and two moments, + 2 x 0.15 runtime
    assert this_machine_problem(2, 1, fp32, gpus=None, available_bytes=16 * GIB) is None
    why = this_machine_problem(2, 1, fp32, gpus=None, available_bytes=8 * GIB)
    assert "needs at least 15.2 GiB" in why and "has 8.0 GiB available" in why and "\n" not in why
    assert this_machine_problem(2, 1, fp32 // 2, gpus=None, available_bytes=8 * GIB) is None  # bf16: half
    assert this_machine_problem(2, 2, fp32, gpus=None, available_bytes=8 * GIB) is None  # each node its share
    assert this_machine_problem(2, 1, fp32, gpus=None, available_bytes=None) is None  # unknown: no check


def test_cpu_counts_every_local_process_runtime():
    # a tiny model planned for 32 GPUs: its parameters fit anywhere, 32 torch processes do not fit in 4 GiB
    assert this_machine_problem(2, 1, 10**6, gpus=None, available_bytes=4 * GIB) is None
    why = this_machine_problem(32, 1, 10**6, gpus=None, available_bytes=4 * GIB)
    assert "4.7 GiB for its 32 processes' torch runtime" in why and "plan fewer GPUs" in why


def test_available_memory_is_capped_by_the_cgroup(tmp_path):
    live = available_host_bytes()
    assert live is None or live > 0
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    8388608 kB\n")  # 8 GiB
    group = tmp_path / "cgroup"
    group.mkdir()
    assert available_host_bytes(group, meminfo) == 8 * GIB  # no cgroup files: the machine's figure
    (group / "memory.max").write_text(f"{3 * GIB}\n")
    (group / "memory.current").write_text(f"{GIB}\n")
    assert available_host_bytes(group, meminfo) == 2 * GIB  # the group's limit less its use
    (group / "memory.max").write_text("max\n")
    assert available_host_bytes(group, meminfo) == 8 * GIB


def test_execute_refuses_before_launch(cli_runner, tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # the CPU branch, on a GPU machine too
    monkeypatch.setattr("smplan.executor.run.available_host_bytes", lambda: 1024)
    monkeypatch.setattr("smplan.executor.run.launch_local", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("launched")))
    out = tmp_path / "run"
    result = cli_runner.invoke(cli, ["execute", "dp=2,mbs=1,gbs=2", "--model", "examples/gpt.py:tiny",
                                     "--steps", "1", "-o", str(out)])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.startswith("error: on CPU this run needs at least") and "\n" not in line and "Traceback" not in line
    assert not out.exists()


def test_more_cpu_processes_than_cores_are_said_to_share_them():
    assert shared_cores_note(2, cores=2) is None
    assert shared_cores_note(4, cores=2).startswith("note: 4 processes train on this machine's 2 CPU cores")
    assert shared_cores_note(1) is None  # this machine's own count
