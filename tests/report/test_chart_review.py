"""Chart legends in the order the sweep gave, beside the data; log axes that say so; captions and
units that match what is drawn."""

from __future__ import annotations

import copy

from smplan import report
from smplan.report import frontier_chart, goodput_chart, scaling_chart
from smplan.report.html import CAPTIONS

from .synthetic import synthetic_record


def _nodes_by_bandwidth(nodes=(2, 4, 16), bandwidths=(1, 5, 20)) -> dict:
    """The synthetic sweep as `--vary nodes=2,4,16 --vary storage.checkpoint_write_gbps=1,5,20`."""
    record = copy.deepcopy(synthetic_record())
    key = "storage.checkpoint_write_gbps"
    record["question"]["vary"] = {"nodes": list(nodes), key: list(bandwidths)}
    ok = [p for p in record["points"] if p["feasible"]]
    points = []
    for i, (n, bw) in enumerate((n, bw) for n in nodes for bw in bandwidths):
        p = copy.deepcopy(ok[i % len(ok)])
        p.update(id=i, label=f"nodes={n} {key}={bw}", settings={"nodes": n, key: bw}, num_gpus=8 * n, nodes=n)
        points.append(p)
    record["points"] = points
    record["recommended"] = 0
    return report.derive(record)


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_versus_legend_keeps_the_sweeps_order_not_the_texts():
    # "nodes=16, nodes=2, nodes=4" sorted as text
    ax = report.draw_chart("versus", _nodes_by_bandwidth()).axes[0]
    assert _legend(ax) == ["nodes=2", "nodes=4", "nodes=16"]
    descending = report.draw_chart("versus", _nodes_by_bandwidth(nodes=(16, 4, 2))).axes[0]
    assert _legend(descending) == ["nodes=16", "nodes=4", "nodes=2"]  # as the user gave them


def test_scaling_legend_keeps_the_sweeps_order():
    # "checkpoint_write_gbps=1, 20, 5" sorted as text
    fig = report.draw_chart("scaling", _nodes_by_bandwidth())
    key = "storage.checkpoint_write_gbps"
    assert _legend(fig.axes[0]) == [f"{key}=1", f"{key}=5", f"{key}=20"]


def test_versus_legend_sits_beside_the_axes_covering_no_point():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = report.draw_chart("versus", _nodes_by_bandwidth())
    FigureCanvasAgg(fig).draw()  # lays it out as savefig does
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1


def test_log_axes_say_they_are_log():
    scaling = report.draw_chart("scaling", _nodes_by_bandwidth())
    assert all("log scale" in ax.get_xlabel() for ax in scaling.axes)
    assert "log scale" in scaling.axes[0].get_ylabel() and "log scale" not in scaling.axes[1].get_ylabel()
    versus = report.draw_chart("versus", _nodes_by_bandwidth()).axes[0]
    assert versus.get_xscale() == "log" and versus.get_xlabel().endswith("(log scale)")
    points = [{"id": i, "label": f"nodes={n}", "plan_label": "tp=4", "feasible": True, "figures": {},
               "run": {"days": d, "usd": 1e5 + i, "tokens": 1e11}}
              for i, (n, d) in enumerate(((4, 40.0), (8, 20.0), (32, 2.0)))]
    frontier = frontier_chart(points, [2, 1, 0], "tokens").axes[0]
    assert frontier.get_xscale() == "log" and frontier.get_xlabel() == "time to train (days, with failures; log scale)"
    linear = frontier_chart([{**p, "run": {**p["run"], "days": 10.0 + p["id"]}} for p in points], [0], "tokens")
    assert "log" not in linear.axes[0].get_xlabel()
    series = {"goodput": [0.9, 0.92, 0.91], "goodput_std": [0.01] * 3}
    goodput = goodput_chart({"vs_interval": {"interval_min": [20.0, 50.0, 150.0], **series},
                             "vs_mtbf": {"gpu_mtbf_hours": [2e4, 5e4, 1.5e5], **series},
                             "young_daly_min": 50.0, "chosen_interval_min": 50.0})
    assert all(ax.get_xlabel().endswith("; log scale)") for ax in goodput.axes)


def test_the_frontier_caption_says_what_its_points_are_labelled_with():
    # it said "labelled with their plan"; they are numbered #N, their plans in the key beside the chart
    assert "labelled with their plan" not in CAPTIONS["frontier"]
    assert "#N" in CAPTIONS["frontier"] and "key beside the chart" in CAPTIONS["frontier"]


def test_a_model_without_sequences_is_charted_in_samples():
    record = _nodes_by_bandwidth()
    record["question"]["unit"] = "sample"
    scaling = report.draw_chart("scaling", record)
    assert scaling.axes[0].get_ylabel().startswith("samples per second")
    record["question"].update(tokens=None, days=10.0)
    record = report.derive(record)
    frontier = report.draw_chart("frontier", record)
    assert frontier._suptitle.get_text() == "Samples trained vs cost" and "samples trained" in frontier.axes[0].get_xlabel()
    assert "tokens/s" not in report.render_html(record) and "samples/s" in report.render_html(record)
    assert scaling_chart(record["points"]).axes[0].get_ylabel().startswith("tokens per second")  # the default


def test_the_page_rounds_as_the_tables_do():
    """Peak memory rounded down (79.97 of 80 GiB reads 79.9, as `plan` and whatif's table print it)
    and days with the tables' digits (113.24 reads 113.2), in the table and the recommended plan."""
    record = copy.deepcopy(_nodes_by_bandwidth())
    point = record["points"][record["recommended"]]
    point["figures"]["peak_memory_gib"], point["memory_capacity_gib"] = 79.97, 80
    point["run"].update(days=113.24, ideal_days=110.0)
    page = report.render_html(record)
    assert "79.9 of 80 GiB" in page and "79.9 / 80" in page and "80.0" not in page
    assert "113.2 days (110.0 without failures)" in page
