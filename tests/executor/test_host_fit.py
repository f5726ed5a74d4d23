"""execute refuses, before launch, a run this machine cannot start: more local processes than
GPUs, or on CPU less host memory than the fp32 AdamW state of the model."""

from __future__ import annotations

from smplan.executor.host_fit import GIB, available_host_bytes, this_machine_problem

from smplan.cli.main import cli


def test_gpus_bound_the_local_processes():
    assert this_machine_problem(8, 1, 10**9, gpus=8, available_bytes=None) is None
    why = this_machine_problem(16, 1, 10**9, gpus=8, available_bytes=None)
    assert why.startswith("the plan starts 16 processes on this machine, one per GPU, but it has 8")
    assert "--nproc-per-node 8" in why


def test_cpu_needs_sixteen_bytes_per_parameter_at_least():
    params = 10**9  # 14.9 GiB of weights, gradients and AdamW moments
    assert this_machine_problem(2, 1, params, gpus=None, available_bytes=15 * GIB) is None
    why = this_machine_problem(2, 1, params, gpus=None, available_bytes=8 * GIB)
    assert "needs at least 14.9 GiB" in why and "has 8.0 GiB available" in why and "\n" not in why
    # spread over nodes, each holds its share
    assert this_machine_problem(2, 2, params, gpus=None, available_bytes=8 * GIB) is None
    assert this_machine_problem(2, 1, params, gpus=None, available_bytes=None) is None  # unknown: no check


def test_available_memory_is_read():
    free = available_host_bytes()
    assert free is None or free > 0


def test_execute_refuses_before_launch(cli_runner, tmp_path, monkeypatch):
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
