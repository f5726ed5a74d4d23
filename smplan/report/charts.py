"""Sweep-level charts: scaling, time-to-train vs cost, memory per GPU, step-time breakdown.

Each function takes plain data from a points record (see `smplan.report.points`), returns
a matplotlib Figure, and saves it when `path` is given. The plotted numbers are the
record's numbers unchanged (axis formatters do the unit scaling), so a test can read them
back from the artists.
"""

from __future__ import annotations

import numpy as np
from matplotlib.ticker import EngFormatter, FuncFormatter, PercentFormatter

from .points import (
    BREAKDOWN_ORDER,
    MEMORY_PARTS,
    feasible,
    frontier_xy,
    usd_per_million,
    versus_metric,
)
from .style import color, finish, label_log_axis, log_scale_label, new_figure, pretty, tick_label

# A unit's short form on axis ticks ("100 ktok/s"); a sample is what a model without sequences counts.
UNIT_TICKS = {"token": "tok", "sample": "sample"}


def scaling_chart(points: list[dict], path=None, unit: str = "token"):
    """Tokens/s (samples/s for a model without sequences) and scaling efficiency vs GPU count, one
    line per group (GPU type...), the groups in the points' order (the --vary values' order)."""
    fig, (ax_rate, ax_eff) = new_figure("Scaling: throughput and efficiency vs GPUs", ncols=2, width=12)
    groups: dict[str, list[dict]] = {}
    for p in feasible(points):
        groups.setdefault(p["group"], []).append(p)
    all_gpus: set[int] = set()
    effs: list[float] = [1.0]
    for i, (name, members) in enumerate(groups.items()):
        members.sort(key=lambda p: p["num_gpus"])
        gpus = [p["num_gpus"] for p in members]
        all_gpus.update(gpus)
        rate = [p["figures"]["tokens_per_s"] for p in members]
        eff = [p["scaling_efficiency"] for p in members]
        c = color("", i)
        ax_rate.plot(gpus, rate, marker="o", color=c, label=name)
        ideal = [rate[0] * g / gpus[0] for g in gpus]
        # drawn over the data (zorder): a group that scales linearly would otherwise hide it
        ax_rate.plot(gpus, ideal, linestyle=":", color="black", linewidth=1.5, alpha=0.7, zorder=3, gid="ideal")
        ax_eff.plot(gpus, eff, marker="o", color=c, label=name)
        effs += [e for e in eff if e is not None]
    # over the data, as on the throughput panel: efficiencies of 100% would otherwise hide it
    ax_eff.axhline(1.0, color="black", linestyle=":", linewidth=1.5, alpha=0.7, zorder=3, gid="ideal")
    for ax in (ax_rate, ax_eff):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(all_gpus))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel(log_scale_label("GPUs"))
        ax.legend(title="dotted: linear scaling" if ax is ax_rate else None, fontsize=9)
    ax_rate.set_title("training throughput (log-log: linear scaling is a straight line)")
    ax_rate.set_yscale("log")  # with the log GPU axis, as scaling plots are read: equal ratios, equal steps
    ax_rate.set_ylabel(log_scale_label(f"{unit}s per second"))
    label_log_axis(ax_rate.yaxis, EngFormatter(unit=f"{UNIT_TICKS[unit]}/s"))
    ax_eff.set_title("per-GPU throughput vs the fewest-GPU point")
    ax_eff.set_ylabel("scaling efficiency")
    ax_eff.yaxis.set_major_formatter(PercentFormatter(1.0))
    # up to the highest of 100% and the data, with room above: more GPUs can beat 100% (ZeRO shards
    # thinner, a smaller TP group wastes less), and a point on the frame hides the 100% line
    ax_eff.set_ylim(0, max(effs) * (1 + DATA_MARGIN))
    _note_infeasible(fig, points)
    return finish(fig, path)


