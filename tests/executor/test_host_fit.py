"""execute refuses, before launch, a run this machine cannot start: more local processes than
GPUs, or on CPU less host memory than the model's parameters with gradients and AdamW moments."""

from __future__ import annotations

from smplan.executor.host_fit import (
    GIB,
    available_host_bytes,
    shared_cores_note,
    state_copies,
    this_machine_problem,
)

from smplan.cli.main import cli


def test_gpus_bound_the_local_processes():
    assert this_machine_problem(8, 1, 10**9, gpus=8, available_bytes=None) is None
    why = this_machine_problem(16, 1, 10**9, gpus=8, available_bytes=None)
    assert why.startswith("the plan starts 16 processes on this machine, one per GPU, but it has 8")
    assert "--nproc-per-node 8" in why


def test_cpu_needs_four_copies_of_the_parameters_at_least():
    fp32 = 4 * 10**9  # 1e9 parameters at fp32: 14.9 GiB with gradients and two moments, + 2 x 0.22 runtime
    assert this_machine_problem(2, 1, fp32, gpus=None, available_bytes=16 * GIB) is None
    why = this_machine_problem(2, 1, fp32, gpus=None, available_bytes=8 * GIB)
    assert "needs at least 15.3 GiB" in why and "has 8.0 GiB available" in why and "\n" not in why
    assert this_machine_problem(2, 1, fp32 // 2, gpus=None, available_bytes=8 * GIB) is None  # bf16: half
    assert this_machine_problem(2, 2, fp32, gpus=None, available_bytes=8 * GIB) is None  # each node its share
    assert this_machine_problem(2, 1, fp32, gpus=None, available_bytes=None) is None  # unknown: no check


def test_cpu_counts_every_local_process_runtime():
    # a tiny model planned for 32 GPUs: its parameters fit anywhere, 32 torch processes (7 GiB) do not fit in 4 GiB
    assert this_machine_problem(2, 1, 10**6, gpus=None, available_bytes=4 * GIB) is None
    why = this_machine_problem(32, 1, 10**6, gpus=None, available_bytes=4 * GIB)
    assert "7.0 GiB for its 32 processes' torch runtime" in why and "plan fewer GPUs" in why
    one = this_machine_problem(1, 1, 4 * 10**9, gpus=None, available_bytes=4 * GIB)
    assert "GiB for its process's torch runtime" in one


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


def test_data_parallel_replicas_count_as_the_executor_keeps_them():
    assert state_copies(dp=1, zero=0) == 4  # one replica: weight, gradient, two moments
    assert state_copies(dp=8, zero=0) == 32  # DDP: all four on every replica
    assert state_copies(dp=8, zero=1) == 4 + 8  # FSDP2 ZeRO-1: the shards and the weights gathered to backward
    assert state_copies(dp=8, zero=3) == 4  # ZeRO-3: only the shards
    assert state_copies(dp=8, zero=3, pp=2) == 4 + 8 + 8  # pipelining keeps weights and gradients whole
    assert state_copies(dp=1, zero=3) == 4
    assert state_copies(dp=4, zero=0, cp=2) == 32  # context parallelism replicates the weights too
    assert state_copies(dp=8, zero=0, ep=8) == 4  # experts: one replica, still a lower bound


def test_a_cluster_plan_run_here_counts_its_replicas():
    # a 300M-parameter fp32 model planned as dp=8 ZeRO-1 on 32 GPUs: four copies (4.5 GiB + 7.0 GiB
    # of runtimes) fit 16 GiB, the twelve the replicas keep (13.4 GiB + 7.0) do not
    fp32 = 4 * 300 * 10**6
    assert this_machine_problem(32, 1, fp32, gpus=None, available_bytes=16 * GIB) is None
    why = this_machine_problem(32, 1, fp32, gpus=None, available_bytes=16 * GIB, copies=state_copies(8, 1))
    assert "needs at least 20.4 GiB" in why and "12 parameter-sized buffers in all" in why and "\n" not in why


def test_execute_counts_the_replicas_of_its_plan(cli_runner, tmp_path, monkeypatch):
    from smplan.executor.host_fit import PROCESS_RUNTIME_BYTES
    from smplan.executor.run import resolve_plan
    from smplan.executor.validate import validate_plan

    plan, model_file = resolve_plan("dp=2,zero=0,mbs=1,gbs=2", model="examples/gpt.py:tiny")
    param_bytes = validate_plan(plan, model_file, world_size=2).param_bytes
    # room for four copies and the two runtimes, not for DDP's two replicas of all four
    room = 2 * PROCESS_RUNTIME_BYTES + 6 * param_bytes
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("smplan.executor.run.available_host_bytes", lambda: room)
    monkeypatch.setattr("smplan.executor.run.launch_local", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("launched")))
    result = cli_runner.invoke(cli, ["execute", "dp=2,zero=0,mbs=1,gbs=2", "--model", "examples/gpt.py:tiny",
                                     "--steps", "1", "-o", str(tmp_path / "run")])
    assert result.exit_code == 2 and "8 parameter-sized buffers in all" in result.output, result.output
