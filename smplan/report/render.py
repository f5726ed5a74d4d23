"""Write a report directory: every chart that applies, points.json and index.html."""

from __future__ import annotations

import json
from pathlib import Path

from .charts import breakdown_chart, frontier_chart, memory_chart, scaling_chart, versus_chart
from .detail import gantt_chart, goodput_chart, sensitivity_chart
from .html import render_html
from .points import (
    CHART_NAMES,
    charts_that_apply,
    frontier_mode,
    picked_word,
    save,
    unit_of,
    versus_key,
)

FORMATS = ("png", "svg")


class ReportDirError(ValueError):
    """The report directory cannot be written as asked."""


def check_report_dir(out_dir: str | Path, force: bool = False) -> Path:
    """Refuse a non-empty existing directory unless `force` (run before any work is done)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ReportDirError(f"{out} exists and is not a directory; choose another -o")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ReportDirError(f"{out} is not empty; pass --force to overwrite it or choose another -o")
    return out


def draw_chart(name: str, record: dict, path=None):
    """The Figure of chart `name` (one of CHART_NAMES) for a derived points record."""
    points = record["points"]
    details = record.get("details") or {}
    unit = unit_of(record)  # samples for a model without sequences
    if name == "scaling":
        return scaling_chart(points, path, unit)
    if name == "versus":
        return versus_chart(points, versus_key(record), path, unit)
    if name == "frontier":
        rid = record.get("recommended")
        picked = None if rid is None else (rid, picked_word(record))
        return frontier_chart(points, record["pareto"], frontier_mode(record["question"]), path, unit, picked)
    if name == "memory":
        return memory_chart(points, path)
    if name == "breakdown":
        return breakdown_chart(points, path)
    if name == "gantt":
        return gantt_chart(details["gantt"], _of_point(points[details["gantt"]["point"]]), path)
    if name == "goodput":
        return goodput_chart(details["goodput"], path, _of_point(points[details["goodput"]["point"]]))
    if name == "sensitivity":
        return sensitivity_chart(details["sensitivity"], path)
    raise ValueError(f"unknown chart {name!r}")


def _of_point(point: dict) -> str:
    """A detail chart's title suffix: which point it shows, as the table numbers and labels it."""
    return f" — point #{point['id']} {point['label']}: {point['plan_label']}"


def write_report(record: dict, out_dir: str | Path, fmt: str = "png", force: bool = True) -> Path:
    """Charts, points.json and index.html under `out_dir`; returns the index.html path.

    `record` must already be derived (`smplan.report.derive`). Its `charts` entry is set to
    the files written, so points.json and the page agree on what exists.
    """
    if fmt not in FORMATS:
        raise ReportDirError(f"unknown chart format {fmt!r}; use png or svg")
    out = check_report_dir(out_dir, force)
    out.mkdir(parents=True, exist_ok=True)
    earlier = _charts_written_before(out)
    record["charts"] = {}
    for name in charts_that_apply(record):
        file = f"{name}.{fmt}"
        draw_chart(name, record, out / file)
        record["charts"][name] = file
    for file in earlier - set(record["charts"].values()):  # a rerun drew fewer: no stale chart beside the new page
        (out / file).unlink(missing_ok=True)
    save(record, out / "points.json")
    index = out / "index.html"
    index.write_text(render_html(record))
    return index


def _charts_written_before(out: Path) -> set[str]:
    """The chart files an earlier report in `out` wrote (its points.json's `charts`): only
    names this module writes (CHART_NAMES x FORMATS), whatever a hand-edited file says."""
    try:
        charts = json.loads((out / "points.json").read_text()).get("charts") or {}
    except (OSError, ValueError, AttributeError):
        return set()
    ours = {f"{name}.{fmt}" for name in CHART_NAMES for fmt in FORMATS}
    return {f for f in charts.values() if isinstance(f, str) and f in ours} if isinstance(charts, dict) else set()
