"""What-if report charts and the HTML page, usable from a notebook.

    from smplan import report
    record = report.load("out/points.json")
    report.scaling_chart(record["points"])            # a matplotlib Figure
    report.write_report(record, "out2/", fmt="svg")   # every chart that applies + index.html

The record's schema is in `smplan.report.points`.
"""

from .charts import breakdown_chart, frontier_chart, memory_chart, scaling_chart
from .detail import gantt_chart, goodput_chart, sensitivity_chart
from .html import render_html
from .points import CHART_NAMES, PointsError, charts_that_apply, derive, load, save
from .render import ReportDirError, draw_chart, write_report

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
