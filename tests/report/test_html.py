"""The page references only files that exist, shows the question, the plan and every point."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from smplan import report
from smplan.report.render import check_report_dir

from .synthetic import synthetic_record


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs: list[str] = []
        self.rows = 0

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href"):
                self.refs.append(value)
        if tag == "tr":
            self.rows += 1


def page_refs(index):
    parser = _Refs()
    parser.feed(index.read_text())
    return parser


@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_html_references_only_existing_files(tmp_path, fmt):
    index = report.write_report(synthetic_record(), tmp_path / "r", fmt=fmt)
    refs = page_refs(index)
    assert refs.refs, "the page shows no charts"
    for ref in refs.refs:
        assert not re.match(r"^[a-z]+:", ref), f"page fetches {ref}"
        assert (index.parent / ref).is_file(), ref
    images = [r for r in refs.refs if r.endswith(f".{fmt}")]
    record = json.loads((index.parent / "points.json").read_text())
    assert sorted(images) == sorted(record["charts"].values())
    # one row per point plus the header
    assert refs.rows == len(record["points"]) + 1
    if fmt == "svg":  # its words are text, not paths: searchable and selectable (a review)
        frontier = (index.parent / record["charts"]["frontier"]).read_text()
        assert "<text" in frontier and "Time to train vs cost" in frontier


def test_html_says_question_plan_and_infeasible_reason(tmp_path):
    record = synthetic_record()
    text = report.write_report(record, tmp_path / "r").read_text()
    assert record["question"]["text"] in text
    rec = record["points"][record["recommended"]]
    assert rec["plan_inline"] in text
    bad = [p for p in record["points"] if not p["feasible"]]
    assert bad and all(p["reason"] in text for p in bad)
    assert 'class="infeasible"' in text


def test_points_json_is_strict_json(tmp_path):
    record = synthetic_record()
    record["points"][0]["figures"]["mfu"] = float("nan")
    report.write_report(record, tmp_path / "r")
    raw = (tmp_path / "r" / "points.json").read_text()
    assert "NaN" not in raw and json.loads(raw)["points"][0]["figures"]["mfu"] is None


def test_refuses_non_empty_dir_without_force(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(report.ReportDirError, match="--force"):
        check_report_dir(tmp_path)
    assert check_report_dir(tmp_path, force=True) == tmp_path
    assert check_report_dir(tmp_path / "new") == tmp_path / "new"


def _nothing_feasible() -> dict:
    """A derived record whose every point needs more memory than the GPU has: one chart applies."""
    record = synthetic_record()
    for p in record["points"]:
        p["feasible"] = False
        p["reason"] = "needs more memory than the GPU has"
    record["recommended"] = None
    record["details"] = {}
    report.derive(record)
    return record


def test_a_rerun_with_fewer_charts_leaves_no_stale_one(tmp_path):
    out = tmp_path / "r"
    report.write_report(synthetic_record(), out)
    before = sorted(p.name for p in out.glob("*.png"))
    assert len(before) > 1
    (out / "mine.png").write_text("not a chart of the report")
    record = _nothing_feasible()
    report.write_report(record, out, fmt="svg")
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "memory.svg", "mine.png", "points.json"]


def test_no_feasible_point_still_renders(tmp_path):
    record = _nothing_feasible()
    index = report.write_report(record, tmp_path / "r")
    assert list(json.loads((tmp_path / "r" / "points.json").read_text())["charts"]) == ["memory"]
    assert "No point of this sweep is feasible" in index.read_text()
