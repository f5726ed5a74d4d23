"""A collective fit that makes no physical sense is never written as is (issue: a loaded
machine once probed 5229133.60 GB/s and 0.0 us); the probe falls back to a robust
estimate and says, in one line, that the timings were noisy."""

import numpy as np
import pytest
from smplan.hwprofiles import load_cluster
from smplan.hwprofiles.probe import fit_alpha_beta, fit_collectives, robust_alpha_beta
from smplan.hwprofiles.probe_collectives import MEASURED_FLOOR_S, MIN_STEP_LATENCY_US, is_measured

from smplan.cli.main import cli

SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
# Loaded machine: three collectives were lost in the GEMM's noise (the worker's 1e-7 s floor);
# the old weighted least squares read them as 1.3 PB/s and no latency.
LOST_IN_NOISE = dict(zip(SIZES, (1e-7, 1e-7, 1e-7, 2e-3, 4e-3, 9.8e-3), strict=True))
# The floor as the worker once sent it, through a float32 tensor: 1.0000000116860974e-07, just above it.
FLOOR_VIA_FLOAT32_S = float(np.float32(MEASURED_FLOOR_S))


def _ring_all_reduce(n, bw, alpha):
    return {b: 2 * (n - 1) * alpha + 2 * (n - 1) / n * b / bw for b in SIZES}


def test_times_lost_in_noise_give_the_largest_messages_rate_not_petabytes():
    fit = robust_alpha_beta(LOST_IN_NOISE, 2, "all_reduce")
    assert fit.noisy
    assert fit.bandwidth_gbps == pytest.approx((1 << 24) / 9.8e-3 / 1e9)  # 1.71 GB/s
    assert fit.latency_us > 100  # from the smallest message really measured (1 MiB at 2 ms)
    assert fit_alpha_beta(LOST_IN_NOISE, 2, "all_reduce") == (fit.bandwidth_gbps, fit.latency_us)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather"])
def test_a_floor_read_back_through_float32_is_dropped_not_taken_as_the_latency(kind):
    # a reviewer's probe wrote intra_node latency_us = 0.050: this floor over the 2 steps of a 2-process all-reduce
    times = {b: FLOOR_VIA_FLOAT32_S if t == MEASURED_FLOOR_S else t for b, t in LOST_IN_NOISE.items()}
    fit = robust_alpha_beta(times, 2, kind)
    assert fit == robust_alpha_beta(LOST_IN_NOISE, 2, kind)  # however the floor round-trips
    assert fit.noisy and fit.latency_us > 100  # from 1 MiB at 2 ms, not 0.1 us


def test_a_large_messages_whole_time_is_not_the_latency():
    # send_recv on a loaded machine: 1 KiB to 1 MiB lost in the noise (half the floor: a round trip is two
    # messages), and 4 MiB timed faster per byte than 16 MiB (it fits in cache), so at the 16 MiB rate its
    # bandwidth term exceeds its whole time; the probe once wrote that whole time, 3601 us, as the latency
    floor = FLOOR_VIA_FLOAT32_S / 2
    times = dict(zip(SIZES, (floor, floor, floor, floor, 3.601e-3, 16e-3), strict=True))
    fit = robust_alpha_beta(times, 2, "send_recv")
    assert fit.noisy and fit.bandwidth_gbps == pytest.approx((1 << 24) / 16e-3 / 1e9)
    assert fit.latency_us == MIN_STEP_LATENCY_US  # the timings resolve no latency: the fastest link's step


def test_the_floor_is_not_measured_however_it_was_sent():
    floors = np.array([MEASURED_FLOOR_S, FLOOR_VIA_FLOAT32_S, FLOOR_VIA_FLOAT32_S / 2, MEASURED_FLOOR_S / 2])
    assert not is_measured(floors).any() and is_measured(np.array([1e-6, 2e-3])).all()


def test_the_robust_latency_is_the_smallest_messages_time_less_its_bandwidth_term():
    fit = robust_alpha_beta(LOST_IN_NOISE, 4, "all_gather")
    bandwidth_term_s = 3 / 4 * (1 << 20) / (fit.bandwidth_gbps * 1e9)
    assert fit.latency_us == pytest.approx((2e-3 - bandwidth_term_s) / 3 * 1e6)  # 3 steps of a 4-process all-gather


def test_a_fitted_latency_below_the_fastest_links_step_is_noisy():
    times = _ring_all_reduce(2, 2e9, 1e-9)  # 1 ns a step: no link is that fast, it is the fit's noise
    fit = robust_alpha_beta(times, 2)
    assert fit.noisy and fit.latency_us == MIN_STEP_LATENCY_US
    assert fit.bandwidth_gbps == pytest.approx(2.0, rel=1e-3)


def test_a_negative_intercept_is_not_written_as_zero_latency():
    # slower per byte the bigger the message (contention): the line through them crosses zero below 0
    times = {b: 1e-2 * (b / SIZES[-1]) ** 1.1 for b in SIZES}
    fit = robust_alpha_beta(times, 2, "all_reduce")
    assert fit.noisy and fit.latency_us >= MIN_STEP_LATENCY_US
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


def test_figures_no_timing_resolved_are_said_to_be_assumed():
    """Every all_reduce at the floor: the ceiling and NVLink's step stand in, and the warning says so
    (it said the bandwidth came from the largest message and the latency from the smallest)."""
    floors = dict.fromkeys(SIZES, MEASURED_FLOOR_S)
    fits, (warning,) = fit_collectives({"all_reduce": floors, "all_gather": LOST_IN_NOISE}, 2, 20.0)
    assert fits["all_reduce"] == (20.0, MIN_STEP_LATENCY_US)
    assert "no all_reduce timing rose above the noise, so its bandwidth is the ceiling: this machine's memory-copy" in warning
    assert f"the all_reduce latency was not resolved, so it is NVLink's {MIN_STEP_LATENCY_US:g} us a step" in warning
    assert "all_gather latency" not in warning and "no all_gather" not in warning  # 1 MiB resolved its latency
    big_only = robust_alpha_beta({**floors, SIZES[-1]: 9.8e-3}, 2)  # only 16 MiB measured: latency unresolved
    assert big_only.latency_assumed and not big_only.bandwidth_assumed
