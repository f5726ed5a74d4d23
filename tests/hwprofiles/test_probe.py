import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from smplan.hwprofiles import load_cluster
from smplan.hwprofiles.probe import ProbeResult, fit_alpha_beta, fit_saturating, to_toml

from smplan.cli.main import cli


@settings(max_examples=25, deadline=None)
@given(peak=st.floats(0.01, 1000.0), half=st.floats(1.0, 2000.0))
def test_fit_saturating_recovers_curve(peak, half):
    sizes = (64, 128, 256, 512, 1024, 2048)
    curve = {d: peak * d / (d + half) for d in sizes}
    peaks, h = fit_saturating({"fp32": curve})
    assert abs(peaks["fp32"] - peak) / peak < 0.05
    # h is only identifiable to the grid's resolution (about 5% steps)
    assert abs(h - half) / half < 0.08


def test_fit_saturating_ignores_one_outlier():
    curve = {d: 100 * d / (d + 200) for d in (64, 128, 256, 512, 1024)}
    curve[128] = 0.3  # a core was busy
    peaks, h = fit_saturating({"fp32": curve})
    assert abs(peaks["fp32"] - 100) < 10 and 100 < h < 300


def test_fit_allreduce_recovers_alpha_beta():
    n, bw, alpha = 4, 2.0e9, 50e-6
    times = {b: 2 * (n - 1) * alpha + 2 * (n - 1) / n * b / bw for b in (1 << 12, 1 << 16, 1 << 20, 1 << 24)}
    gbps, lat_us = fit_alpha_beta(times, n, "all_reduce")
    assert np.isclose(gbps, 2.0, rtol=1e-6) and np.isclose(lat_us, 50.0, rtol=1e-6)


def test_probe_toml_loads_and_validates(tmp_path):
    result = ProbeResult(device="cpu", nproc=2, peak_tflops={"fp32": 0.1, "bf16": 0.3}, matmul_half_dim=120.0,
                         memory_bandwidth_gbps=20.0, memory_gib=8.0, link_bandwidth_gbps=1.5, link_latency_us=300.0)
    path = tmp_path / "myhw.toml"
    path.write_text(to_toml(result))
    cluster = load_cluster(str(path))
    assert cluster.gpus_per_node == 2 and cluster.gpu.peak_tflops.bf16 == 0.3
    assert cluster.efficiency.matmul_half_dim == 120.0
    # what smplan execute does by construction: eager kernels, collectives that wait, NCCL-style all-to-alls
    e = cluster.efficiency
    assert (e.elementwise_fusion, e.tp_comm_overlap, e.ep_a2a_overlap, e.ep_dispatcher) == (0.0, 0.0, 0.0, "all_to_all")
    assert cluster.gpu.sm_count == 0  # a CPU probe states no SM count


def test_probe_toml_keeps_a_gpus_sm_count(tmp_path):
    result = ProbeResult(device="cuda", nproc=1, peak_tflops={"fp32": 60.0, "bf16": 800.0}, matmul_half_dim=100.0,
                         memory_bandwidth_gbps=3000.0, memory_gib=80.0, link_bandwidth_gbps=3000.0,
                         link_latency_us=1.0, sm_count=132)
    path = tmp_path / "gpu.toml"
    path.write_text(to_toml(result))
    assert load_cluster(str(path)).gpu.sm_count == 132


def test_probe_cli_writes_loadable_profile(cli_runner, tmp_path, monkeypatch):
    import functools

    import smplan.hwprofiles.probe as probe_module

    # the command as it runs, over the smaller half of its sizes (the largest GEMMs and messages
    # were most of its 38 s in CI); the fits need no more points than these
    monkeypatch.setattr(probe_module, "probe", functools.partial(
        probe_module.probe, sizes=probe_module.DEFAULT_SIZES[:3], message_bytes=(1 << 10, 1 << 14, 1 << 18, 1 << 20)))
    out = tmp_path / "probed.toml"
    result = cli_runner.invoke(cli, ["hw", "probe", "-o", str(out), "--nproc", "2"])
    assert result.exit_code == 0, result.output
    cluster = load_cluster(str(out))
    assert cluster.gpu.peak_tflops.fp32 > 0 and cluster.intra_node.bandwidth_gbps > 0
    again = cli_runner.invoke(cli, ["hw", "probe", "-o", str(out)])
    assert again.exit_code == 2 and "--force" in again.output


