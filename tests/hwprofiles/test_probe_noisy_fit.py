"""A collective fit that makes no physical sense is never written as is (issue: a loaded
machine once probed 5229133.60 GB/s and 0.0 us); the probe falls back to a robust
estimate and says, in one line, that the timings were noisy."""

import pytest
from smplan.hwprofiles import load_cluster
from smplan.hwprofiles.probe import fit_alpha_beta, fit_collectives, robust_alpha_beta

from smplan.cli.main import cli

SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
# Loaded machine: three collectives were lost in the GEMM's noise (the worker's 1e-7 s floor);
# the old weighted least squares read them as 1.3 PB/s and no latency.
LOST_IN_NOISE = dict(zip(SIZES, (1e-7, 1e-7, 1e-7, 2e-3, 4e-3, 9.8e-3), strict=True))


def _ring_all_reduce(n, bw, alpha):
    return {b: 2 * (n - 1) * alpha + 2 * (n - 1) / n * b / bw for b in SIZES}


def test_times_lost_in_noise_give_the_largest_messages_rate_not_petabytes():
    fit = robust_alpha_beta(LOST_IN_NOISE, 2, "all_reduce")
    assert fit.noisy
    assert fit.bandwidth_gbps == pytest.approx((1 << 24) / 9.8e-3 / 1e9)  # 1.71 GB/s
    assert fit.latency_us > 100  # from the smallest message really measured (256 KiB at 2 ms)
    assert fit_alpha_beta(LOST_IN_NOISE, 2, "all_reduce") == (fit.bandwidth_gbps, fit.latency_us)


def test_a_negative_intercept_is_not_written_as_zero_latency():
    # slower per byte the bigger the message (contention): the line through them crosses zero below 0
    times = {b: 1e-2 * (b / SIZES[-1]) ** 1.1 for b in SIZES}
    fit = robust_alpha_beta(times, 2, "all_reduce")
    assert fit.noisy and fit.latency_us > 0
    assert fit.bandwidth_gbps == pytest.approx((1 << 24) / 1e-2 / 1e9)


def test_a_bandwidth_above_the_ceiling_is_noisy():
    times = _ring_all_reduce(2, 50e9, 20e-6)  # 50 GB/s between processes of a 10 GB/s memory: impossible
    assert not robust_alpha_beta(times, 2).noisy
    fit = robust_alpha_beta(times, 2, max_gbps=10.0)
    assert fit.noisy and fit.bandwidth_gbps <= 10.0


def test_times_that_shrink_with_the_message_size_are_noisy():
    times = dict(zip(SIZES, (9e-3, 8e-3, 7e-3, 6e-3, 5e-3, 4e-3), strict=True))
    fit = robust_alpha_beta(times, 2)
    assert fit.noisy and fit.bandwidth_gbps == pytest.approx((1 << 24) / 4e-3 / 1e9)


def test_a_clean_fit_is_kept_and_gives_no_warning():
    fits, warnings = fit_collectives({"all_reduce": _ring_all_reduce(4, 2e9, 50e-6)}, 4, memory_bandwidth_gbps=20.0)
    assert fits["all_reduce"] == pytest.approx((2.0, 50.0)) and warnings == []


def test_noisy_kinds_are_named_in_one_warning_line():
    clean = _ring_all_reduce(2, 2e9, 50e-6)
    _, warnings = fit_collectives({"all_reduce": LOST_IN_NOISE, "all_gather": clean, "send_recv": LOST_IN_NOISE}, 2,
                                  memory_bandwidth_gbps=20.0)
    assert len(warnings) == 1
    assert "all_reduce, send_recv timings were noisy" in warnings[0] and "re-probe on an idle machine" in warnings[0]


def test_probe_cli_warns_once_and_writes_the_robust_estimate(cli_runner, tmp_path, monkeypatch):
    from smplan.hwprofiles import probe as probe_module

    curves = {"fp32": {d: 0.1 * d / (d + 50) for d in (64, 128, 256)}, "bf16": {d: 0.2 * d / (d + 50) for d in (64, 128, 256)}}
    monkeypatch.setattr(probe_module, "measure_compute_concurrently", lambda *a, **kw: (curves, 10.0))
    monkeypatch.setattr(probe_module, "measure_collectives",
                        lambda nproc, sizes, progress=None: {k: LOST_IN_NOISE for k in probe_module.COLLECTIVE_KINDS})
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    out = tmp_path / "myhw.toml"
    result = cli_runner.invoke(cli, ["hw", "probe", "-o", str(out), "--nproc-per-node", "2"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "timings were noisy" in warnings[0], result.output
    assert "all_reduce fit: 1.71 GB/s" in result.output
    cluster = load_cluster(str(out))
    assert cluster.intra_node.bandwidth_gbps == pytest.approx(1.712, rel=1e-3) and cluster.intra_node.latency_us > 0
    assert "# warning: the all_reduce, all_gather, send_recv timings were noisy" in out.read_text()