# Axis names with units of the numeric settings a sweep varies (units as the hardware profiles'
# comments give them: hwprofiles/profiles/*.toml); another key is named as it is.
SETTING_LABELS = {
    "inter_node.bandwidth_gbps": "inter-node bandwidth (GB/s per GPU, each direction)",
    "intra_node.bandwidth_gbps": "intra-node bandwidth (GB/s per GPU, each direction)",
    "inter_node.latency_us": "inter-node latency (us)",
    "intra_node.latency_us": "intra-node latency (us)",
    "gpu.memory_bandwidth_gbps": "HBM bandwidth (GB/s per GPU)",
    "gpu.memory_gib": "GPU memory (GiB)",
    "reliability.gpu_mtbf_hours": "GPU mean time between failures (hours)",
    "reliability.restart_minutes": "restart after a failure (minutes)",
    "storage.checkpoint_write_gbps": "checkpoint write bandwidth (GB/s per node)",
    "storage.filesystem_write_gbps": "file-system write bandwidth (GB/s for the job)",
    "checkpoint_interval_min": "checkpoint interval (minutes)",
    "global_batch": "global batch (samples)",
    "gbs": "global batch (samples)",
    "seq_len": "sequence length (tokens)",
    "cost.usd_per_gpu_hour": "price (USD per GPU-hour)",
}
# Fraction of the data's span left empty on each side of a chart, so that no marker sits on
# (and is cut by) an edge and a point's number fits beside it.
DATA_MARGIN = 0.12


def setting_label(key: str) -> str:
    """`key` as an axis label: what it is and its unit, then the key itself (what --vary takes)."""
    text = SETTING_LABELS.get(key)
    return f"{text}  [{key}]" if text and text != key else key


def versus_chart(points: list[dict], key: str, path=None, unit: str = "token"):
    """Step time vs one numeric varied setting (`key`), one line per the other settings (say
    grad_compress against inter_node.bandwidth_gbps) in the points' order, the legend beside the
    axes; throughput for a setting that changes a step's work (the batch, the sequence); goodput
    over the run for a setting that only a whole run reads (failures, checkpoints), whose step
    time would be a flat line."""
    metric = versus_metric(key, points)
    what = {"goodput": "Goodput", "tokens_per_s": "Throughput", "usd_per_mtok": "Cost"}.get(metric, "Step time")
    fig, ax = new_figure(f"{what} vs {key}", width=9, height=5)
    lines: dict[str, list[dict]] = {}
    for p in feasible(points):
        rest = " ".join(f"{k}={v}" for k, v in p["settings"].items() if k != key) or "all"
        lines.setdefault(rest, []).append(p)
    ys_all: list[float] = []
    for i, (name, members) in enumerate(lines.items()):
        members.sort(key=lambda p: p["settings"][key])
        ys = [p["run"]["goodput"] if metric == "goodput" else usd_per_million(p) if metric == "usd_per_mtok"
              else p["figures"][metric] for p in members]
        ax.plot([p["settings"][key] for p in members], ys, marker="o", color=color("", i), label=name)
        ys_all += ys
    ticks = sorted({p["settings"][key] for p in feasible(points)})
    if ticks[0] > 0:  # a log axis has no place for 0 (zero=0,1)
        ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.margins(x=DATA_MARGIN / 2)
    ax.set_xlabel(log_scale_label(setting_label(key)) if ax.get_xscale() == "log" else setting_label(key))
    if metric == "goodput":
        ax.set_ylabel("goodput over the run (useful time / wall time)")
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.margins(y=DATA_MARGIN)  # around the data: 99.5% against 99.9% is the answer, not a flat line
        ax.set_ylim(padded_range(ys_all, ax.get_ylim()))
        if ax.get_ylim()[0] > 0:  # ...which a reader must not take for a fall to 0 (a review)
            ax.set_ylabel("goodput over the run (useful time / wall time;\nthe axis does not start at 0)")
    elif metric == "usd_per_mtok":
        ax.set_ylabel(f"USD per million {unit}s")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${v:,.3g}"))
        ax.set_ylim(0, max(ys_all) * (1 + DATA_MARGIN) or 1.0)
    elif metric == "tokens_per_s":
        ax.set_ylabel(f"{unit}s/s, all GPUs")
        ax.yaxis.set_major_formatter(EngFormatter(unit=f"{UNIT_TICKS[unit]}/s"))
        ax.set_ylim(0, max(ys_all) * (1 + DATA_MARGIN) or 1.0)
    else:
        ax.set_ylabel("step time")
        ax.yaxis.set_major_formatter(EngFormatter(unit="s"))
        ax.set_ylim(0, max(ys_all) * (1 + DATA_MARGIN) or 1.0)  # room above the highest marker
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the axes: it covers no point
    _note_infeasible(fig, points)
    return finish(fig, path)


