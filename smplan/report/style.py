"""Shared look of the report charts: one palette, titled figures, saving with Agg.

Figures are built with `matplotlib.figure.Figure` (never pyplot), so they render with the
Agg canvas in any process, need no display, and hold no global state between charts.
"""

from __future__ import annotations

import copy
import logging
import textwrap
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import Formatter, LogFormatterSciNotation

# Log-scale tick labels are mathtext; where its STIX fallback faces are missing, matplotlib's font
# manager warns once per glyph lookup ("findfont: Font family ['STIXGeneral'] not found", 21 lines
# for a run report) and draws them in DejaVu Sans, as it does anyway: no message for the user.
logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)

# Colour per quantity, the same in every chart (tab10-like, colour-blind friendly order). What the
# simulator's Gantt chart also draws takes its colour there (simulator/gantt.py COLOURS: recompute R,
# DP comm dp-reduce, PP sends send-act, expert ep-a2a, context cp-comm, optimizer), so a colour means
# one thing in the breakdown, the what-if Gantt and `smplan simulate --gantt`; the rest keep clear of those.
COLORS = {
    "compute": "#4477aa",
    "host_wait": "#999933",
    "recompute": "#e45756",
    "tp_comm": "#332288",
    "dp_comm": "#b279a2",
    "pp_p2p": "#72b7b2",
    "dp_comm_exposed": "#b279a2",
    "ep_all_to_all": "#eeca3b",
    "cp_comm_exposed": "#ff9da6",
    "bubble": "#dddddd",  # idle: lighter than the optimizer's grey
    "optimizer": "#bab0ac",
    "weights": "#4477aa",
    "gradients": "#66ccee",
    "activations": "#ee6677",
    "buffers": "#ccbb44",
    "reserve": "#bbbbbb",
}
CYCLE = ["#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb", "#000000"]
PRETTY = {
    "compute": "compute",
    "host_wait": "waiting for the host (launch-bound)",
    "recompute": "recompute",
    "tp_comm": "TP comm",
    "dp_comm": "DP comm",
    "pp_p2p": "PP p2p (sends, activations in flight)",
    "dp_comm_exposed": "DP comm (exposed)",
    "ep_all_to_all": "expert all-to-all",
    "cp_comm_exposed": "CP comm (exposed)",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer",
    "weights": "weights",
    "gradients": "gradients",
    "activations": "activations",
    "buffers": "buffers",
    "reserve": "reserve",
}


def color(name: str, index: int = 0) -> str:
    return COLORS.get(name, CYCLE[index % len(CYCLE)])


def pretty(name: str) -> str:
    return PRETTY.get(name, name.replace("_", " "))


TITLE_FONT_PT = 13
# Average width of a bold DejaVu Sans character in ems: 0.61 measured (matplotlib's extent of a gantt
# title of labels and plan keys), rounded up so that a wrapped line never reaches the figure's edges.
BOLD_CHAR_EM = 0.7


def new_figure(title: str, ncols: int = 1, width: float = 9.0, height: float = 5.0,
               width_ratios: list[float] | None = None):
    """A titled Figure and its axes (a list when ncols > 1)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=True, width_ratios=width_ratios)
    fig.suptitle(wrap_title(title, width, TITLE_FONT_PT), fontsize=TITLE_FONT_PT, fontweight="bold")
    return fig, (list(axes) if ncols > 1 else axes)


def wrap_title(title: str, width_in: float, font_pt: float) -> str:
    """`title` broken into lines that fit a figure `width_in` inches wide (a long point label or
    plan would otherwise run off both edges of a centred title)."""
    chars = max(20, int(width_in * 72 / (BOLD_CHAR_EM * font_pt)))
    return "\n".join(textwrap.wrap(title, chars, break_on_hyphens=False)) or title


def finish(fig: Figure, path: str | Path | None) -> Figure:
    for ax in fig.axes:
        ax.grid(True, alpha=0.3)
        ax.set_axisbelow(True)
    if path is not None:
        save_figure(fig, path)
    return fig


def save_figure(fig: Figure, path: str | Path) -> None:
    """Write `fig`; an SVG keeps its text as text (searchable, selectable; matplotlib draws it as
    paths by default, `svg.fonttype`), which a viewer renders in a font of its own of the same family."""
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(path, dpi=110)


# A setting longer than this ("inter_node.bandwidth_gbps=3.125") breaks after its "=" and dots,
# so neighbouring tick labels of a 1.2-inch bar do not run into each other.
TICK_LINE_CHARS = 14


def tick_label(label: str) -> str:
    """Point labels as tick labels: one setting per line, a long one broken after "=" and "."."""
    lines = []
    for setting in label.split(" "):
        if len(setting) <= TICK_LINE_CHARS:
            lines.append(setting)
            continue
        key, eq, value = setting.partition("=")
        words = key.replace(".", ".\n").split("\n")
        lines += [*words[:-1], words[-1] + eq] + ([value] if value else [])
    return "\n".join(lines)


def log_scale_label(text: str) -> str:
    """An axis label that says its axis is logarithmic: "time to train (days; log scale)"."""
    return f"{text[:-1]}; log scale)" if text.endswith(")") else f"{text} (log scale)"


def label_log_axis(axis, formatter: Formatter) -> None:
    """Label a log `axis`'s major and minor ticks alike with `formatter`: matplotlib labels the minor
    ticks it shows in its own style ("6x10^4" beside "100 ktok/s", "3x10^0" beside "10" days)."""
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(MinorLikeMajor(copy.copy(formatter), axis.get_transform().base))


class MinorLikeMajor(Formatter):
    """The minor ticks matplotlib's log scale labels (all within a decade, 2-3-4-6 within a few,
    none past that: its default minor formatter decides), in `formatter`'s style."""

    def __init__(self, formatter: Formatter, base: float = 10.0):
        self.formatter = formatter
        self.picker = LogFormatterSciNotation(base, labelOnlyBase=False)  # as matplotlib's LogScale sets it

    def set_axis(self, axis) -> None:
        super().set_axis(axis)
        self.formatter.set_axis(axis)
        self.picker.set_axis(axis)

    def set_locs(self, locs) -> None:
        super().set_locs(locs)
        self.formatter.set_locs(locs)
        self.picker.set_locs(locs)

    def __call__(self, x, pos=None) -> str:
        return self.formatter(x, pos) if self.picker(x, pos) else ""