def test_fit_alpha_beta_each_collective():
    from smplan.hwprofiles.probe import fit_alpha_beta

    n, bw, alpha = 4, 1.5e9, 80e-6
    forms = {
        "all_gather": lambda b: (n - 1) * alpha + (n - 1) / n * b / bw,
        "send_recv": lambda b: alpha + b / bw,
    }
    for kind, form in forms.items():
        gbps, lat_us = fit_alpha_beta({b: form(b) for b in (1 << 10, 1 << 14, 1 << 20, 1 << 24)}, n, kind)
        assert np.isclose(gbps, 1.5, rtol=1e-6) and np.isclose(lat_us, 80.0, rtol=1e-6), kind


def test_fit_alpha_beta_latency_not_set_by_noise_on_large_messages():
    n, bw, alpha = 2, 2.0e9, 50e-6
    times = {b: 2 * (n - 1) * alpha + 2 * (n - 1) / n * b / bw for b in (1 << 10, 1 << 14, 1 << 18, 1 << 24)}
    times[1 << 24] *= 1.05  # 5% noise on the big message is 400 us: it must not read as latency
    _, lat_us = fit_alpha_beta(times, n, "all_reduce")
    assert 40 < lat_us < 60


def test_probe_toml_reports_every_collective_fit(tmp_path):
    result = ProbeResult(device="cpu", nproc=2, peak_tflops={"fp32": 0.1}, matmul_half_dim=30.0,
                         memory_bandwidth_gbps=10.0, memory_gib=4.0, link_bandwidth_gbps=1.0, link_latency_us=90.0,
                         collective_fits={"all_reduce": (1.0, 90.0), "all_gather": (0.8, 120.0), "send_recv": (2.0, 40.0)})
    text = to_toml(result)
    assert "all_gather: 0.8 GB/s, 120.0 us" in text and "send_recv: 2 GB/s, 40.0 us" in text
    path = tmp_path / "p.toml"
    path.write_text(text)
    assert load_cluster(str(path)).intra_node.latency_us == 90.0


def _one_line_exit_2(result):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]


def test_eager_probe_writes_no_fusion(tmp_path):
    result = ProbeResult(device="cpu", nproc=1, peak_tflops={"fp32": 0.1}, matmul_half_dim=30.0,
                         memory_bandwidth_gbps=10.0, memory_gib=2.0, link_bandwidth_gbps=10.0, link_latency_us=1.0)
    text = to_toml(result)
    assert "elementwise_fusion = 0.0" in text and "executor" not in text
    assert "not measured (one process)" in text and "all-reduce fit" not in text  # one process exchanges nothing
    path = tmp_path / "p.toml"
    path.write_text(text)
    assert load_cluster(str(path)).efficiency.elementwise_fusion == 0.0
    # smplan execute's ZeRO is FSDP2: one collective per block, kept under the default stack
    assert load_cluster(str(path)).efficiency.zero_granularity == "block"


class _DeadProcess:
    """A spawned worker that has already died (exit code 1)."""

    exitcode = 1

    def __init__(self, *args, **kwargs):
        pass

    def start(self):
        pass

    def join(self, timeout=None):
        pass

    def is_alive(self):
        return False

    def kill(self):
        pass


class _DeadContext:
    Process = _DeadProcess

    @staticmethod
    def Queue():  # noqa: N802  (the multiprocessing context's name)
        import queue

        return queue.Queue()

    @staticmethod
    def Barrier(n):  # noqa: N802
        return None


@pytest.mark.parametrize("which", ["compute", "collectives"])
def test_a_dead_worker_is_a_value_error_that_says_what_to_try(monkeypatch, which):
    import multiprocessing

    from smplan.hwprofiles.probe import (
        ProbeError,
        measure_collectives,
        measure_compute_concurrently,
    )

    monkeypatch.setattr(multiprocessing, "get_context", lambda method=None: _DeadContext())
    with pytest.raises(ProbeError) as err:
        if which == "compute":
            measure_compute_concurrently(2, (64,), ("fp32",), 1)
        else:
            measure_collectives(2, (1024,))
    assert isinstance(err.value, ValueError)
    assert "exited with code 1" in str(err.value) and "--nproc-per-node" in str(err.value)


