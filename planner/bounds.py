"""Closed-form lower bounds on a candidate's step time, valid for every stage partition.

plan_search solves candidates in the order of these bounds and stops when the bound
reaches the K-th best solved plan; explain uses them to test whether a change fits.
"""

from __future__ import annotations

import heapq
import math
from typing import NamedTuple

import numpy as np
from smplan.hwprofiles.perf import p2p_time_s
from smplan.hwprofiles.topology import ParallelLayout

from .cost_model import CostModel, MeshKey, pp_send_bytes
from .feasibility import effective_zero
from .memory_model import chunk_in_flight, chunk_memory, in_flight
from .search_space import Candidate


def mesh_key_of(cand: Candidate) -> MeshKey:
    return MeshKey(
        tp=cand.tp,
        dp=cand.dp,
        pp=cand.pp,
        v=cand.v,
        micro_batch=cand.mbs,
        num_microbatches=cand.m,
        sp=cand.sp,
        zero=effective_zero(cand.zero, cand.pp),
        overlap_dp=cand.overlap_dp,
        schedule=cand.schedule,
        dtype=cand.dtype,
        ep=cand.ep,
        cp=cand.cp,
        capacity_factor=cand.capacity_factor,
        grad_compress=cand.grad_compress,
        fp8_scaling=cand.fp8_scaling,
    )


def compute_lower_bound(cm: CostModel, cand: Candidate) -> float:
    """The pipeline term with no recomputation, no sends and the busiest device at the mean
    (`_pipeline_bound`; `_balanced_pipeline` where the pipeline is long)."""
    key = mesh_key_of(cand)
    prof = cm.profile
    bp = cm.pass_of(prof.blocks[0], key)
    fixed = sum(cm.pass_of(x, key).forward_s + cm.pass_of(x, key).backward_s for x in prof.pre + prof.post)
    work = fixed + prof.num_blocks * (bp.forward_s + bp.backward_s)
    mean = work / cand.pp
    return max(_pipeline_bound(cand, work, mean, _forward_share(cm, key), 0.0), _balanced_pipeline(cand, work, mean))


def _pipeline_bound(cand: Candidate, work: float, cycle: float, share: float, send_max: float) -> float:
    """A pipeline time no stage split beats: the longest of some paths of the schedule's task graph,
    which closed_form replays (the textbook formulas with the busiest or the mean cycle are not:
    the replay drains a heavy first stage early, 12% below AMP's on random costs at m = 2).

    `work`: one micro-batch's passes through every chunk, sends included; `cycle`: a lower bound
    on the busiest device's passes per micro-batch (its c_d); `share`: the largest forward share
    of a pass; `send_max`: the longest send. Every schedule: that device's m cycles, and one
    micro-batch's passes. GPipe: micro-batch 0's forwards to d, d's m forwards, the last one's on
    to the end, micro-batch 0's backwards back to d, d's m backwards, the last one's back to the
    first device: work + (m - 1) c_d. 1F1B: the same path skips d's p-d-1 other warm-up forwards,
    each at most share x c_d + its send. Interleaved: its warm-up runs beside other devices' work.
    """
    p, m = cand.pp, cand.m
    out = max(m * cycle, work)
    if cand.schedule == "gpipe":
        out = max(out, work + (m - 1) * cycle)
    elif cand.schedule == "1f1b" or cand.v == 1:
        out = max(out, work + max(0.0, m - 1 - (p - 1) * share) * cycle - (p - 1) * send_max)
    return out


def textbook_is_floor(cand: Candidate) -> bool:
    """Whether AMP's critical path (Li et al. 2022, eq. 2) at the mean cycle is a floor for every
    split: GPipe always (its path through the busiest device is that formula); 1F1B with more
    micro-batches than stages, measured, not proven (over the random splits of equal blocks of
    benchmarks/plan_ranking.py part 6 the replay never came in under it; with m <= pp it did by
    7.4%; brute force holds it in tests/planner/test_search.py). The interleaved bubble is no
    floor (0.5% over the replay there; tests/planner/test_search.py has a review's case where the
    search lost the best split to it)."""
    return cand.schedule == "gpipe" or (cand.schedule == "1f1b" and cand.m > cand.pp)


def _balanced_pipeline(cand: Candidate, work: float, cycle: float) -> float:
    """AMP's critical path with every device at the mean `cycle` where it is a floor, else 0."""
    return work + (cand.m - 1) * cycle if textbook_is_floor(cand) else 0.0


