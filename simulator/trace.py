"""Chrome / Perfetto trace-event JSON of one simulated step (opens in ui.perfetto.dev).

Format: the Trace Event Format (Google, "Trace Event Format" doc): complete events
("ph": "X") with microsecond `ts` and `dur`, one process per pipeline rank and one thread
per track (step.TRACKS: the passes, the GPU's waits inside them, and one per kind of transfer:
slices on one thread must nest, and a ZeRO-3 backward's gathers and reduce-scatters overlap),
named by metadata events ("ph": "M"), as torch.profiler writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

from .step import TRACKS, SimEvent, track_of

TRACK_NAMES = {"compute": "compute stream", "wait": "compute stream waiting for its collectives",
               "p2p": "pipeline p2p sends", "ep/cp": "expert / context-parallel comm",
               "dp gather": "data-parallel all-gathers", "dp reduce": "data-parallel reductions"}
_LABELS = {
    "F": "forward",
    "B": "backward",
    "R": "recompute",
    "send-act": "send activation",
    "send-grad": "send gradient",
    "dp-reduce": "dp gradient reduce",
    "dp-gather": "zero param all-gather",
    "zero-gather": "zero/fsdp layer all-gather",
    "zero-reduce": "zero/fsdp layer reduce-scatter",
    "optimizer": "optimizer",
    "ep-a2a": "expert all-to-alls",
    "cp-comm": "context-parallel K/V comm",
    "zero-wait": "waiting for zero/fsdp collectives",
    "ep-wait": "waiting for expert all-to-alls",
    "cp-wait": "waiting for context-parallel comm",
}


def trace_events(events: list[SimEvent], nodes: list[int] | None = None) -> list[dict]:
    """Trace-event dicts for `events` (every event has name, ph, ts, dur, pid, tid)."""
    out: list[dict] = []
    devices = sorted({e.device for e in events})
    for d in devices:
        where = f" (node {nodes[d]})" if nodes else ""
        out.append(_meta("process_name", d, 0, {"name": f"pipeline stage {d}{where}"}))
        out.append(_meta("process_sort_index", d, 0, {"sort_index": d}))
        for tid, name in enumerate(TRACKS):
            out.append(_meta("thread_name", d, tid, {"name": TRACK_NAMES[name]}))
    for e in events:
        label = _LABELS.get(e.name, e.name)
        name = f"{label} mb{e.mb}" if e.mb >= 0 else label
        args = {"chunk": e.chunk} if e.chunk >= 0 else {}
        if e.mb >= 0:
            args["microbatch"] = e.mb
        out.append(
            {
                "name": name,
                "cat": e.name,
                "ph": "X",
                "ts": e.start * 1e6,
                "dur": max(0.0, (e.end - e.start) * 1e6),
                "pid": e.device,
                "tid": TRACKS.index(track_of(e.name)),
                "args": args,
            }
        )
    return out


def _meta(kind: str, pid: int, tid: int, args: dict) -> dict:
    return {"name": kind, "ph": "M", "ts": 0, "dur": 0, "pid": pid, "tid": tid, "args": args}


def write_trace(
    path: str | Path,
    events: list[SimEvent],
    nodes: list[int] | None = None,
    metadata: dict | None = None,
) -> Path:
    path = Path(path)
    doc = {
        "traceEvents": trace_events(events, nodes),
        "displayTimeUnit": "ms",
        "otherData": metadata or {},
    }
    path.write_text(json.dumps(doc))
    return path
