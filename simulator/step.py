"""Discrete-event simulation of one training step of one representative replica.

One simpy process per pipeline rank runs its schedule (schedules.py); one more per rank
is its data-parallel communication stream. DP and TP replicas are symmetric (they do the
same work at the same time on their own GPUs and link shares), so one replica stands for
all of them: never one process per GPU.

Per micro-batch: forward, backward (its first `recompute_s` is the recomputed forward),
activation and gradient sends between chunks. TP collectives are inside forward_s /
backward_s (they sit on the critical path); so are the expert all-to-alls and the exposed
context-parallel collectives, which with contention on run at the end of their pass on the
rank's NVLink port (group inside a node) or NIC share (group across nodes), sharing them
with the sends and the DP stream. With contention on, a pass with ZeRO-2/3 / FSDP
collectives runs unit by unit instead (`_sharded_pass`: per-layer all-gathers prefetched,
reduce-scatters after each backward unit, on the DP links). Per step: the DP gradient
collective (or ZeRO reduce-scatter, with the parameter all-gather prefetched at the step's
start) on the DP stream, bucketed and overlapped with each chunk's final backward when the plan overlaps
it, then the optimizer. With contention on, sends and DP buckets share links
(network.py); with it off every transfer takes its cost-model time and the pipeline equals the
closed form's replay of the same schedule (`closed_form.compute_end_s`, for any stages and
sends), and the step equals the closed form where each device's DP tail does too: each chunk's
reduction starts at its own last backward, as Megatron-Core's grad_sync_func, and
`closed_form.device_tail_s` counts it so, less any idle in the cool-down. Where a pass's GPU waits for
its collectives, the wait is an event of its own (lane "wait"), so that the timeline's compute
is compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import simpy
from smplan.planner.costs import PlanCosts
from smplan.planner.schedules import (
    ScheduleError,
    device_orders,
    first_forward_index,
    last_backward_index,
)

from .network import LinkKey, Network


class SimEvent(NamedTuple):
    device: int  # pipeline rank
    lane: str  # "compute", "wait" (inside a pass), "send" (also the expert and CP collectives) or "dp"
    # F, R (recompute), B, optimizer; zero-wait, ep-wait, cp-wait (the pass's GPU idle for its
    # collectives); send-act, send-grad, ep-a2a, cp-comm; dp-gather, zero-gather, dp-reduce, zero-reduce
    name: str
    start: float
    end: float
    chunk: int = -1
    mb: int = -1


# The Gantt chart's and the trace's tracks, by event name: the passes, the GPU's waits inside
# them (drawn over the pass), then one track per kind of transfer, so that transfers running at
# once (a ZeRO-3 backward's all-gathers and reduce-scatters) never cover each other.
TRACKS = ("compute", "wait", "p2p", "ep/cp", "dp gather", "dp reduce")
_TRACK_OF = {"zero-wait": "wait", "ep-wait": "wait", "cp-wait": "wait", "send-act": "p2p", "send-grad": "p2p",
             "ep-a2a": "ep/cp", "cp-comm": "ep/cp", "dp-gather": "dp gather", "zero-gather": "dp gather",
             "dp-reduce": "dp reduce", "zero-reduce": "dp reduce"}


def track_of(name: str) -> str:
    """The track (TRACKS) an event named `name` is drawn and traced on."""
    return _TRACK_OF.get(name, "compute")


class PassWaits(NamedTuple):
    """Seconds one pass's GPU sat idle for its collectives: ZeRO-2/3 all-gathers and
    reduce-scatters, expert all-to-alls, exposed CP collectives (as they ran, links shared)."""

    zero_s: float = 0.0
    ep_s: float = 0.0
    cp_s: float = 0.0


# Below this a pass's overrun is float rounding of env.now = start + dur, not shared links.
SHARED_TOLERANCE_S = 1e-12


@dataclass
class DeviceTimes:
    """What one pipeline rank did in the step (seconds)."""

    compute_s: float = 0.0  # forward + backward incl. recompute and TP collectives
    recompute_s: float = 0.0
    tp_comm_s: float = 0.0
    ep_comm_s: float = 0.0  # the passes' GPU idle for their expert all-to-alls
    cp_comm_s: float = 0.0  # the passes' GPU idle for their exposed context-parallel K/V collectives
    host_wait_s: float = 0.0  # the GPU idle inside the passes while the host launches their kernels
    wait_comm_s: float = 0.0  # idle while the awaited activation/gradient was on the wire
    wait_bubble_s: float = 0.0  # idle for any other reason (pipeline fill and drain)
    wait_gather_s: float = 0.0  # idle for a ZeRO parameter all-gather
    zero_wait_s: float = 0.0  # the GPU idle inside ZeRO-2/3 passes for their per-unit collectives
    send_wait_s: float = 0.0  # held by its own blocking sends
    compute_end_s: float = 0.0
    dp_end_s: float = 0.0
    dp_busy_s: float = 0.0
    send_busy_s: float = 0.0
    optimizer_s: float = 0.0
    end_s: float = 0.0


@dataclass
class RawStep:
    step_time_s: float
    devices: list[DeviceTimes]
    events: list[SimEvent]
    link_busy_s: dict = field(default_factory=dict)
    link_shared_s: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DpJob:
    ready_s: float
    seconds: float
    chunk: int
    name: str
    done: simpy.Event | None = None
    not_before_s: float = 0.0  # the job cannot finish before its last gradient exists


class StepSimulation:
    """Builds and runs the simpy model; `run()` returns a RawStep."""

    def __init__(
        self,
        costs: PlanCosts,
        link_class: dict[str, str] | None = None,
        contention: bool = True,
        dp_seconds: list[float] | None = None,
        record_events: bool = True,
        blocking_sends: bool = True,
    ):
        self.costs = costs
        self.pp = costs.pp
        self.v = costs.virtual_stages
        self.m = costs.num_microbatches
        self.chunks = len(costs.stages)
        if self.chunks != self.pp * self.v:
            raise ScheduleError(
                f"PlanCosts has {self.chunks} stages but pp*v={self.pp * self.v}; the cost model must give one per chunk"
            )
        self.orders = device_orders(costs.schedule, self.pp, self.m, self.v)
        # Which link class carries DP traffic and which carries each send: "nic" or "nvlink".
        self.link_class = link_class or {}
        self.dp_seconds = (
            dp_seconds if dp_seconds is not None else [s.dp_comm_s for s in costs.stages]
        )
        self.env = simpy.Environment()
        self.net = Network(self.env) if contention else None
        self.record = record_events
        self.blocking_sends = blocking_sends
        self.events: list[SimEvent] = []
        self._ready: dict[tuple[str, int, int], simpy.Event] = {}
        self._sent_at: dict[tuple[str, int, int], float] = {}
        # (device, "ep" | "cp") -> hidden collective seconds its passes have not yet had room for
        self._hidden_left: dict[tuple[int, str], float] = {}
        self.devices = [DeviceTimes() for _ in range(self.pp)]
        self.queues = [simpy.Store(self.env) for _ in range(self.pp)]
        extras = costs.extras or {}
        self.zero = int(extras.get("zero", 0))
        self.gather_fraction = float(
            extras.get("dp_allgather_fraction", 0.5 if self.zero >= 1 else 0.0)
        )
        self.buckets = int(extras.get("dp_buckets", 0))
        self._gathered: dict[int, simpy.Event] = {}
        self._dp_spans: list[list[tuple[float, float]]] = [[] for _ in range(self.pp)]  # DP links in use

    # -- links -----------------------------------------------------------------------
    def _transfer(self, links: tuple[LinkKey, ...], seconds: float) -> simpy.Event:
        if self.net is None:
            return self.env.timeout(max(seconds, 0.0))
        return self.net.transfer(links, seconds)

    def _send_links(self, src: int, dst: int, crosses: bool) -> tuple[LinkKey, ...]:
        cls = "nic" if crosses else "nvlink"
        return ((cls, src, "out"), (cls, dst, "in"))

    def _dp_links(self, d: int) -> tuple[LinkKey, ...]:
        cls = self.link_class.get("dp", "nic")
        return ((cls, d, "out"), (cls, d, "in"))

    def _group_links(self, d: int, crosses: bool) -> tuple[LinkKey, ...]:
        """The links an expert all-to-all or a CP collective of rank `d` uses: its NIC share when
        the group spans nodes, else its NVLink port (all its members move data both ways)."""
        cls = "nic" if crosses else "nvlink"
        return ((cls, d, "out"), (cls, d, "in"))

    def _pass(self, d: int, st, forward: bool, chunk: int = -1, mb: int = -1):
        """One pass: compute, then its expert all-to-alls and exposed CP collectives on their
        links (with contention off: the pass's cost-model time exactly). A pass with ZeRO-2/3
        collectives runs them unit by unit on the DP links instead (`_sharded_pass`). Returns
        the pass's PassWaits."""
        if self.net is not None and st.zero_units:
            return (yield from self._sharded_pass(d, st, forward, chunk, mb))
        if forward:
            comm = ((st.ep_comm_forward_s, st.ep_crosses_node), (st.cp_comm_forward_s, st.cp_crosses_node))
            dur = st.forward_s
        else:
            comm = ((st.ep_comm_backward_s, st.ep_crosses_node), (st.cp_comm_backward_s, st.cp_crosses_node))
            dur = st.backward_s
        on_links = sum(sec for sec, _ in comm)
        compute = max(0.0, dur - on_links)
        hidden = self._hidden_collectives(d, st, forward, compute, chunk, mb)
        if on_links <= 0 and not hidden:
            yield self.env.timeout(dur)
            return PassWaits()
        # contention off, they take their cost-model seconds: the pass still lasts dur
        yield self.env.timeout(compute)
        hidden_ep_s, hidden_cp_s = yield from self._wait_hidden(d, hidden, chunk, mb)
        ep_s, cp_s = yield from self._group_collectives(d, comm, chunk, mb)
        return PassWaits(0.0, ep_s + hidden_ep_s, cp_s + hidden_cp_s)

    def _hidden_collectives(self, d: int, st, forward: bool, compute_s: float, chunk: int, mb: int) -> list:
        """Start the share of the pass's expert all-to-alls and CP collectives that the stack
        hides under its compute (StageCosts.*_hidden_*) on their group's links, beside the
        compute: they take no GPU time but share the links with the DP and pipeline traffic.
        Each runs no longer than the compute it hides under, so with contention off none
        outlasts its pass; what is left (the cost model hides a forward's all-to-all under the
        paired micro-batch's backward: Megatron-Core's EP A2A overlap) goes with the device's
        next pass. Returns [(kind, event)] of those started."""
        if forward:
            parts = (("ep", st.ep_hidden_forward_s, st.ep_crosses_node), ("cp", st.cp_hidden_forward_s, st.cp_crosses_node))
        else:
            parts = (("ep", st.ep_hidden_backward_s, st.ep_crosses_node), ("cp", st.cp_hidden_backward_s, st.cp_crosses_node))
        started = []
        for kind, own, crosses in parts:
            owed = own + self._hidden_left.get((d, kind), 0.0)
            seconds = min(owed, compute_s)
            self._hidden_left[(d, kind)] = owed - seconds
            if seconds <= SHARED_TOLERANCE_S:
                continue
            start, done = self.env.now, self._transfer(self._group_links(d, crosses), seconds)
            if self.record:
                name = "ep-a2a" if kind == "ep" else "cp-comm"
                done.callbacks.append(lambda _ev, name=name, start=start: self.events.append(
                    SimEvent(d, "send", name, start, self.env.now, chunk, mb)))
            started.append((kind, done))
        return started

    def _wait_hidden(self, d: int, hidden: list, chunk: int, mb: int):
        """At the end of the pass's compute, the GPU waits for hidden collectives still on the
        links (contention stretched them past the compute). Returns the seconds (ep, cp)."""
        waited = {"ep": 0.0, "cp": 0.0}
        for kind, done in hidden:
            if not done.processed:
                start = self.env.now
                yield done
                waited[kind] += self._waited(d, kind + "-wait", start, chunk, mb)
        return waited["ep"], waited["cp"]

    def _sharded_pass(self, d: int, st, forward: bool, chunk: int, mb: int):
        """A ZeRO-3 / FSDP pass as it runs (Zhao et al. 2023, PyTorch FSDP, section 3.3): each
        unit (embedding, block, head) all-gathers its parameters before its compute, the next
        unit's gather issued as soon as the current one's has landed (prefetch: two units
        live); in backward, units in reverse, each reduce-scatters its gradients after its
        compute, on the same links as the gathers, and the pass ends when every reduce-scatter
        has landed (FSDP2's final backward callback waits for them). ZeRO-2 has only the
        reduce-scatters. Without overlap each collective waits for the one before and the
        compute waits for it. The pass's expert all-to-alls and exposed CP collectives then
        run on their links, as in `_pass` (taken out of the units' compute pro rata). Returns the
        PassWaits: the GPU idle before a unit whose gather has not landed, after the last unit
        until every reduce-scatter has, and for the group collectives (not the cost model's
        max(compute, collectives) per unit: what the timeline ran)."""
        env, overlapped = self.env, st.dp_overlappable  # the plan's overlap_dp, as for the DP stream
        links = self._group_links(d, st.zero_crosses_node)  # the DP group's NIC share or NVLink port
        units = st.zero_units if forward else st.zero_units[::-1]
        # (compute, gather, reduce-scatter) per unit; backward gathers what forward gathered
        steps = [(u.forward_s, u.forward_comm_s, 0.0) if forward else
                 (u.backward_s, min(u.forward_comm_s, u.backward_comm_s), max(0.0, u.backward_comm_s - u.forward_comm_s))
                 for u in units]
        if forward:
            comm = ((st.ep_comm_forward_s, st.ep_crosses_node), (st.cp_comm_forward_s, st.cp_crosses_node))
        else:
            comm = ((st.ep_comm_backward_s, st.ep_crosses_node), (st.cp_comm_backward_s, st.cp_crosses_node))
        total = sum(c for c, _, _ in steps)
        keep = 1.0 - min(1.0, sum(sec for sec, _ in comm) / total) if total > 0 else 1.0
        hidden = self._hidden_collectives(d, st, forward, total * keep, chunk, mb)

        def transfer(name: str, seconds: float) -> simpy.Event | None:
            if seconds <= 0:
                return None
            start = env.now
            done = self._transfer(links, seconds)

            def landed(_ev):
                self._dp_spans[d].append((start, env.now))
                if self.record:
                    self.events.append(SimEvent(d, "dp", name, start, env.now, chunk, mb))

            done.callbacks.append(landed)
            return done

        def wait_for(event: simpy.Event):
            start = env.now
            yield event
            return self._waited(d, "zero-wait", start, chunk, mb)

        gathered = transfer("zero-gather", steps[0][1])
        pending = []  # reduce-scatters in flight: a later, smaller one can land first
        zero_s = 0.0
        for i, (compute, _, reduce) in enumerate(steps):
            if gathered is not None:
                zero_s += yield from wait_for(gathered)
            nxt = steps[i + 1][1] if i + 1 < len(steps) else 0.0
            gathered = transfer("zero-gather", nxt) if overlapped else None  # prefetch under this compute
            yield env.timeout(compute * keep)
            reduced = transfer("zero-reduce", reduce)
            if reduced is not None:
                pending.append(reduced)
                if not overlapped:
                    zero_s += yield from wait_for(reduced)
            if not overlapped:
                gathered = transfer("zero-gather", nxt)
        if pending:
            zero_s += yield from wait_for(env.all_of(pending))
        hidden_ep_s, hidden_cp_s = yield from self._wait_hidden(d, hidden, chunk, mb)
        ep_s, cp_s = yield from self._group_collectives(d, comm, chunk, mb)
        return PassWaits(zero_s, ep_s + hidden_ep_s, cp_s + hidden_cp_s)

    def _waited(self, d: int, name: str, start: float, chunk: int, mb: int) -> float:
        """Seconds since `start` the pass's GPU waited for a collective, drawn on the wait track."""
        seconds = self.env.now - start
        if self.record and seconds > SHARED_TOLERANCE_S:
            self.events.append(SimEvent(d, "wait", name, start, self.env.now, chunk, mb))
        return seconds

    def _group_collectives(self, d: int, comm, chunk: int, mb: int):
        """A pass's expert all-to-alls, then its exposed CP collectives, on their group's links
        (`comm`: ((seconds, crosses node), ...) in that order); traced on the send lane, and the
        GPU's wait for them on the wait lane. Returns the seconds each took (ep, cp)."""
        took = []
        for (seconds, crosses), name in zip(comm, ("ep-a2a", "cp-comm"), strict=True):
            start = self.env.now
            if seconds > 0:
                yield self._transfer(self._group_links(d, crosses), seconds)
                if self.record:
                    self.events.append(SimEvent(d, "send", name, start, self.env.now, chunk, mb))
            took.append(self._waited(d, name.split("-")[0] + "-wait", start, chunk, mb))
        return tuple(took)

    def _ready_event(self, key: tuple[str, int, int]) -> simpy.Event:
        ev = self._ready.get(key)
        if ev is None:
            ev = self._ready[key] = self.env.event()
        return ev

    def _send(
        self, key: tuple[str, int, int], src: int, seconds: float, crosses: bool
    ) -> simpy.Event | None:
        """Ship an activation (key F, c+1, j) or a gradient (key B, c-1, j) to its chunk's rank.

        Returns the event of its arrival (None when instantaneous); the sender waits for it.
        """
        dst = self.costs.device_stage(key[1])
        target = self._ready_event(key)
        start = self.env.now
        self._sent_at[key] = start
        if seconds <= 0:
            target.succeed()
            return None
        done = self._transfer(self._send_links(src, dst, crosses), seconds)
        name = "send-act" if key[0] == "F" else "send-grad"

        def arrived(_ev, target=target, start=start, name=name, key=key):
            self.devices[src].send_busy_s += self.env.now - start
            if self.record:
                self.events.append(SimEvent(src, "send", name, start, self.env.now, key[1], key[2]))
            target.succeed()

        done.callbacks.append(arrived)
        return done

    # -- data parallel ---------------------------------------------------------------
    def _queue_reduce(self, d: int, c: int, start: float, dur: float, seconds: float) -> None:
        """Gradient reduction of chunk c overlapping its final backward [start, start + dur).

        Default (the cost model's assumption): fine-grained buckets, i.e. the collective may
        run as soon as the backward starts and ends no earlier than the backward, so it is
        exposed by max(0, dp - backward). Under ZeRO-2 the backward's own reduce-scatters hold
        the DP links first, so the step's collective may start only after their seconds (as
        `closed_form.device_tail_s` counts it). With extras["dp_buckets"] = n, bucket k is ready
        at start + (k+1)/n * dur and the last bucket is always exposed (DDP's tail).
        """
        n = self.buckets
        if n <= 0:
            ready = start + min(dur, self.costs.stages[c].zero_reduce_s)
            self.queues[d].put(DpJob(ready, seconds, c, "dp-reduce", not_before_s=start + dur))
            return
        for k in range(n):
            self.queues[d].put(DpJob(start + dur * (k + 1) / n, seconds / n, c, "dp-reduce"))

    def _dp_stream(self, d: int):
        env, times, queue = self.env, self.devices[d], self.queues[d]
        while True:
            job = yield queue.get()
            if job is None:
                break
            if job.ready_s > env.now:
                yield env.timeout(job.ready_s - env.now)
            start = env.now
            yield self._transfer(self._dp_links(d), job.seconds)
            self._dp_spans[d].append((start, env.now))
            if self.record and env.now > start:
                self.events.append(SimEvent(d, "dp", job.name, start, env.now, job.chunk))
            if job.not_before_s > env.now:
                yield env.timeout(job.not_before_s - env.now)
            if job.done is not None:
                job.done.succeed()
        times.dp_end_s = env.now

    def _queue_gathers(self, d: int, order) -> None:
        """ZeRO: the parameter all-gather of each chunk is prefetched from the step's start."""
        if self.gather_fraction <= 0:
            return
        for chunk in sorted(first_forward_index(order), key=first_forward_index(order).get):
            seconds = self.dp_seconds[chunk] * self.gather_fraction
            if seconds > 0:
                done = self.env.event()
                self._gathered[chunk] = done
                self.queues[d].put(DpJob(0.0, seconds, chunk, "dp-gather", done))

    # -- one pipeline rank ------------------------------------------------------------
    def _device(self, d: int):
        env, costs, times = self.env, self.costs, self.devices[d]
        order = self.orders[d]
        last_b = last_backward_index(order)
        first_f = first_forward_index(order)
        last_chunk = self.chunks - 1
        overlap = [costs.stages[c].dp_overlappable for c in range(self.chunks)]
        reduce_fraction = 1.0 - self.gather_fraction
        self._queue_gathers(d, order)
        for i, task in enumerate(order):
            c, j = task.chunk, task.mb
            st = costs.stages[c]
            if task.kind == "F":
                dep = ("F", c, j) if c > 0 else None
                if i == first_f[c] and c in self._gathered and not self._gathered[c].processed:
                    t0 = env.now
                    yield self._gathered[c]
                    times.wait_gather_s += env.now - t0
            else:
                dep = ("B", c, j) if c < last_chunk else None
            if dep is not None:
                ev = self._ready_event(dep)
                if not ev.processed:
                    t0 = env.now
                    yield ev
                    on_wire = env.now - max(t0, self._sent_at.get(dep, env.now))
                    times.wait_comm_s += on_wire
                    times.wait_bubble_s += env.now - t0 - on_wire
            start = env.now
            sharded = bool(st.zero_units) and self.net is not None
            # the recomputed forward: the sharded pass runs it unit by unit even where the closed
            # form's max(compute, collectives) hid it
            rec_s = sum(u.recompute_s for u in st.zero_units) if sharded else st.recompute_s
            if task.kind == "F":
                dur = st.forward_s
                times.host_wait_s += st.host_wait_forward_s
                times.tp_comm_s += st.tp_comm_forward_s
            else:
                dur = st.backward_s
                times.host_wait_s += st.host_wait_backward_s
                times.tp_comm_s += st.tp_comm_backward_s
                times.recompute_s += rec_s
                if i == last_b[c] and overlap[c] and self.dp_seconds[c] > 0:
                    self._queue_reduce(d, c, start, dur, self.dp_seconds[c] * reduce_fraction)
            waits = yield from self._pass(d, st, task.kind == "F", c, j)
            # what the GPU waited for inside the pass, as it ran: shared links lengthen the
            # all-to-alls and CP collectives; a sharded pass idles where a unit's gather or the last
            # reduce-scatters stick out of the compute (exposed DP time), and a part's collectives
            # hiding under the next part's compute can make it shorter than the cost model's
            times.zero_wait_s += waits.zero_s
            times.ep_comm_s += waits.ep_s
            times.cp_comm_s += waits.cp_s
            if sharded or env.now - start - dur > SHARED_TOLERANCE_S:  # not the rounding of start + dur
                dur = env.now - start
            times.compute_s += dur
            if self.record:
                if task.kind == "B" and rec_s > 0:
                    self.events.append(SimEvent(d, "compute", "R", start, start + rec_s, c, j))
                    self.events.append(SimEvent(d, "compute", "B", start + rec_s, env.now, c, j))
                else:
                    self.events.append(SimEvent(d, "compute", task.kind, start, env.now, c, j))
            sent = None
            if task.kind == "F" and c < last_chunk:
                sent = self._send(("F", c + 1, j), d, st.send_s, st.send_crosses_node)
            elif task.kind == "B" and c > 0:
                prev = costs.stages[c - 1]
                sent = self._send(("B", c - 1, j), d, prev.send_s, prev.send_crosses_node)
            if sent is not None and self.blocking_sends:
                # Megatron's P2P (batch_isend_irecv + wait) holds the rank until the send is done.
                t0 = env.now
                yield sent
                times.send_wait_s += env.now - t0
        times.compute_end_s = env.now
        for c in sorted(last_b):
            if not overlap[c] and self.dp_seconds[c] > 0:
                self.queues[d].put(
                    DpJob(env.now, self.dp_seconds[c] * reduce_fraction, c, "dp-reduce")
                )
        self.queues[d].put(None)
        yield self._streams[d]
        opt = sum(costs.stages[c].optimizer_s for c in last_b)
        if opt > 0:
            start = env.now
            yield env.timeout(opt)
            if self.record:
                self.events.append(SimEvent(d, "compute", "optimizer", start, env.now))
        times.optimizer_s = opt
        times.end_s = env.now

    def run(self) -> RawStep:
        self._streams = [self.env.process(self._dp_stream(d)) for d in range(self.pp)]
        procs = [self.env.process(self._device(d)) for d in range(self.pp)]
        self.env.run()
        for d, p in enumerate(procs):
            if not p.processed:
                raise RuntimeError(
                    f"pipeline rank {d} deadlocked; the schedule's dependencies are inconsistent"
                )
        for d, spans in enumerate(self._dp_spans):  # the DP stream and ZeRO's per-unit collectives
            self.devices[d].dp_busy_s = _covered_s(spans)
        self.events.sort(key=lambda e: (e.device, e.start, e.lane))
        return RawStep(
            step_time_s=max(t.end_s for t in self.devices),
            devices=self.devices,
            events=self.events,
            link_busy_s=dict(self.net.busy_s) if self.net else {},
            link_shared_s=dict(self.net.shared_s) if self.net else {},
        )


def _covered_s(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of [start, end) spans."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
