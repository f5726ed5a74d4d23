"""Per-phase step timing that measures device time, not launch time.

On CPU every op runs to completion before Python moves on, so `perf_counter` between two
marks is the phase's time. On CUDA the host only queues kernels; CUDA events recorded at
the marks are read after the step's final synchronisation, so the phases add up to the
work the GPU did, without forcing a synchronisation at every mark.
"""

from __future__ import annotations

import time

import torch


class PhaseTimer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = [("", self._now())]

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def mark(self, phase: str) -> None:
        """The time since the previous mark belongs to `phase` (summed over repeats)."""
        self.marks.append((phase, self._now()))

    def totals_s(self) -> dict[str, float]:
        """Seconds per phase; on CUDA call after the step's work has been synchronised."""
        out: dict[str, float] = {}
        for (_, start), (phase, end) in zip(self.marks, self.marks[1:], strict=False):
            seconds = start.elapsed_time(end) / 1e3 if self.cuda else end - start
            out[phase] = out.get(phase, 0.0) + seconds
        return out
