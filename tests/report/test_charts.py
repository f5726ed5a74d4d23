"""Each chart draws exactly the numbers of points.json (read back from the artists)."""

from __future__ import annotations

import copy
import math

import pytest

from smplan import report
from smplan.report.detail import percent_change
from smplan.report.points import MEMORY_PARTS, feasible, frontier_xy
from tests.conftest import EXAMPLES

from .chart_data import bars, collection_by_gid, heights, lefts, line_by_gid, lines, widths
from .synthetic import synthetic_record


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    report.write_report(synthetic_record(), out)
    return out, report.load(out / "points.json")


def approx(values):
    return pytest.approx(values, rel=1e-9, abs=1e-12)


def test_every_chart_applies_and_is_written(saved):
    out, record = saved
    # all but "versus", which needs a numeric varied setting (tests/cli/test_grad_compress_cli.py)
    assert list(record["charts"]) == [c for c in report.CHART_NAMES if c != "versus"]
    for file in record["charts"].values():
        assert (out / file).stat().st_size > 5000


def test_scaling_series_equal_points(saved):
    _, record = saved
    fig = report.draw_chart("scaling", record)
    ax_rate, ax_eff = fig.axes
    groups = {}
    for p in feasible(record["points"]):
        groups.setdefault(p["group"], []).append(p)
    rate, eff = lines(ax_rate), lines(ax_eff)
    assert set(rate) == set(groups) == set(eff)
    for name, members in groups.items():
        members.sort(key=lambda p: p["num_gpus"])
        assert rate[name][0] == [p["num_gpus"] for p in members]
        assert rate[name][1] == approx([p["figures"]["tokens_per_s"] for p in members])
        assert eff[name][1] == approx([p["scaling_efficiency"] for p in members])
    assert line_by_gid(ax_eff, "ideal").get_ydata()[0] == 1.0
    # log-log, the linear-scaling line over the data so that a group on it does not hide it
    assert ax_rate.get_xscale() == ax_rate.get_yscale() == "log"
    ideal = line_by_gid(ax_rate, "ideal")
    assert all(ideal.get_zorder() > line.get_zorder() for line in ax_rate.get_lines() if line.get_gid() != "ideal")


def test_frontier_series_equal_points(saved):
    _, record = saved
    ax = report.draw_chart("frontier", record).axes[0]
    by_id = {p["id"]: p for p in record["points"]}
    front = [frontier_xy(by_id[i], "tokens") for i in record["pareto"]]
    got = collection_by_gid(ax, "pareto").get_offsets().tolist()
    assert [v for xy in got for v in xy] == approx([v for xy in front for v in xy])
    line = line_by_gid(ax, "pareto_line")
    assert list(line.get_xdata()) == approx([x for x, _ in front])
    dominated = collection_by_gid(ax, "dominated").get_offsets().tolist()
    assert len(dominated) + len(front) == sum(1 for p in feasible(record["points"]) if p["run"])
    # each Pareto point carries its number, and the key beside the chart its settings and plan
    ids = {gid: sorted(t.get_text() for t in ax.texts if t.get_gid() == gid) for gid in ("pareto_id", "dominated_id")}
    assert ids["pareto_id"] == sorted(f"#{i}" for i in record["pareto"])
    assert len(ids["dominated_id"]) == len(dominated)  # the grey dots are numbered too
    key = next(t.get_text() for a in report.draw_chart("frontier", record).axes for t in a.texts
               if t.get_gid() == "pareto_key")
    for i in record["pareto"]:
        assert f"#{i}  {by_id[i]['label']}\n" in key and by_id[i]["plan_label"] in key
    # the recommended point is ringed and named in the legend (a review: it was red like the rest)
    ring = collection_by_gid(ax, "picked")
    assert ring.get_offsets().tolist() == [pytest.approx(list(frontier_xy(by_id[record["recommended"]], "tokens")))]
    assert f"recommended (#{record['recommended']})" in ring.get_label()


def test_a_frontier_spanning_days_to_weeks_is_drawn_on_a_log_axis(saved):
    _, record = saved
    spread = copy.deepcopy(record)
    for k, p in enumerate(p for p in spread["points"] if p.get("run")):
        p["run"]["days"] = 0.5 * 4 ** k  # 0.5 .. 512 days
    assert report.draw_chart("frontier", spread).axes[0].get_xscale() == "log"
    assert report.draw_chart("frontier", record).axes[0].get_xscale() == "linear"  # 85 to 800 days


def test_memory_bars_equal_points(saved):
    _, record = saved
    ax = report.draw_chart("memory", record).axes[0]
    shown = [p for p in record["points"] if (p["figures"] or {}).get("memory_breakdown_gib")]
    containers = bars(ax)
    bottom = [0.0] * len(shown)
    for part in MEMORY_PARTS:
        want = [p["figures"]["memory_breakdown_gib"][part] for p in shown]
        assert heights(containers[part]) == approx(want)
        assert [r.get_y() for r in containers[part]] == approx(bottom)
        bottom = [b + w for b, w in zip(bottom, want, strict=True)]
    assert bottom == approx([p["figures"]["memory_breakdown_gib"]["total"] for p in shown])
    caps = line_by_gid(ax, "capacity").get_ydata()
    assert list(caps) == approx([p["memory_capacity_gib"] for p in shown])
    # the infeasible point is drawn hatched and says so
    bad = [k for k, p in enumerate(shown) if not p["feasible"]]
    assert bad and all(containers["weights"][k].get_hatch() == "//" for k in bad)
    assert "does not fit" in ax.get_xticklabels()[bad[0]].get_text()


