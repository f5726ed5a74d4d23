"""What-if report charts and the HTML page, usable from a notebook.

    from smplan import report
    record = report.load("out/points.json")
    report.scaling_chart(record["points"])            # a matplotlib Figure
    report.write_report(record, "out2/", fmt="svg")   # every chart that applies + index.html

The record's schema is in `smplan.report.points`.
"""

import importlib

from .html import render_html
from .points import CHART_NAMES, PointsError, charts_that_apply, derive, load, save

# The charts import matplotlib (about 0.3 s, `python -X importtime`): they load on first use
# (PEP 562), so `smplan execute` and `monitor`, which need only the page's CSS, start without it.
_LAZY = {
    **dict.fromkeys(("breakdown_chart", "frontier_chart", "memory_chart", "scaling_chart"), ".charts"),
    **dict.fromkeys(("gantt_chart", "goodput_chart", "sensitivity_chart"), ".detail"),
    **dict.fromkeys(("ReportDirError", "draw_chart", "write_report"), ".render"),
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CHART_NAMES",
    "PointsError",
    "ReportDirError",
    "breakdown_chart",
    "charts_that_apply",
    "derive",
    "draw_chart",
    "frontier_chart",
    "gantt_chart",
    "goodput_chart",
    "load",
    "memory_chart",
    "render_html",
    "save",
    "scaling_chart",
    "sensitivity_chart",
    "write_report",
]