def _forward_share(cm: CostModel, key: MeshKey) -> float:
    """The largest forward / (forward + backward) of the model's parts (no recompute: the largest)."""
    prof = cm.profile
    passes = [cm.pass_of(x, key) for x in (*prof.pre, prof.blocks[0], *prof.post)]
    return max(t.forward_s / (t.forward_s + t.backward_s) for t in passes)


class _Room(NamedTuple):
    """One pipeline device's memory: blocks it holds without (free) and with (full)
    recomputation, per-block bytes (slope) and what recomputing one block saves."""

    ratio: float  # slope / saved: bytes freed per recomputed block, inverted (inf: none)
    free: float
    full: float
    slope: float
    room: float  # capacity left after the device's constant bytes
    saved: float


def _partition_shortfall(rooms: list[_Room], blocks: int) -> float:
    """The least memory x every device would need on top of its capacity for the devices to
    hold `blocks` whole blocks between them (each at its least bytes per block): the averaged
    need can fit while no split in whole blocks does, and that gap was reported as 0.

    Device d holds its k-th block from x = k b_d - room_d on, so x is the `blocks`-th smallest
    of those thresholds (exact; a bisection over the count took a tenth of GPT 1T's search)."""
    per_block = np.array([r.slope - r.saved for r in rooms])
    if (per_block <= 0).any():
        return 0.0
    room = np.array([r.room for r in rooms])
    thresholds = (np.arange(1, blocks + 1)[None, :] * per_block[:, None] - room[:, None]).ravel()
    return max(0.0, float(np.partition(thresholds, blocks - 1)[blocks - 1]))