# A frontier whose x values span more than this ratio is drawn on a log axis: a nodes sweep
# runs from days to weeks, and a linear axis packs the fast points into one corner.
FRONTIER_LOG_X_RATIO = 10.0


def frontier_chart(points: list[dict], pareto: list[int], mode: str, path=None, unit: str = "token",
                   picked: tuple[int, str] | None = None):
    """Time to train (or tokens trained) vs cost. Every point is marked with its number (#id, as
    the whatif table numbers them), placed where it covers no other number or marker; the Pareto
    points are joined, and a key beside the chart gives their settings and plans. The axes span
    the data with a margin (from 0 only when the data comes near it), the legend sits in the key.
    `picked`: the chosen point's id and what it is called ("recommended", "best case"), ringed."""
    title = "Time to train vs cost" if mode == "tokens" else f"{unit.capitalize()}s trained vs cost"
    fig, (ax, key) = new_figure(title, ncols=2, width=13, height=6, width_ratios=[3.0, 1.25])
    by_id = {p["id"]: p for p in points}
    front = [by_id[i] for i in pareto]
    rest = [p for p in feasible(points) if p.get("run") and p["id"] not in set(pareto)]
    if rest:
        xy = np.array([frontier_xy(p, mode) for p in rest])
        ax.scatter(xy[:, 0], xy[:, 1], color="#bbbbbb", s=40, label="dominated", gid="dominated")
    xy = np.array([frontier_xy(p, mode) for p in front])
    ax.scatter(xy[:, 0], xy[:, 1], color="#ee6677", s=70, zorder=3, label="Pareto frontier", gid="pareto")
    ax.plot(xy[:, 0], xy[:, 1], color="#ee6677", linewidth=1.5, zorder=2, gid="pareto_line")
    if picked and picked[0] in by_id and by_id[picked[0]].get("run"):
        x, y = frontier_xy(by_id[picked[0]], mode)
        ax.scatter([x], [y], s=260, facecolors="none", edgecolors="black", linewidths=1.5, zorder=4,
                   label=f"{picked[1]} (#{picked[0]})", gid="picked")
    key.axis("off")
    key.set_title("Pareto points", fontsize=10, loc="left")
    entries = [f"#{p['id']}  {p['label']}\n{' ' * (len(str(p['id'])) + 3)}{p['plan_label']}" for p in front]
    key.text(0.0, 1.0, "\n\n".join(entries), transform=key.transAxes, va="top", ha="left", fontsize=8,
             family="monospace", wrap=True, gid="pareto_key")
    ax.set_xlabel("time to train (days, with failures)" if mode == "tokens" else f"{unit}s trained")
    shown = front + rest
    xs = [frontier_xy(p, mode)[0] for p in shown]
    positive = [x for x in xs if x > 0]
    if positive and max(positive) / min(positive) > FRONTIER_LOG_X_RATIO:
        ax.set_xscale("log")
        ax.set_xlabel(log_scale_label(ax.get_xlabel()))
        label_log_axis(ax.xaxis, EngFormatter(unit=UNIT_TICKS[unit]) if mode == "days"
                       else FuncFormatter(lambda v, _: f"{v:g}"))
    elif mode == "days":
        ax.xaxis.set_major_formatter(EngFormatter(unit=UNIT_TICKS[unit]))
    ax.margins(x=DATA_MARGIN, y=DATA_MARGIN)
    if ax.get_xscale() == "linear":
        padded = padded_range(xs, ax.get_xlim())
        ax.set_xlim(at_least_span(xs, padded))
        ax.set_xlabel(widened_label(ax.get_xlabel(), ax.get_xlim() != padded))
    costs = [frontier_xy(p, mode)[1] for p in shown]
    padded = padded_range(costs, ax.get_ylim())
    ax.set_ylim(at_least_span(costs, padded))
    ax.set_ylabel(widened_label("cost (US$)", ax.get_ylim() != padded))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${v:,.0f}"))
    handles, labels = ax.get_legend_handles_labels()
    key.legend(handles, labels, fontsize=9, loc="lower left")
    _number_points(fig, ax, shown, mode, set(pareto))
    _note_infeasible(fig, points)
    return finish(fig, path)


