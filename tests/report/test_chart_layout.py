"""What a reader sees: axes around the data, nothing covering a point or another label, titles
that fit, the versus chart plotting what varies and naming its unit."""

from __future__ import annotations

import copy
import itertools

import pytest

from smplan import report
from smplan.report.points import feasible, frontier_xy, versus_key

from .chart_data import collection_by_gid, lines
from .synthetic import synthetic_record


def _close_points() -> dict:
    """Every point within a day and $400 of the others, about 145 days and $83,000 (a failure-rate
    sweep of one plan), the last two at the very same spot, one Pareto point and the rest dominated."""
    record = copy.deepcopy(synthetic_record())
    for k, p in enumerate(p for p in record["points"] if p.get("run")):
        p["run"]["days"] = 144.3 + 0.1 * min(k, 4)
        p["run"]["usd"] = 82800.0 + 90.0 * min(k, 4)
    return report.derive(record)


def _extents(fig, artists):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    return [a.get_window_extent(renderer) for a in artists]


def test_frontier_of_close_points_spans_the_data_not_zero():
    record = _close_points()
    fig = report.draw_chart("frontier", record)
    ax = fig.axes[0]
    xy = [frontier_xy(p, "tokens") for p in feasible(record["points"])]
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    xs, ys = [x for x, _ in xy], [y for _, y in xy]
    assert x0 > 100 and y0 > 50_000  # not from 0: the points would sit in one corner
    # every marker inside, with room around it
    assert x0 < min(xs) - 0.05 * (max(xs) - min(xs)) and max(xs) + 0.05 * (max(xs) - min(xs)) < x1
    assert y0 < min(ys) - 0.05 * (max(ys) - min(ys)) and max(ys) + 0.05 * (max(ys) - min(ys)) < y1


def test_frontier_legend_and_numbers_cover_no_point_or_each_other():
    record = _close_points()
    fig = report.draw_chart("frontier", record)
    ax = fig.axes[0]
    assert ax.get_legend() is None and fig.axes[1].get_legend() is not None  # in the key beside the chart
    fig.draw_without_rendering()
    labels = [t for t in ax.texts if t.get_gid() in ("pareto_id", "dominated_id")]
    assert len(labels) == len([p for p in feasible(record["points"]) if p.get("run")])
    boxes = _extents(fig, labels)
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), "two point numbers overprint"
    markers = [collection_by_gid(ax, gid) for gid in ("pareto", "dominated")]
    centres = [ax.transData.transform(xy) for c in markers for xy in c.get_offsets()]
    for box in boxes:
        assert not any(box.contains(*c) for c in centres), "a number covers a marker"


def test_a_frontier_from_near_zero_keeps_zero():
    record = copy.deepcopy(synthetic_record())  # 85 to 800 days: 0 is part of the picture
    ax = report.draw_chart("frontier", record).axes[0]
    assert ax.get_xlim()[0] == 0.0


def _runs_vary(record: dict, key: str, values: list) -> dict:
    """The synthetic sweep as if `key` (a setting only a whole run reads) had varied with the hw."""
    record = copy.deepcopy(record)
    record["question"]["vary"] = {"hw": ["a100x8", "h100x8"], key: values}
    for p in record["points"]:
        p["settings"] = {"hw": p["hw"], key: values[p["id"] % len(values)]}
        if p.get("run"):
            p["run"]["goodput"] = 0.5 + 0.1 * (p["id"] % len(values))
    return report.derive(record)


def test_versus_a_failure_setting_plots_goodput_not_a_flat_step_time():
    values = [5000.0, 10000.0, 20000.0]
    record = _runs_vary(synthetic_record(), "reliability.gpu_mtbf_hours", values)
    assert versus_key(record) == "reliability.gpu_mtbf_hours" and "versus" in report.charts_that_apply(record)
    fig = report.draw_chart("versus", record)
    ax = fig.axes[0]
    assert fig._suptitle.get_text().startswith("Goodput vs reliability.gpu_mtbf_hours")
    for name, (x, y) in lines(ax).items():
        members = [p for p in feasible(record["points"]) if p["settings"]["hw"] in name]
        want = {p["settings"]["reliability.gpu_mtbf_hours"]: p["run"]["goodput"] for p in members}
        assert y == pytest.approx([want[v] for v in x])
    assert "hours" in ax.get_xlabel() and "goodput" in ax.get_ylabel()
    # around the data: 50% to 70% is the answer, not a line squeezed at the top of 0 to 100%
    assert 0.0 < ax.get_ylim()[0] < 0.5 and 0.7 < ax.get_ylim()[1] < 1.0
    assert "the axis does not start at 0" in ax.get_ylabel()  # ...and says so (a review)


