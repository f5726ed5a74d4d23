"""The calibration report warns when the fitted profile still misses its own plans."""

from smplan.calibrate.run import (
    POOR_FIT_APE,
    CalibrateOptions,
    CalibrationReport,
    Row,
    fit_is_worse,
    kept_input_line,
)


def _report(after_ratios):
    rows = [Row(f"plan{i}", 0.1, 0.1 * r, 0.1 * r) for i, r in enumerate(after_ratios)]
    return CalibrationReport(hw="my.toml", before=rows, after=rows)


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
    assert report.warning is None  # no calibrated profile to warn about
    assert not fit_is_worse(CalibrationReport(hw="my.toml", before=after, after=before))
    assert not fit_is_worse(CalibrationReport(hw="my.toml", before=before))  # --check: nothing fitted