def padded_range(values: list[float], auto: tuple[float, float]) -> tuple[float, float]:
    """Axis limits around `values`: matplotlib's `auto` limits (the data plus a margin), taken
    down to 0 only when the data starts within its own span of 0 (then 0 is part of the picture)."""
    low, high = min(values), max(values)
    return (0.0, auto[1]) if low >= 0 and low <= high - low else auto


# The time and cost axes span at least this fraction of the data's middle either side of it: the
# simulated step time is off by a median 3-8% on published runs (README, the validation tables), so
# points closer than that are alike within its error and must look alike, not fill the chart (0.5%
# apart in cost once spanned it top to bottom).
MIN_HALF_SPAN = 0.05


def at_least_span(values: list[float], limits: tuple[float, float],
                  fraction: float = MIN_HALF_SPAN) -> tuple[float, float]:
    """`limits` widened to at least `fraction` of the middle of `values` either side of it (not
    below 0 for data that is not)."""
    middle = (min(values) + max(values)) / 2.0
    low, high = min(limits[0], middle - fraction * abs(middle)), max(limits[1], middle + fraction * abs(middle))
    return (max(low, 0.0) if min(values) >= 0 else low), high


def widened_label(text: str, widened: bool) -> str:
    """An axis label ("cost (US$)") that says, when `widened`, why its data sits in a band of it."""
    if not widened:
        return text
    note = f"the axis spans ±{MIN_HALF_SPAN:.0%} at least, the simulation's error"
    return f"{text[:-1]}; {note})" if text.endswith(")") else f"{text} ({note})"


def _number_points(fig, ax, shown: list[dict], mode: str, pareto: set) -> None:
    """Each point's #id beside it, where it overlaps no other number and no marker."""
    fig.draw_without_rendering()  # final axes size and limits: positions in points are known
    xy_pt = ax.transData.transform(np.array([frontier_xy(p, mode) for p in shown])) * 72.0 / fig.dpi
    sizes = [(9 if p["id"] in pareto else 7) for p in shown]
    texts = [f"#{p['id']}" for p in shown]
    offsets = label_offsets(xy_pt, [(0.62 * s * len(t), 1.2 * s) for s, t in zip(sizes, texts, strict=True)])
    for p, text, size, offset in zip(shown, texts, sizes, offsets, strict=True):
        front = p["id"] in pareto
        label = ax.annotate(text, frontier_xy(p, mode), xytext=offset, textcoords="offset points", fontsize=size,
                            ha="center", va="center", color="#aa3344" if front else "#888888",
                            fontweight="bold" if front else "normal", gid="pareto_id" if front else "dominated_id")
        label.set_in_layout(False)  # placed for this layout: it must not change it


MARKER_RADIUS_PT = 5.0  # the Pareto markers' radius (s=70 points^2 is a disc of ~4.7 pt radius)


