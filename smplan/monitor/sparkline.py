"""One-line charts for a terminal: ▁▂▃▄▅▆▇█."""

from __future__ import annotations

import math
from collections.abc import Sequence

BARS = "▁▂▃▄▅▆▇█"


def _buckets(values: Sequence[float], width: int) -> list[float]:
    """At most `width` points: the mean of each equal run of values (order kept)."""
    n = len(values)
    if n <= width:
        return list(values)
    out = []
    for i in range(width):
        part = [v for v in values[i * n // width:(i + 1) * n // width] if math.isfinite(v)]
        out.append(sum(part) / len(part) if part else math.nan)
    return out


def sparkline(values: Sequence[float | None], width: int = 40) -> str:
    """`values` scaled between their min and max, one character each (at most `width`,
    averaging neighbours when there are more). Missing or non-finite values are blanks; a
    constant series is a flat middle line."""
    clean = [math.nan if v is None else float(v) for v in values]
    points = _buckets(clean, max(1, width))
    finite = [v for v in points if math.isfinite(v)]
    if not finite:
        return " " * len(points)
    low, high = min(finite), max(finite)
    top = len(BARS) - 1
    chars = []
    for v in points:
        if not math.isfinite(v):
            chars.append(" ")
        elif high == low:
            chars.append(BARS[top // 2])
        else:
            chars.append(BARS[min(top, int((v - low) / (high - low) * top + 0.5))])
    return "".join(chars)