def test_versus_prefers_the_checkpoint_interval_over_a_step_setting_when_runs_vary():
    record = _runs_vary(synthetic_record(), "checkpoint_interval_min", [10, 60])
    record["question"]["vary"] = {"global_batch": [256, 512], "checkpoint_interval_min": [10, 60]}
    for p in record["points"]:
        p["settings"] = {"global_batch": 256 if p["id"] % 4 < 2 else 512, **p["settings"]}
        p["settings"].pop("hw")
    assert versus_key(record) == "checkpoint_interval_min"
    without_runs = copy.deepcopy(record)
    for p in without_runs["points"]:
        p["run"] = None
    assert versus_key(without_runs) == "global_batch"  # a step chart again: there is no run


def test_versus_names_the_bandwidth_unit_and_leaves_room_above_the_highest_point():
    record = copy.deepcopy(synthetic_record())
    record["question"]["vary"] = {"inter_node.bandwidth_gbps": [25, 50, 100]}
    for p in record["points"]:
        p["settings"] = {"inter_node.bandwidth_gbps": [25, 50, 100][p["id"] % 3]}
        p["run"] = None
    record = report.derive(record)
    ax = report.draw_chart("versus", record).axes[0]
    assert "GB/s per GPU, each direction" in ax.get_xlabel() and "inter_node.bandwidth_gbps" in ax.get_xlabel()
    top = max(p["figures"]["step_time_s"] for p in feasible(record["points"]))
    assert ax.get_ylim()[1] >= 1.1 * top


def test_a_long_gantt_title_fits_the_figure():
    record = copy.deepcopy(synthetic_record())
    point = record["points"][record["details"]["gantt"]["point"]]
    point["label"] = "global_batch=1024 checkpoint_interval_min=60 inter_node.bandwidth_gbps=3.125"
    point["plan_label"] = "tp=1 pp=2 dp=8 ep=8 mbs=1 gbs=1024 zero=1 recompute=full 3/32 interleaved v=2 sp"
    fig = report.draw_chart("gantt", record)
    fig.draw_without_rendering()
    title = fig._suptitle
    box = _extents(fig, [title])[0]
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width, "the title runs off the figure"
    text = title.get_text().replace("\n", " ")
    assert point["label"] in text and point["plan_label"] in text and f"#{point['id']}" in text


def test_goodput_chart_says_which_point_it_shows():
    record = copy.deepcopy(synthetic_record())
    point = record["points"][record["details"]["goodput"]["point"]]
    title = report.draw_chart("goodput", record)._suptitle.get_text().replace("\n", " ")
    assert f"point #{point['id']} {point['label']}" in title


def test_goodput_chart_marks_a_run_that_does_not_finish():
    record = copy.deepcopy(synthetic_record())
    record["details"]["goodput"]["vs_mtbf"]["goodput"][0] = None  # as points.json writes NaN
    record["details"]["goodput"]["vs_mtbf"]["goodput_std"][0] = None
    ax_m = report.draw_chart("goodput", record).axes[1]
    lost = next(line for line in ax_m.get_lines() if line.get_gid() == "does_not_finish")
    assert list(lost.get_xdata()) == [record["details"]["goodput"]["vs_mtbf"]["gpu_mtbf_hours"][0]]


def test_versus_a_batch_sweep_plots_throughput_since_a_bigger_batch_takes_a_longer_step():
    record = copy.deepcopy(synthetic_record())
    record["question"]["vary"] = {"global_batch": [256, 1024, 4096]}
    for p in record["points"]:
        p["settings"] = {"global_batch": [256, 1024, 4096][p["id"] % 3]}
        p["run"] = None
    record = report.derive(record)
    fig = report.draw_chart("versus", record)
    ax = fig.axes[0]
    assert fig._suptitle.get_text().startswith("Throughput vs global_batch") and "tokens/s" in ax.get_ylabel()
    pairs = {(p["settings"]["global_batch"], p["figures"]["tokens_per_s"]) for p in feasible(record["points"])}
    for _, (x, y) in lines(ax).items():
        assert set(zip(x, y, strict=True)) <= pairs


def test_the_infeasible_points_note_has_a_strip_of_its_own_below_the_axes():
    record = copy.deepcopy(synthetic_record())
    record["points"][0]["feasible"] = False
    record["points"][0]["reason"] = "out of memory"
    fig = report.draw_chart("versus", report.derive(_runs_vary(record, "reliability.gpu_mtbf_hours",
                                                                [5000.0, 10000.0, 20000.0])))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()  # lays it out as savefig does
    renderer = fig.canvas.get_renderer()
    note = next(t for t in fig.texts if "infeasible point" in t.get_text())
    label = fig.axes[0].xaxis.label.get_window_extent(renderer)
    assert note.get_window_extent(renderer).y1 < label.y0  # below it, not across it


def test_the_memory_chart_names_a_point_with_no_plan_it_cannot_draw():
    record = copy.deepcopy(synthetic_record())
    record["points"][0].update(feasible=False, reason="no plan fits", figures=None)
    fig = report.draw_chart("memory", report.derive(record))
    notes = [t.get_text() for t in fig.texts if "infeasible point" in t.get_text()]
    assert notes and record["points"][0]["label"] in notes[0]