def label_offsets(xy_pt: np.ndarray, sizes_pt: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Greedy placement of one label per point (positions and label sizes in points): for each,
    the first of a ring of offsets around its marker whose box overlaps no label placed before and
    no marker; the least-overlapping one when every offset does."""
    placed: list[tuple[float, float, float, float]] = []  # boxes: x0, y0, x1, y1
    markers = [(x - MARKER_RADIUS_PT, y - MARKER_RADIUS_PT, x + MARKER_RADIUS_PT, y + MARKER_RADIUS_PT)
               for x, y in xy_pt]
    out = []
    for (x, y), (w, h) in zip(xy_pt, sizes_pt, strict=True):
        dx, dy = w / 2 + MARKER_RADIUS_PT + 1, h / 2 + MARKER_RADIUS_PT - 1
        candidates = [(k * cx, k * cy) for k in (1, 2, 3)
                      for cx, cy in ((dx, dy), (dx, -dy), (-dx, dy), (-dx, -dy), (dx, 0), (-dx, 0), (0, dy), (0, -dy))]

        def overlap(offset, x=x, y=y, w=w, h=h):
            box = (x + offset[0] - w / 2, y + offset[1] - h / 2, x + offset[0] + w / 2, y + offset[1] + h / 2)
            return sum(_area(box, other) for other in placed + markers)

        best = next((c for c in candidates if overlap(c) == 0), None) or min(candidates, key=overlap)
        out.append(best)
        placed.append((x + best[0] - w / 2, y + best[1] - h / 2, x + best[0] + w / 2, y + best[1] + h / 2))
    return out


def _area(a: tuple, b: tuple) -> float:
    """Overlapping area of two boxes (x0, y0, x1, y1)."""
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def memory_chart(points: list[dict], path=None):
    """Memory per GPU (fullest GPU) stacked by part, against each GPU's capacity."""
    fig, ax = new_figure("Memory per GPU vs capacity", width=max(8, 1.2 * len(points) + 3), height=5.5)
    shown = [p for p in points if (p.get("figures") or {}).get("memory_breakdown_gib")]
    x = np.arange(len(shown))
    bottom = np.zeros(len(shown))
    for part in MEMORY_PARTS:
        values = np.array([p["figures"]["memory_breakdown_gib"].get(part, 0.0) for p in shown])
        bars = ax.bar(x, values, 0.7, bottom=bottom, color=color(part), label=pretty(part), gid=part)
        for bar, p in zip(bars, shown, strict=True):
            if not p["feasible"]:
                bar.set_hatch("//")
                bar.set_edgecolor("#333333")
        bottom += values
    caps = [p["memory_capacity_gib"] for p in shown]
    ax.plot(x, caps, linestyle="none", marker="_", markersize=46, markeredgewidth=2.5,
            color="black", label="GPU capacity", gid="capacity")
    labels = [tick_label(p["label"]) + ("" if p["feasible"] else "\n(does not fit)") for p in shown]
    ax.set_xticks(x, labels, fontsize=8)
    for tick, p in zip(ax.get_xticklabels(), shown, strict=True):
        tick.set_color("black" if p["feasible"] else "#cc0000")
    ax.set_ylabel("memory on the fullest GPU (GiB)")
    ax.set_ylim(0, max([*bottom, *caps, 1.0]) * 1.08)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), markerscale=0.4)
    # a point with no plan at all (none fits) has no bar to hatch: name it, as the versus chart does
    _note_infeasible(fig, [p for p in points if p not in shown])
    return finish(fig, path)


def breakdown_chart(points: list[dict], path=None):
    """Where the step time goes: stacked seconds per kind for each feasible point."""
    ok = feasible(points)
    fig, ax = new_figure("Step-time breakdown", width=max(8, 1.2 * len(ok) + 3), height=5.5)
    kinds = breakdown_kinds(ok)
    x = np.arange(len(ok))
    bottom = np.zeros(len(ok))
    for i, kind in enumerate(kinds):
        values = np.array([p["figures"]["breakdown"].get(kind, 0.0) for p in ok])
        ax.bar(x, values, 0.7, bottom=bottom, color=color(kind, i), label=pretty(kind), gid=kind)
        bottom += values
    steps = [p["figures"]["step_time_s"] for p in ok]
    ax.plot(x, steps, linestyle="none", marker="_", markersize=46, markeredgewidth=2.5,
            color="black", label="simulated step time", gid="step_time")
    ax.set_xticks(x, [tick_label(p["label"]) for p in ok], fontsize=8)
    ax.set_ylabel("seconds per training step")
    ax.set_ylim(0, max([*bottom, *steps, 1e-9]) * 1.08)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), markerscale=0.4)
    _note_infeasible(fig, points)
    return finish(fig, path)


def breakdown_kinds(points: list[dict]) -> list[str]:
    """Breakdown kinds present (non-zero somewhere), the usual ones first."""
    present = {k for p in points for k, v in p["figures"].get("breakdown", {}).items() if v}
    return [k for k in BREAKDOWN_ORDER if k in present] + sorted(present - set(BREAKDOWN_ORDER))


def _note_infeasible(fig, points: list[dict]) -> None:
    bad = [p for p in points if not p.get("feasible")]
    if bad:
        # constrained layout places the axes, not a figure text: keep a strip at the bottom for it,
        # below the x-axis label it overprinted
        fig.get_layout_engine().set(rect=(0.0, 0.04, 1.0, 0.96))
        fig.text(0.01, 0.005, f"{len(bad)} infeasible point(s) not shown: "
                 + "; ".join(p["label"] for p in bad[:4]) + ("..." if len(bad) > 4 else ""),
                 fontsize=8, color="#cc0000")