def test_breakdown_bars_equal_points(saved):
    _, record = saved
    ax = report.draw_chart("breakdown", record).axes[0]
    ok = feasible(record["points"])
    containers = bars(ax)
    for kind in ("compute", "tp_comm", "pp_p2p", "dp_comm_exposed", "bubble", "optimizer"):
        assert heights(containers[kind]) == approx([p["figures"]["breakdown"][kind] for p in ok])
    steps = line_by_gid(ax, "step_time").get_ydata()
    assert list(steps) == approx([p["figures"]["step_time_s"] for p in ok])


def test_gantt_bars_equal_tasks(saved):
    _, record = saved
    gantt = record["details"]["gantt"]
    ax = report.draw_chart("gantt", record).axes[0]
    containers = bars(ax)
    for kind in {t["kind"] for t in gantt["tasks"]}:
        tasks = [t for t in gantt["tasks"] if t["kind"] == kind]
        assert lefts(containers[kind]) == approx([t["start_s"] for t in tasks])
        assert widths(containers[kind]) == approx([t["end_s"] - t["start_s"] for t in tasks])
    assert line_by_gid(ax, "step_end").get_xdata()[0] == gantt["step_time_s"]


def test_goodput_lines_equal_points(saved):
    _, record = saved
    g = record["details"]["goodput"]
    ax_i, ax_m = report.draw_chart("goodput", record).axes
    line = line_by_gid(ax_i, "goodput")
    assert list(line.get_xdata()) == approx(g["vs_interval"]["interval_min"])
    assert list(line.get_ydata()) == approx(g["vs_interval"]["goodput"])
    line = line_by_gid(ax_m, "goodput")
    assert list(line.get_xdata()) == approx(g["vs_mtbf"]["gpu_mtbf_hours"])
    assert list(line.get_ydata()) == approx(g["vs_mtbf"]["goodput"])
    assert line_by_gid(ax_i, "young_daly").get_xdata()[0] == g["young_daly_min"]
    # the interval the run used, and the profile's MTBF, are marked (a review: neither was)
    assert line_by_gid(ax_i, "chosen_interval").get_xdata()[0] == g["chosen_interval_min"] != g["young_daly_min"]
    assert line_by_gid(ax_m, "profile_mtbf").get_xdata()[0] == g["gpu_mtbf_hours"]


def test_tornado_widths_equal_points(saved):
    _, record = saved
    s = record["details"]["sensitivity"]
    ax = report.draw_chart("sensitivity", record).axes[0]
    containers = bars(ax)
    got = dict(zip([t.get_text() for t in ax.get_yticklabels()],
                   zip(widths(containers["low"]), widths(containers["high"]), strict=True), strict=True))
    base = s["base_step_time_s"]
    from smplan.report.detail import sensitivity_label

    for item in s["items"]:
        low, high = got[sensitivity_label(item["key"])]
        assert math.isclose(low, percent_change(item["low_step_time_s"], base))
        assert math.isclose(high, percent_change(item["high_step_time_s"], base))
    # largest effect on top (last y position)
    assert sensitivity_label(s["items"][0]["key"]) == ax.get_yticklabels()[-1].get_text()
    # red where the step gets slower, whichever way the figure moved (a latency's -20% speeds it)
    from matplotlib.colors import to_hex

    from smplan.report.detail import FASTER, SLOWER

    for rect in [*containers["low"], *containers["high"]]:
        assert to_hex(rect.get_facecolor()) == (SLOWER if rect.get_width() > 0 else FASTER)


def test_the_chart_order_lists_every_breakdown_key_the_planner_and_simulator_emit():
    """A plan with ep and a host-bound pass: the closed form and the simulation emit every key."""
    from smplan.hwprofiles import load_cluster
    from smplan.planner import estimate, plan_from_inline, profile_model
    from smplan.simulator import simulate_plan

    from smplan.report.points import BREAKDOWN_ORDER
    prof = profile_model(f"{EXAMPLES / 'moe.py'}:tiny", seq_len=64)
    cl = load_cluster("h100x8", nodes=1)
    plan = plan_from_inline("dp=8,ep=2,mbs=1,gbs=8", model=prof.model, hw="h100x8", nodes=1, gpus_per_node=8,
                            num_blocks=prof.num_blocks)
    for parts in (simulate_plan(plan, prof, cl).figures.breakdown, estimate(plan, prof, cl).breakdown):
        assert "host_wait" in parts and "ep_all_to_all" in parts
        assert set(parts) <= set(BREAKDOWN_ORDER), set(parts) - set(BREAKDOWN_ORDER)


def test_gantt_comm_lanes_sit_below_the_compute_bars(saved):
    """The DP group's collectives (ZeRO-3 / FSDP's per-layer ones too) get their own lane under
    the forward and backward bars instead of covering them."""
    from smplan.whatif.details import EVENT_KINDS

    assert {EVENT_KINDS[k] for k in ("zero-gather", "zero-reduce", "dp-reduce")} == {"dp_comm"}
    _, record = saved
    containers = bars(report.draw_chart("gantt", record).axes[0])

    def within_row(patch) -> tuple[float, float]:  # (top, bottom) from the stage row's centre
        top = patch.get_y() - round(patch.get_y() + patch.get_height() / 2)
        return top, top + patch.get_height()

    compute_bottom = max(within_row(p)[1] for k in ("forward", "backward") for p in containers[k])
    assert min(within_row(p)[0] for p in containers["dp_comm"]) >= compute_bottom - 1e-9  # y grows downwards