def lower_bound(cm: CostModel, cand: Candidate, cap: float) -> tuple[float, str, float]:
    """(lower bound on the step time, rejection reason or "", by how much).

    Valid for every partition: `_pipeline_bound` with the busiest device at least the mean and at
    least the best whole-block split (`_busiest_device`), and AMP's time at the mean where it is
    a floor (`textbook_is_floor`), with the least total recomputation that lets any partition
    fit (a fractional greedy over the devices' memory slopes), plus device 0's tail
    (`_tail_bound`); or the devices' mean m cycles plus their mean tail (`_mean_tail_bound`).
    """
    prof, cl = cm.profile, cm.cluster
    key = mesh_key_of(cand)
    L, p, v, m = prof.num_blocks, cand.pp, cand.v, cand.m
    C = p * v
    block = prof.blocks[0]
    bp = cm.pass_of(block, key)
    fixed = sum(cm.pass_of(x, key).forward_s + cm.pass_of(x, key).backward_s for x in prof.pre + prof.post)
    per_blk = bp.forward_s + bp.backward_s
    rec_blk = bp.backward_with(cand.kind)[1] if cand.kind != "none" else 0.0
    # sends
    layout = ParallelLayout.folded(p, cand.dp, cand.cp, cand.tp, cl.fast_domain_gpus)
    send_bytes = pp_send_bytes(block, cand.mbs, cand.tp, cand.cp, cand.sp, cl)
    s_in = p2p_time_s(send_bytes, False, cl) if p > 1 else 0.0
    s_out = p2p_time_s(send_bytes, True, cl) if p > 1 else 0.0
    crosses = [layout.stage_boundary_crosses_node(d) for d in range(p)]
    sends = [(s_out if crosses[c % p] else s_in) for c in range(C - 1)] + [0.0]
    # memory: per device, const + slope * n - saved * r <= cap; activations scale with the
    # micro-batches in flight, so each kind of chunk is built once at flight 1.
    common = dict(tp=cand.tp, dp=cand.dp, sp=cand.sp, zero=effective_zero(cand.zero, cand.pp), micro_batch=cand.mbs, recompute=cand.kind, dtype=cand.dtype,
                  cp=cand.cp, ep=cand.ep, capacity_factor=cand.capacity_factor, fp8_scaling=cand.fp8_scaling)
    kinds: dict[tuple, tuple[float, ...]] = {}

    def terms(first: bool, last: bool, dev_first: bool) -> tuple[float, ...]:
        k = (first, last, dev_first)
        if k not in kinds:
            mem = chunk_memory(prof, cl, flight=1.0, first=first, last=last, device_first_chunk=dev_first, **common)
            # the recompute buffer only where every block recomputes: a device may recompute none
            rec_buffer = 0.0 if cand.recompute_all else mem.recompute_buffer
            states = mem.weights0 + mem.grads0 + mem.optimizer0 + mem.buffers - rec_buffer + mem.reserve
            # less what recomputing the parts before the blocks frees (a device may: a lower bound)
            kinds[k] = (states, mem.act0 - mem.pre_recompute_saved, mem.weights_blk + mem.grads_blk + mem.optimizer_blk,
                        mem.act_blk, mem.act_rec_blk, rec_buffer, mem.pre_recompute_saved)
        return kinds[k]

    min_needed, rec_needed = 0.0, 0.0
    rooms = []
    for d in range(p):
        q = in_flight(cand.schedule, p, v, m, d)
        # the embedding / head parts: what their own chunk holds (memory_model.chunk_in_flight)
        q_parts = {(d == 0, d == C - 1, True): chunk_in_flight(cand.schedule, p, v, m, d, 0),
                   (False, True, False): chunk_in_flight(cand.schedule, p, v, m, d, v - 1)}
        cats = {(d == 0, d == C - 1, True): 1}
        rest = v - 1
        if v > 1 and d == p - 1:
            cats[(False, True, False)] = 1
            rest -= 1
        if rest > 0:
            cats[(False, False, False)] = rest
        const = buffer = kept = 0.0
        for cat, count in cats.items():
            st, a0, state_blk, act_blk, act_rec, rec_buffer, pre_saved = terms(*cat)
            const += count * (st + q_parts.get(cat, q) * a0)
            # what const leaves out by device: the re-materialisation buffer, held once it
            # recomputes any block, or else the parts before the blocks that recompute would free
            buffer += count * rec_buffer
            kept += count * q_parts.get(cat, q) * pre_saved
        slope = state_blk + q * act_blk
        saved = q * (act_blk - act_rec) if cand.kind != "none" else 0.0
        if not cand.recompute_all:  # a kind that keeps more than none (sac beside FP8 or fused inputs):
            saved = max(saved, 0.0)  # a device that may choose recomputes none of its blocks
        room = cap - const
        free = room / slope if room > 0 else 0.0
        full = room / (slope - saved) if (room > 0 and slope > saved) else (math.inf if room > 0 else 0.0)
        # a device that recomputes holds the buffer: the blocks it holds are the more of what it
        # holds so and what it holds recomputing none (the buffer is one block's whole activations:
        # at a long sequence more than a block's share)
        need = const + (slope - saved) * v
        if cand.kind == "none":
            full = free
        elif cand.recompute_all:
            free = 0.0
        elif buffer or kept:
            with_buffer = room - buffer
            full_with = with_buffer / (slope - saved) if (with_buffer > 0 and slope > saved) else (
                math.inf if with_buffer > 0 else 0.0)
            full = max(full_with, max(room - kept, 0.0) / slope if slope > 0 else math.inf)
            need = min(need + buffer, const + kept + slope * v)
        rooms.append(_Room(slope / saved if saved else math.inf, free, full, slope, room, saved))
        min_needed = max(min_needed, need)
    cap_blocks = sum(math.floor(r.full + 1e-9) for r in rooms)
    if min_needed > cap or cap_blocks < L:
        # GPU memory short of the least any partition needs, averaged over the devices
        least_blk = min(r.slope - r.saved for r in rooms)
        need = sum(cap - r.room for r in rooms) + L * least_blk
        return 0.0, "oom", max(min_needed - cap, need / p - cap, _partition_shortfall(rooms, L), 1.0)
    if cand.recompute_all:
        rec_needed = float(L)
    else:
        left = L - sum(min(r.free, r.full) for r in rooms)
        for ratio, free, full, *_ in sorted(rooms):
            if left <= 0:
                break
            take = min(left, max(0.0, full - free))
            rec_needed += take / ratio if ratio != math.inf else 0.0
            left -= take
    work = fixed + L * per_blk + rec_needed * rec_blk
    cycles = work + 2.0 * sum(sends)
    z = _tail_bound(cm, key, cand, rec_blk)
    # The busiest device: whole blocks, at most as many as its memory holds (all recomputed),
    # at least one per chunk, on top of its fixed work (embedding, head, its sends).
    pre = sum(cm.pass_of(x, key).forward_s + cm.pass_of(x, key).backward_s for x in prof.pre)
    post = fixed - pre
    base = [sum(sends[c] + (sends[c - 1] if c else 0.0) for c in range(d, C, p)) for d in range(p)]
    base[0] += pre
    base[-1] += post
    caps = [math.floor(r.full + 1e-9) for r in rooms]
    step = per_blk + (rec_blk if cand.recompute_all else 0.0)
    busiest = _busiest_device(base, step, L, caps, v)
    pipe = _pipeline_bound(cand, work + 2.0 * sum(sends), max(cycles / p, busiest), _forward_share(cm, key), max(sends))
    mean_tail = _mean_tail_bound(cm, key, cand, rec_blk)
    balanced = _balanced_pipeline(cand, work + 2.0 * sum(sends), cycles / p)
    # Device 0 runs the last backward, so its end is the pipeline's and its own tail follows;
    # every device d ends its passes no earlier than its own m cycles and then runs its tail, so
    # the step is also at least their mean: m x the mean cycle + the mean tail.
    return max(max(pipe, balanced) + z, m * cycles / p + mean_tail), "", 0.0


