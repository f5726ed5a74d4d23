"""Gantt chart (PNG, matplotlib Agg) of one simulated step: a row per pipeline stage."""

from __future__ import annotations

from pathlib import Path

from .step import SimEvent

COLOURS = {
    "F": "#4c78a8",
    "B": "#f58518",
    "R": "#e45756",
    "send-act": "#72b7b2",
    "send-grad": "#54a24b",
    "dp-reduce": "#b279a2",
    "dp-gather": "#9d755d",
    "zero-gather": "#9d755d",
    "zero-reduce": "#b279a2",
    "optimizer": "#bab0ac",
    "ep-a2a": "#eeca3b",
    "cp-comm": "#ff9da6",
}
LABELS = {
    "F": "forward",
    "B": "backward",
    "R": "recompute",
    "send-act": "send activation",
    "send-grad": "send gradient",
    "dp-reduce": "DP gradient comm",
    "dp-gather": "ZeRO all-gather",
    "zero-gather": "ZeRO/FSDP per-layer all-gather",
    "zero-reduce": "ZeRO/FSDP per-layer reduce-scatter",
    "optimizer": "optimizer",
    "ep-a2a": "expert all-to-alls",
    "cp-comm": "context-parallel K/V comm",
}
# Within a stage's row: compute on top, sends and DP as thinner bars below.
_LANE_OFFSET = {"compute": (0.0, 0.5), "send": (0.52, 0.2), "dp": (0.74, 0.2)}


def write_gantt(
    path: str | Path, events: list[SimEvent], step_time_s: float, title: str = ""
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    path = Path(path)
    devices = sorted({e.device for e in events}) or [0]
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.55 * len(devices)), dpi=110)
    scale, unit = (1e3, "ms") if step_time_s < 10 else (1.0, "s")
    by_kind: dict[str, list[tuple]] = {}
    for e in events:
        off, height = _LANE_OFFSET.get(e.lane, (0.0, 0.5))
        by_kind.setdefault(e.name, []).append(
            (e.device, off, height, e.start * scale, (e.end - e.start) * scale)
        )
    for kind, rows in by_kind.items():
        for dev_offset_h in _group(rows):
            (d, off, height), spans = dev_offset_h
            ax.broken_barh(
                spans, (d + off, height), facecolors=COLOURS.get(kind, "#888888"), linewidth=0
            )
    ax.set_yticks([d + 0.5 for d in devices], [f"stage {d}" for d in devices])
    ax.set_ylim(len(devices) + 0.1, -0.1)
    ax.set_xlim(0, step_time_s * scale * 1.01)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title or f"one training step: {step_time_s * scale:.3g} {unit}")
    present = [k for k in COLOURS if k in by_kind]
    ax.legend(
        handles=[Patch(color=COLOURS[k], label=LABELS[k]) for k in present],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.6 / (1.0 + 0.55 * len(devices))),
        ncol=min(len(present), 8),
        frameon=False,
    )
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def _group(rows: list[tuple]):
    groups: dict[tuple, list[tuple[float, float]]] = {}
    for d, off, height, start, width in rows:
        groups.setdefault((d, off, height), []).append((start, width))
    return groups.items()
