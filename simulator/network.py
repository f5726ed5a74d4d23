"""Links as shared resources: a fluid (processor-sharing) model of concurrent transfers.

Each transfer knows how long it takes alone (the cost model's alpha-beta time). While n
transfers share a link, each gets 1/n of it; a transfer that crosses several links moves at
its slowest share (min over its links of 1/n_link). That is not max-min fair, but it is
simple, exact when nothing overlaps, and never faster than the transfer alone, which is
the property the simulator promises (contention only slows things down).

Link keys are (class, device, direction): `class` is "nvlink" (the node's NVSwitch port of
the GPU) or "nic" (its share of the node's NICs); `device` is the pipeline rank whose GPUs
use it. Every GPU owns its share of both (DGX: one HCA and one NVSwitch port set per GPU),
so the other DP and TP replicas, which do the same at the same time, load their own shares
and need not be simulated.
"""

from __future__ import annotations

import simpy

LinkKey = tuple[str, int, str]


class _Flow:
    __slots__ = ("links", "remaining", "rate", "event", "work")

    def __init__(self, links: tuple[LinkKey, ...], work: float, event: simpy.Event):
        self.links = links
        self.work = work
        self.remaining = work
        self.rate = 1.0
        self.event = event


class Network:
    """Concurrent transfers on shared links, inside one simpy environment."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.flows: list[_Flow] = []
        self._last = 0.0
        self._generation = 0
        self.busy_s: dict[LinkKey, float] = {}  # seconds each link carried at least one flow
        self.shared_s: dict[LinkKey, float] = {}  # seconds each link carried two or more

    def transfer(self, links: tuple[LinkKey, ...], seconds: float) -> simpy.Event:
        """An event that fires when a transfer of `seconds` (alone) has got through `links`."""
        event = self.env.event()
        if seconds <= 0 or not links:
            event.succeed()
            return event
        self._advance()
        self.flows.append(_Flow(links, seconds, event))
        self._reschedule()
        return event

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last
        if dt > 0 and self.flows:
            counts: dict[LinkKey, int] = {}
            for f in self.flows:
                f.remaining -= f.rate * dt
                for link in f.links:
                    counts[link] = counts.get(link, 0) + 1
            for link, n in counts.items():
                self.busy_s[link] = self.busy_s.get(link, 0.0) + dt
                if n > 1:
                    self.shared_s[link] = self.shared_s.get(link, 0.0) + dt
        self._last = now

    def _reschedule(self) -> None:
        # Flows within a relative 1e-9 of done, or whose rest would not move the clock
        # (now + rest == now in floating point), are done.
        eps = 1e-15 * max(1.0, abs(self.env.now))

        def finished(f: _Flow) -> bool:
            return f.remaining <= 1e-9 * f.work or f.remaining <= eps

        done = [f for f in self.flows if finished(f)]
        if done:
            self.flows = [f for f in self.flows if not finished(f)]
            for f in done:
                f.event.succeed()
        if not self.flows:
            return
        counts: dict[LinkKey, int] = {}
        for f in self.flows:
            for link in f.links:
                counts[link] = counts.get(link, 0) + 1
        nxt = float("inf")
        for f in self.flows:
            f.rate = 1.0 / max(counts[link] for link in f.links)
            nxt = min(nxt, f.remaining / f.rate)
        self._generation += 1
        generation = self._generation
        timer = self.env.timeout(nxt)
        timer.callbacks.append(lambda _ev: self._on_timer(generation))

    def _on_timer(self, generation: int) -> None:
        if generation != self._generation:
            return  # a later arrival or departure rescheduled the next completion
        self._advance()
        self._reschedule()
