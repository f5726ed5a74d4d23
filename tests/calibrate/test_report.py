"""The calibration report warns when the fitted profile still misses its own plans."""

from smplan.hwprofiles import Efficiency

from smplan.calibrate.fit import FIT_KEYS, FitResult
from smplan.calibrate.run import (
    POOR_FIT_APE,
    CalibrateOptions,
    CalibrationReport,
    Row,
    fit_is_worse,
    kept_input_line,
)


def _report(after_ratios, fit=None):
    rows = [Row(f"plan{i}", 0.1, 0.1 * r, 0.1 * r) for i, r in enumerate(after_ratios)]
    return CalibrationReport(hw="my.toml", before=rows, after=rows, fit=fit)


def _fit(undetermined=(), **values):
    return FitResult(Efficiency(**values), FIT_KEYS, 1.0, 0.5, 10, undetermined)


def test_good_fit_has_no_warning():
    report = _report([1.02, 0.97, 1.05])
    assert report.warning is None and report.to_dict()["warning"] is None


def test_poor_fit_names_the_worst_plan():
    report = _report([1.39, 1.06, 0.52])
    assert report.median_ape_after > POOR_FIT_APE
    assert "plan2 is predicted at 0.52x" in report.warning and "--plans" in report.warning
    assert report.to_dict()["warning"] == report.warning


def test_no_fit_no_warning():
    assert CalibrationReport(hw="my.toml", before=[Row("p", 0.1, 0.5, 0.5)]).warning is None


def test_a_fit_that_misses_more_than_the_input_is_worse():
    before = [Row(f"plan{i}", 0.1, 0.1 * r, 0.1 * r) for i, r in enumerate([1.1, 0.9, 0.05])]  # median 10%
    after = [Row(f"plan{i}", 0.1, 0.1 * r, 0.1 * r) for i, r in enumerate([2.7, 2.7, 0.14])]  # median 170%
    report = CalibrationReport(hw="my.toml", before=before, after=after)
    assert fit_is_worse(report)
    report.kept_input = kept_input_line(report, CalibrateOptions(output="cal.toml"))
    assert report.kept_input.startswith("kept my.toml's own factors") and "nothing was written to cal.toml" in report.kept_input
    assert "170.0%" in report.kept_input and "10.0%" in report.kept_input
    # plan2 ran 20x its prediction, the others within 1.1x: named, not "rerun on an idle machine"
    assert "plan2 ran 20.00x its prediction against 0.91x, 1.11x for the others" in report.kept_input
    assert report.warning is None  # no calibrated profile to warn about
    assert not fit_is_worse(CalibrationReport(hw="my.toml", before=after, after=before))
    assert not fit_is_worse(CalibrationReport(hw="my.toml", before=before))  # --check: nothing fitted


def test_plans_predicted_too_slow_at_capped_fractions_blame_the_peak_figures():
    """Every plan slower in the model than measured, the fractions at 1: no unpriced cost, the
    runs beat the probed peaks (a new user's probed profile: pred/meas 1.29, 1.24, 1.03)."""
    capped = _fit(("host_overhead_us_per_layer",), matmul_max=1.0, memory_bound=1.0, network=1.0)
    warning = _report([1.29, 1.24, 1.03], capped).warning
    assert "too slow" in warning and "matmul_max, memory_bound, network at the upper bound 1" in warning
    assert "gpu.peak_tflops" in warning and "gpu.memory_bandwidth_gbps" in warning and "smplan hw probe" in warning
    assert "does not price" not in warning and "Python overhead" not in warning
    assert "network at" not in _report([1.29, 1.24, 1.03], _fit(("network",), network=1.0)).warning  # not fitted
    free = _fit(matmul_max=0.7, memory_bound=0.8, network=0.9)  # room left: something else is off
    assert "does not price" in _report([1.29, 1.24, 1.03], free).warning
    mixed = _report([1.39, 1.06, 0.52], capped).warning  # some plans too fast: not a peak too low
    assert "does not price" in mixed and "smplan hw probe" not in mixed


def test_plans_that_merely_scatter_are_told_to_repeat_rounds():
    """No plan 2x off the others' median: noise, which --rounds averages out (a review: the advice
    was given for a plan 7x off too, which rounds cannot mend)."""
    before = [Row(f"plan{i}", 0.1, 0.1 * r, 0.1 * r) for i, r in enumerate([0.94, 0.64, 1.3])]
    report = CalibrationReport(hw="my.toml", before=before, after=before)
    assert "rerun with --rounds 3 on an idle machine" in kept_input_line(report, CalibrateOptions(output="c.toml"))


def test_a_failed_plan_is_one_line_without_execute_advice(tmp_path):
    """The FAILED line held the whole traceback and execute's "--checkpoint-every N" advice (a review)."""
    from smplan.calibrate.measure import failure_line

    report = ("training failed after 0 restart(s): rank 1 exited with code 1:\n  | Traceback (most recent call last):\n"
              '  |   File "m.py", line 3, in f\n  | ValueError: bad width\nfull log of rank 1: /x/stderr.log\n'
              "it wrote no checkpoint; rerun with --checkpoint-every N")
    line = failure_line(report, tmp_path)
    assert line == f"training failed after 0 restart(s): rank 1 exited with code 1: ValueError: bad width; see {tmp_path}/workers.log"
    assert failure_line("stopped by SIGTERM", tmp_path) == f"stopped by SIGTERM; see {tmp_path}/workers.log"
