"""Figures as every output prints them (tables, --explain, the what-if page): one rounding each."""

from __future__ import annotations

import math


def memory_gib_text(gib: float) -> str:
    """GiB to 0.1, rounded down: a plan that fits never reads as its GPU's capacity (79.97 of
    80 GiB printed 80.0/80)."""
    return f"{math.floor(gib * 10) / 10:.1f}"


def memory_need_text(gib: float) -> str:
    """GiB to 0.01, rounded up, for a plan over its GPU's capacity: the tables' 0.1 rounded down
    read 79.97 GiB as 79.9 and 80.0 as the need, and a need of 79.66 on 79.65 GiB would read as
    fitting at 0.1."""
    return f"{math.ceil(round(gib * 100, 6)) / 100:.2f}"  # round first: 1.1 * 100 is 110.00000000000001


def days_text(days: float) -> str:
    """Days with about four significant digits: wall-clock days of long runs differ by tenths
    (113.2 and 113.9 printed 113 and 113 with three)."""
    if days >= 100:
        return f"{days:,.1f}"
    return f"{days:.2f}" if days >= 1 else f"{days:.3g}"


def mfu_percent_text(mfu: float) -> str:
    """Model FLOPs utilisation to 0.1%; a tiny model's share under 0.05% reads "<0.1%", not "0.0%",
    which would say the GPU did nothing."""
    return "<0.1%" if 0 < mfu < 0.0005 else f"{mfu:.1%}"