def _busiest_device(base: list[float], step: float, blocks: int, caps: list[int], least: int) -> float:
    """min over whole-block splits (least <= n_d <= caps_d, sum n_d = blocks) of max_d base_d + n_d step.

    Identical blocks: handing each next block to the device that ends lowest is optimal
    (water-filling). Caps that cannot hold the blocks never reach here (lower_bound rejects them).
    """
    n = [least] * len(base)
    heap = [(b + (least + 1) * step, d) for d, b in enumerate(base) if caps[d] > least]
    heapq.heapify(heap)
    for _ in range(blocks - least * len(base)):
        if not heap:
            break
        _, d = heapq.heappop(heap)
        n[d] += 1
        if n[d] < caps[d]:
            heapq.heappush(heap, (base[d] + (n[d] + 1) * step, d))
    return max(b + k * step for b, k in zip(base, n, strict=True))


def _tail_bound(cm: CostModel, key: MeshKey, cand: Candidate, rec_blk: float) -> float:
    """A DP/optimizer tail no partition avoids.

    One device: its own tail, affine in its blocks, all L of them. More: closed_form takes each
    device's end plus its own tail, and one that drains early has that long for its tail, but
    device 0 runs the step's last backward: the step is at least the pipeline's end plus device
    0's optimizer (and its DP collectives where they do not overlap) over the fewest blocks it
    can hold, one a chunk.
    """
    p, v = cand.pp, cand.v
    if p == 1:
        return _mean_tail_bound(cm, key, cand, rec_blk)  # one device: its own
    first = cm.chunk(key, 0, cand.kind)
    rest = cm.chunk(key, p, cand.kind) if v > 1 else first  # device 0's other chunks: no embedding, no head
    opt = first.opt0 + (v - 1) * rest.opt0 + first.opt_blk * v
    if effective_zero(cand.zero, cand.pp) >= 3 or cand.overlap_dp:
        return opt
    return opt + first.dp_s0 + (v - 1) * rest.dp_s0 + first.dp_s_blk * v


def _mean_tail_bound(cm: CostModel, key: MeshKey, cand: Candidate, rec_blk: float) -> float:
    """The devices' mean DP/optimizer tail at least: tails are affine in n_d, and sum n_d = L."""
    p, L, C = cand.pp, cm.profile.num_blocks, cand.pp * cand.v
    first, last = cm.chunk(key, 0, cand.kind), cm.chunk(key, C - 1, cand.kind)
    # the constant terms of the chunks: one chunk holds both ends when C == 1
    ends = (first,) if C == 1 else (first, last)
    mids = max(0, p - len(ends))
    mid = cm.chunk(key, 1, cand.kind) if C > 2 else first
    opt = (sum(c.opt0 for c in ends) + first.opt_blk * L) / p
    if effective_zero(cand.zero, cand.pp) >= 3:  # with no gradient group (dp = cp = 1, no experts over edp) dp is 0 below
        return opt
    dp0 = sum(c.dp_s0 for c in ends) + mid.dp_s0 * mids
    dp = (dp0 + first.dp_s_blk * L) / p
    if not cand.overlap_dp:
        return opt + dp
    window = (sum(c.b0 for c in ends) + (first.b_blk + rec_blk) * L) / p
    if cand.v > 1:
        # interleaved: a chunk's reduction overlaps the backwards from its own last one on, at most
        # p micro-batches of each chunk (closed_form.device_tail_s): at most p x the device's backward
        window *= p
    return opt + max(0.0, dp - window)
