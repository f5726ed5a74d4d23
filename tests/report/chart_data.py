"""Read plotted series back from matplotlib artists (what the charts really drew)."""

from __future__ import annotations

from matplotlib.container import BarContainer


def lines(ax, with_gid: bool = False) -> dict[str, tuple[list, list]]:
    """Labelled data lines of an axes: label -> (x, y); lines with a gid are reference lines."""
    out = {}
    for line in ax.get_lines():
        if line.get_gid() is not None and not with_gid:
            continue
        out[line.get_label()] = (list(map(float, line.get_xdata())), list(map(float, line.get_ydata())))
    return out


def line_by_gid(ax, gid: str):
    return next(line for line in ax.get_lines() if line.get_gid() == gid)


def bars(ax) -> dict[str, BarContainer]:
    """Bar containers by the gid the chart gave their rectangles (or their label)."""
    out = {}
    for c in ax.containers:
        if isinstance(c, BarContainer):
            out[(c.patches[0].get_gid() if c.patches else None) or c.get_label()] = c
    return out


def heights(container) -> list[float]:
    return [float(r.get_height()) for r in container]


def widths(container) -> list[float]:
    return [float(r.get_width()) for r in container]


def lefts(container) -> list[float]:
    return [float(r.get_x()) for r in container]


def collection_by_gid(ax, gid: str):
    return next(c for c in ax.collections if c.get_gid() == gid)
