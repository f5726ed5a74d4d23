"""Gantt chart (PNG, matplotlib Agg) of one simulated step: a row per pipeline stage."""

from __future__ import annotations

from pathlib import Path

from .step import TRACKS, SimEvent, track_of

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
    # the waits are hatched in the colour of what they wait for
    "zero-wait": "#9d755d",
    "ep-wait": "#eeca3b",
    "cp-wait": "#ff9da6",
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
    "zero-wait": "waiting for ZeRO/FSDP collectives",
    "ep-wait": "waiting for expert all-to-alls",
    "cp-wait": "waiting for context-parallel comm",
}
# Within a stage's row of height 1: the passes with their waits drawn over them, then a thin lane
# per kind of transfer the step has (step.TRACKS), so that concurrent ones never hide each other.
_PASS_HEIGHT = 0.46
_LANE_PITCH, _LANE_HEIGHT = 0.115, 0.095
# A transfer narrower than this is drawn this many pixels wide (a 0.6 ms pipeline send in a 12 s
# step is a twentieth of a pixel); the trace keeps the exact times, passes and waits keep theirs.
MIN_TRANSFER_PX = 2.0
_WAIT_HATCH = "////"


def write_gantt(
    path: str | Path, events: list[SimEvent], step_time_s: float, title: str = ""
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    path = Path(path)
    devices = sorted({e.device for e in events}) or [0]
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.8 * len(devices)), dpi=110)
    scale, unit = (1e3, "ms") if step_time_s < 10 else (1.0, "s")
    ax.set_xlim(0, step_time_s * scale * 1.01)
    by_kind = gantt_bars(events, step_time_s * 1.01 / ax.bbox.width)
    # passes first, their waits over them, transfers in their own lanes
    for kind in sorted(by_kind, key=lambda k: TRACKS.index(track_of(k))):
        waits = track_of(kind) == "wait"
        style = ({"facecolors": "white", "edgecolors": COLOURS[kind], "hatch": _WAIT_HATCH} if waits
                 else {"facecolors": COLOURS.get(kind, "#888888")})
        for (y, height), spans in _group(by_kind[kind]):
            ax.broken_barh([(x * scale, w * scale) for x, w in spans], (y, height), linewidth=0, **style)
    ax.set_yticks([d + 0.5 for d in devices], [f"stage {d}" for d in devices])
    ax.set_ylim(len(devices) + 0.1, -0.1)
    ax.set_xlabel(f"time ({unit}); transfers drawn at least {MIN_TRANSFER_PX:g} px wide")
    ax.set_title(title or f"one training step: {step_time_s * scale:.3g} {unit}")
    present = [k for k in COLOURS if k in by_kind]
    handles = [Patch(facecolor="white", edgecolor=COLOURS[k], hatch=_WAIT_HATCH, label=LABELS[k])
               if track_of(k) == "wait" else Patch(color=COLOURS[k], label=LABELS[k]) for k in present]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.6 / (1.0 + 0.8 * len(devices))),
        ncol=min(len(present), 4),
        frameon=False,
    )
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def gantt_bars(events: list[SimEvent], seconds_per_px: float) -> dict[str, list[tuple[float, float, float, float]]]:
    """Per event name, its bars as (y, height, start_s, width_s): stage d's row spans [d, d + 1);
    a transfer is at least MIN_TRANSFER_PX pixels of `seconds_per_px` wide."""
    boxes = _track_boxes({track_of(e.name) for e in events})
    bars: dict[str, list[tuple[float, float, float, float]]] = {}
    for e in events:
        off, height = boxes[track_of(e.name)]
        width = e.end - e.start
        if track_of(e.name) not in ("compute", "wait"):
            width = max(width, MIN_TRANSFER_PX * seconds_per_px)
        bars.setdefault(e.name, []).append((e.device + off, height, e.start, width))
    return bars


def _track_boxes(present: set[str]) -> dict[str, tuple[float, float]]:
    """(offset, height) in a stage's row of each track in `present`; transfer lanes only for those."""
    boxes = {"compute": (0.0, _PASS_HEIGHT), "wait": (0.0, _PASS_HEIGHT)}
    lanes = [t for t in TRACKS if t in present and t not in boxes]
    boxes.update({t: (_PASS_HEIGHT + 0.04 + i * _LANE_PITCH, _LANE_HEIGHT) for i, t in enumerate(lanes)})
    return boxes


def _group(rows: list[tuple]):
    groups: dict[tuple, list[tuple[float, float]]] = {}
    for y, height, start, width in rows:
        groups.setdefault((y, height), []).append((start, width))
    return groups.items()