def test_more_processes_than_gpus_is_one_line_before_probing(cli_runner, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr("smplan.hwprofiles.probe.probe", lambda **kw: pytest.fail("probed despite too many processes"))
    line = _one_line_exit_2(cli_runner.invoke(cli, ["hw", "probe", "--nproc", "4"]))
    assert "--nproc-per-node 4" in line and "has 2" in line and "--nproc-per-node 2" in line


@pytest.mark.parametrize("name", ["", "  ", " lab", "two\nlines", "a\rb", "tab\there"])
def test_a_blank_or_padded_profile_name_is_one_line_before_probing(cli_runner, monkeypatch, name):
    monkeypatch.setattr("smplan.hwprofiles.probe.probe", lambda **kw: pytest.fail("probed despite a bad name"))
    line = _one_line_exit_2(cli_runner.invoke(cli, ["hw", "probe", "--name", name]))
    assert "is not a profile name" in line and "--name mycluster" in line


def _fake_probe(**kwargs):
    return ProbeResult(device="cpu", nproc=2, peak_tflops={"fp32": 0.1}, matmul_half_dim=30.0,
                       memory_bandwidth_gbps=10.0, memory_gib=2.0, link_bandwidth_gbps=1.0, link_latency_us=50.0)


def test_probe_refuses_to_overwrite_in_one_line(cli_runner, tmp_path, monkeypatch):
    monkeypatch.setattr("smplan.hwprofiles.probe.probe", lambda **kw: pytest.fail("probed before refusing"))
    out = tmp_path / "mine.toml"
    out.write_text("keep me")
    line = _one_line_exit_2(cli_runner.invoke(cli, ["hw", "probe", "-o", str(out)]))
    assert "--force" in line and out.read_text() == "keep me"


def test_probe_writes_nothing_that_would_not_load(cli_runner, tmp_path, monkeypatch):
    def broken_probe(**kwargs):  # a measurement gone wrong: a link of 0 GB/s fails validation
        return dataclasses.replace(_fake_probe(), link_bandwidth_gbps=0.0)

    monkeypatch.setattr("smplan.hwprofiles.probe.probe", broken_probe)
    out = tmp_path / "mine.toml"
    out.write_text("keep me")
    result = cli_runner.invoke(cli, ["hw", "probe", "-o", str(out), "--force"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    *_, line = result.output.strip().splitlines()  # the progress bar's label, then the error
    assert line.startswith("error: ") and "nothing written" in line and "bandwidth" in line
    assert out.read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["mine.toml"]  # no temporary file left behind


def test_probe_name_is_quoted_and_the_file_replaced_with_force(cli_runner, tmp_path, monkeypatch):
    monkeypatch.setattr("smplan.hwprofiles.probe.probe", _fake_probe)
    out = tmp_path / "mine.toml"
    out.write_text("keep me")
    ok = cli_runner.invoke(cli, ["hw", "probe", "-o", str(out), "--force", "--name", 'lab "b"'])
    assert ok.exit_code == 0, ok.output
    cluster = load_cluster(str(out))
    assert cluster.name == 'lab "b"' and cluster.gpu.peak_tflops.fp32 == 0.1


def test_a_cpu_profile_reserves_a_cpu_workers_memory_and_a_gpu_profile_keeps_2_gib(tmp_path):
    from smplan.hwprofiles.probe import CPU_MEMORY_RESERVE_GIB

    reserves = {}
    for device, sm_count in (("cpu", 0), ("cuda", 132)):
        result = ProbeResult(device=device, nproc=1, peak_tflops={"fp32": 0.1}, matmul_half_dim=30.0,
                             memory_bandwidth_gbps=10.0, memory_gib=8.0, link_bandwidth_gbps=5.0,
                             link_latency_us=10.0, sm_count=sm_count)
        path = tmp_path / f"{device}.toml"
        path.write_text(to_toml(result))
        reserves[device] = load_cluster(str(path)).efficiency.memory_reserve_gib
    assert reserves == {"cpu": CPU_MEMORY_RESERVE_GIB, "cuda": 2.0}
    assert CPU_MEMORY_RESERVE_GIB < 1.0  # a 235k-parameter model no longer shows 2 GiB used
