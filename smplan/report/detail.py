"""Charts of one chosen point: pipeline timeline, goodput, sensitivity (tornado).

Each takes the matching `details` entry of a points record (see `smplan.report.points`).
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.patches import Patch
from matplotlib.ticker import EngFormatter, FuncFormatter, PercentFormatter

from .style import color, finish, label_log_axis, log_scale_label, new_figure

GANTT_ORDER = ("forward", "backward", "recompute", "send", "ep_comm", "cp_comm", "dp_comm", "optimizer")
# Within a stage's row (offset from its centre, height): compute on top, then the pipeline, expert
# and context-parallel transfers, then the DP group's collectives, each its own thin lane, so the
# hundreds of per-layer ZeRO-3 / FSDP collectives run under the compute instead of over it.
GANTT_LANES = {"compute": (-0.15, 0.5), "send": (0.19, 0.14), "dp": (0.35, 0.14)}
GANTT_LANE_OF = {"send": "send", "ep_comm": "send", "cp_comm": "send", "dp_comm": "dp"}
# Each task kind (smplan.whatif.details.EVENT_KINDS) drawn in the colour of the simulator's event it
# comes from (simulator/gantt.py, what `smplan simulate --gantt` draws), so a colour means one thing
# in both charts. "send" and "dp_comm" merge events: the colour of the main one, a label that says so.
GANTT_EVENT_OF = {"forward": "F", "backward": "B", "recompute": "R", "send": "send-act", "dp_comm": "dp-reduce",
                  "optimizer": "optimizer", "ep_comm": "ep-a2a", "cp_comm": "cp-comm"}
GANTT_MERGED_LABELS = {"send": "send activation or gradient", "dp_comm": "DP comm (gradients, ZeRO/FSDP layers)"}
SENSITIVITY_LABELS = {
    "gpu.peak_tflops": "GPU peak TFLOP/s",
    "gpu.memory_bandwidth_gbps": "HBM bandwidth (GB/s)",
    "intra_node.bandwidth_gbps": "intra-node bandwidth (GB/s)",
    "intra_node.latency_us": "intra-node latency (us)",
    "inter_node.bandwidth_gbps": "inter-node bandwidth (GB/s)",
    "inter_node.latency_us": "inter-node latency (us)",
    "efficiency.host_overhead_us_per_layer": "host overhead per layer (us)",
}


def gantt_chart(gantt: dict, title_suffix: str = "", path=None):
    """One row per pipeline stage; a bar per task (forward, backward, send...), coloured by kind."""
    tasks = gantt["tasks"]
    stages = gantt["stages"]
    fig, ax = new_figure(f"Pipeline timeline of one step{title_suffix}", width=13, height=max(3.0, 0.45 * stages + 2))
    kinds = [k for k in GANTT_ORDER if any(t["kind"] == k for t in tasks)]
    kinds += sorted({t["kind"] for t in tasks} - set(kinds))
    for i, kind in enumerate(kinds):
        mine = [t for t in tasks if t["kind"] == kind]
        left = np.array([t["start_s"] for t in mine])
        width = np.array([t["end_s"] - t["start_s"] for t in mine])
        rows = np.array([t["stage"] for t in mine])
        offset, height = GANTT_LANES[GANTT_LANE_OF.get(kind, "compute")]
        colour, label = gantt_style(kind, i)
        # a pass's wait for its collectives (simulate's zero-wait, ep-wait, cp-wait) is hatched
        # over the compute lane in the colour of what it waits for, as `simulate --gantt` draws it
        style = ({"color": "white", "edgecolor": colour, "hatch": "////"} if kind.endswith("-wait")
                 else {"color": colour, "edgecolor": "white"})
        ax.barh(rows + offset, width, height=height, left=left, linewidth=0.4, label=label, gid=kind, **style)
    numbered = len(tasks) <= 400
    if numbered:
        span = gantt["step_time_s"] or max(t["end_s"] for t in tasks)
        for t in tasks:
            if t.get("microbatch") is not None and t["kind"] in ("forward", "backward") \
                    and (t["end_s"] - t["start_s"]) > span / 90:
                ax.text((t["start_s"] + t["end_s"]) / 2, t["stage"] + GANTT_LANES["compute"][0],
                        str(t["microbatch"]), ha="center", va="center", fontsize=6, color="white")
    ax.axvline(gantt["step_time_s"], color="black", linestyle="--", linewidth=1, gid="step_end")
    ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(EngFormatter(unit="s"))
    ax.set_xlabel("time within the step" + ("; numbers are micro-batches" if numbered else ""))
    ax.set_ylabel("pipeline stage (GPU rank)")
    ax.legend(fontsize=8, ncols=len(kinds), loc="lower right", bbox_to_anchor=(1.0, 1.0))
    return finish(fig, path)


def gantt_style(kind: str, index: int = 0) -> tuple[str, str]:
    """(colour, legend label) of a task kind: the simulator's for its event, else the report's own."""
    # imported here: `smplan report` of a run draws no Gantt and needs no simulator
    from smplan.simulator import GANTT_COLOURS, GANTT_LABELS

    event = GANTT_EVENT_OF.get(kind, kind)  # a simulator event whatif passes on as it is named: its own
    if event not in GANTT_COLOURS:  # neither: a colour of the report's own
        return color(kind, index), kind.replace("_", " ")
    return GANTT_COLOURS[event], GANTT_MERGED_LABELS.get(kind, GANTT_LABELS.get(event, kind))


def goodput_chart(goodput: dict, path=None, title_suffix: str = ""):
    """Goodput vs checkpoint interval (with Young/Daly) and vs GPU MTBF; bands are ±1 std over seeds.
    A run that does not finish (goodput null) is an x on the axis: its goodput is as good as 0."""
    seeds = goodput.get("seeds")  # Monte Carlo: with few seeds a point moves by its band's width
    runs = f" ({seeds} simulated runs per point)" if seeds else ""
    fig, (ax_i, ax_m) = new_figure(f"Goodput over the run{runs}{title_suffix}", ncols=2, width=12)
    for ax, series, xkey in (
        (ax_i, goodput["vs_interval"], "interval_min"),
        (ax_m, goodput["vs_mtbf"], "gpu_mtbf_hours"),
    ):
        x = np.array(series[xkey], dtype=float)
        y = np.array(series["goodput"], dtype=float)
        s = np.array(series.get("goodput_std") or [0.0] * len(y), dtype=float)
        # goodput is a fraction: the band stops at 0 and 1 (a mean near 1 with spread would cross it)
        ax.fill_between(x, np.clip(y - s, 0.0, 1.0), np.clip(y + s, 0.0, 1.0), color="#4477aa", alpha=0.2,
                        linewidth=0, label="±1 std over seeds (clipped to 0-100%)")
        ax.plot(x, y, marker="o", color="#4477aa", label="simulated goodput", gid="goodput")
        lost = np.isnan(y)
        if lost.any():
            ax.plot(x[lost], np.zeros(int(lost.sum())), linestyle="none", marker="x", markersize=9, color="#cc0000",
                    clip_on=False, label="the run does not finish", gid="does_not_finish")
        ax.set_xscale("log")
        label_log_axis(ax.xaxis, FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylabel("goodput (useful time / wall time)")
    ax_i.axvline(goodput["young_daly_min"], color="#ee6677", linestyle="--", gid="young_daly",
                 label=f"Young/Daly optimum ({goodput['young_daly_min']:.3g} min)")
    # the interval the point's run used (the sweep's best, or one given), where it is not Daly's
    chosen = goodput["chosen_interval_min"]
    if not math.isclose(chosen, goodput["young_daly_min"], rel_tol=0.01):
        ax_i.axvline(chosen, color="#228833", linestyle=":", gid="chosen_interval",
                     label=f"interval used ({chosen:.3g} min)")
    if goodput.get("gpu_mtbf_hours"):  # the profile's MTBF: the point's own run (older points.json lack it)
        ax_m.axvline(goodput["gpu_mtbf_hours"], color="#228833", linestyle=":", gid="profile_mtbf",
                     label=f"the profile's MTBF ({goodput['gpu_mtbf_hours']:,.0f} h)")
    ax_i.set_xlabel(log_scale_label("checkpoint interval (minutes)"))
    ax_i.set_title("vs checkpoint interval")
    ax_m.set_xlabel(log_scale_label("GPU mean time between failures (hours)"))
    ax_m.set_title(f"vs MTBF (checkpoint every {goodput['chosen_interval_min']:.3g} min)")
    for ax in (ax_i, ax_m):
        ax.legend(fontsize=8, loc="lower right")
    return finish(fig, path)


def sensitivity_chart(sensitivity: dict, path=None):
    """Tornado: change of step time when each hardware figure moves by ±delta."""
    base = sensitivity["base_step_time_s"]
    delta = sensitivity["delta"]
    items = sorted(sensitivity["items"], key=lambda it: spread(it, base))
    fig, ax = new_figure(f"Sensitivity of step time to ±{delta:.0%} on each hardware figure",
                         width=11, height=max(3.5, 0.5 * len(items) + 2))
    y = np.arange(len(items))
    low = [percent_change(it["low_step_time_s"], base) for it in items]
    high = [percent_change(it["high_step_time_s"], base) for it in items]
    # red where the step gets slower (the usual reading of red), blue where faster: by the change's
    # sign, not the figure's direction (a latency's -20% speeds the step, a bandwidth's slows it);
    # each bar's end says which way its figure moved
    def colors(changes):
        return [SLOWER if c > 0 else FASTER for c in changes]

    for changes, sign, gid in ((low, "−", "low"), (high, "+", "high")):
        bars = ax.barh(y, changes, 0.6, color=colors(changes), gid=gid)
        ax.bar_label(bars, labels=[f"{sign}{delta:.0%}" for _ in changes], padding=3, fontsize=8)
    ax.axvline(0, color="black", linewidth=1)
    ax.set_yticks(y, [sensitivity_label(it["key"]) for it in items])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:+.0f}%"))
    ax.set_xlabel(f"change in step time (%) from {base:.3g} s; above 0 slower")
    ax.legend(handles=[Patch(color=SLOWER, label="step slower"), Patch(color=FASTER, label="step faster")],
              fontsize=9, loc="lower right", title=f"each bar: its figure ±{delta:.0%}", title_fontsize=8)
    ax.margins(x=0.08)  # room for the bars' end labels
    return finish(fig, path)


SLOWER, FASTER = "#ee6677", "#4477aa"


def percent_change(value: float, base: float) -> float:
    return (value - base) / base * 100.0 if base else 0.0


def spread(item: dict, base: float) -> float:
    return abs(percent_change(item["high_step_time_s"], base)) + abs(percent_change(item["low_step_time_s"], base))


def sensitivity_label(key: str) -> str:
    for prefix, text in SENSITIVITY_LABELS.items():
        if key.startswith(prefix):
            return text + (f" [{key.rsplit('.', 1)[1]}]" if prefix == "gpu.peak_tflops" else "")
    return key
