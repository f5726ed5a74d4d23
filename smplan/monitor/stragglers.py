"""Which rank is slow: pure functions over per-rank step records.

In synchronous training every rank's wall-clock step time is the same: the fast ranks wait
for the slow one in a collective. What differs is *where* they wait. Each rank records how
long it waited in the step-end all-reduce (`sync_wait_s`), so a rank's own step time is
the step time less that wait: the rank the others waited for has the longest. A delay
that lands before an earlier collective (a DDP bucket, a pipeline send) is absorbed in
the others' compute phases and cannot be attributed this way.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Straggler:
    rank: int
    first_step: int
    last_step: int
    steps: int  # consecutive steps above the threshold
    excess_pct: float  # median over those steps of (own time / median own time - 1) x 100
    ongoing: bool  # the streak reaches the last step read

    def to_dict(self) -> dict:
        return asdict(self)


def own_step_times(step_time_s: Sequence[float], sync_wait_s: Sequence[float]) -> list[float]:
    """Each rank's own share of one step: the ranks' median step time less its wait at the
    step-end synchronisation (the median, because the ranks' clocks start the step at
    slightly different moments)."""
    median = statistics.median(step_time_s)
    return [max(0.0, median - wait) for wait in sync_wait_s]


def find_stragglers(times: Sequence[Sequence[float]], threshold_pct: float, min_steps: int,
                    steps: Sequence[int] | None = None, ranks: Sequence[int] | None = None) -> list[Straggler]:
    """Ranks whose own step time exceeds the median over ranks by more than
    `threshold_pct` for at least `min_steps` consecutive steps.

    `times[i][r]` is rank r's own time at the i-th step (`steps[i]`, default i + 1); each
    rank is reported once, with its longest streak (the latest of equally long ones).
    """
    steps = list(steps) if steps is not None else list(range(1, len(times) + 1))
    width = len(times[0]) if times else 0
    ranks = list(ranks) if ranks is not None else list(range(width))
    limit = 1.0 + threshold_pct / 100.0
    out = []
    for col, rank in enumerate(ranks):
        best: tuple[int, int] | None = None  # (start, end) rows, end exclusive
        start = None
        for i, row in enumerate(times):
            median = statistics.median(row)
            slow = median > 0 and row[col] > median * limit
            if slow and start is None:
                start = i
            if start is not None and (not slow or i == len(times) - 1):
                end = i + 1 if slow else i
                if best is None or end - start >= best[1] - best[0]:
                    best = (start, end)
                start = None
        if best is None or best[1] - best[0] < min_steps:
            continue
        excess = [times[i][col] / statistics.median(times[i]) - 1.0 for i in range(*best)]
        out.append(Straggler(rank=rank, first_step=steps[best[0]], last_step=steps[best[1] - 1],
                             steps=best[1] - best[0], excess_pct=100.0 * statistics.median(excess),
                             ongoing=best[1] == len(times)))
    return out


# Allocations outside any model's tensors that the caching allocator still counts, such as
# cuBLAS workspaces (tens of MiB per stream; torch docs, "Reproducibility": CUBLAS_WORKSPACE_CONFIG
# ":4096:8" adds about 24 MiB): a quarter GiB covers a few streams with room.
MEMORY_SLACK_GIB = 0.25


def memory_over_prediction(peak_memory_gib: dict[int, float], predicted_gib: float | None,
                           threshold_pct: float) -> dict[int, float]:
    """Rank -> percent above the predicted peak, for ranks more than `threshold_pct` above."""
    if not predicted_gib or predicted_gib <= 0:
        return {}
    over = {r: 100.0 * (m / predicted_gib - 1.0) for r, m in peak_memory_gib.items()}
    # and by more than MEMORY_SLACK_GIB: a model of a few MB is otherwise "1000% over" the
    # allocations no model counts (cuBLAS workspaces)
    return {r: pct for r, pct in over.items()
            if pct > threshold_pct and peak_memory_gib[r] - predicted_gib > MEMORY_SLACK_GIB}
