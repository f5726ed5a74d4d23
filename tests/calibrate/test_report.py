"""The calibration report warns when the fitted profile still misses its own plans."""

from smplan.calibrate.run import POOR_FIT_APE, CalibrationReport, Row


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
