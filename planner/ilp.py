"""The partition ILP: blocks and recomputed blocks per pipeline stage, under memory limits.

Identical blocks are interchangeable, so the model is over integer COUNTS (DESIGN.md: a
per-layer x per-stage binary model of 96 layers x 16 stages took CBC 370 s, counts solve
in milliseconds): n_c blocks and r_c <= n_c recomputed blocks of chunk c, sum n_c = L.
Every stage figure is affine in (n_c, r_c) (`cost_model.ChunkModel`), so the textbook
pipeline formulas below (AMP's critical path, Li et al. 2022 eq. 2; the interleaved bubble,
Narayanan et al. 2021) are maxima of affine functions and their epigraph form is exact. The
closed form (`closed_form.compute_end_s`) replays the schedule instead, which these equal for
identical stages and approximate otherwise (a heavy stage drains faster first); the search
polishes the ILP's partition under it (`solve.polish`).

    minimise   T_pipe + Z
    T_pipe   = sum_c (f_c + b_c) + 2 sum_c s_c + (m - 1) M              (1F1B, GPipe)
             = m M + (p - 1)/v W + 2 sum_{c<p-1} s_c                     (interleaved)
    M       >= f_c + b_c + s_c + s_{c-1}        (per device d, summed over its chunks)
    W       >= sum_{c on d} (f_c + b_c)                                  (interleaved)
    Z       >= dp_d - window_d + opt_d,   Z >= opt_d
    memory_d = sum_{c on d} memory_c(n_c, r_c) <= capacity
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

import pulp

from .chunk_model import ChunkModel

# A partition problem that HiGHS has not proven within this time keeps its best integer
# solution (observed only for 1F1B with 64+ stages; small cases always prove optimality).
TIME_LIMIT_S = 0.25


@dataclass(frozen=True)
class Partition:
    blocks: tuple[int, ...]
    recompute: tuple[int, ...]
    objective: float


@functools.cache
def _solver():
    # HiGHS runs in-process through highspy; CBC is a subprocess per call (~15 ms). The
    # gap is (almost) zero: the result must equal the brute-force optimum.
    if "HiGHS" in pulp.listSolvers(onlyAvailable=True):
        _silence_highs_banner()
        return pulp.HiGHS(msg=False, gapRel=1e-9, gapAbs=1e-12, timeLimit=TIME_LIMIT_S)
    return pulp.PULP_CBC_CMD(msg=False, gapRel=1e-9)


def _silence_highs_banner() -> None:
    """HiGHS prints a copyright banner on its first run even with output off; swallow it."""
    import highspy

    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.run()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def solve_partition(
    chunks: list[ChunkModel],
    num_blocks: int,
    num_microbatches: int,
    pp: int,
    v: int,
    schedule: str,
    capacity_bytes: float,
    allow_recompute: bool = True,
    recompute_all: bool = False,
    cutoff: float | None = None,
) -> Partition | None:
    """The best (n_c, r_c) for fixed chunk coefficients, or None when nothing fits.

    `recompute_all` forces r_c = n_c (a fixed `recompute=full|selective` plan). Under the
    interleaved schedule the epigraph above sees only a device's sums over its chunks (their
    per-block coefficients are equal), so each device gets one count variable, spread evenly
    over its chunks afterwards (`spread`). The full estimate also sees which chunk holds the
    extra blocks (the DP overlap window, the first chunk's in-flight activations), by up to
    ~0.04% on 5 blocks; `solve._best_spread` tries the other splits where they are few. Memory
    here counts the device's in-flight micro-batches spread evenly over its blocks, exact for an
    even split; the estimate counts each chunk at the device's peak (memory_model.block_flights):
    more where the extra blocks sit on the first chunks, less where on the last, so the search
    keeps only plans whose estimate fits (`solve.fits`), and this ILP (as `bounds`) may refuse a
    device a block that a split heavy on its last chunks would have held.
    `cutoff`: only solutions with a step time below it are of interest
    (the search's K-th best so far); None then means "none better".
    """
    C, m, p = len(chunks), num_microbatches, pp
    groups = [list(range(d, C, p)) for d in range(p)]
    G = len(groups)
    prob = pulp.LpProblem("partition", pulp.LpMinimize)
    var = prob.add_variable if hasattr(prob, "add_variable") else pulp.LpVariable  # PuLP 4 API when present
    n = [var(f"n{g}", lowBound=len(groups[g]), upBound=num_blocks, cat="Integer") for g in range(G)]
    if allow_recompute:
        r = [var(f"r{g}", lowBound=0, upBound=num_blocks, cat="Integer") for g in range(G)]
    else:
        r = [0] * G
    prob += pulp.lpSum(n) == num_blocks
    if allow_recompute:
        for g in range(G):
            prob += (r[g] == n[g]) if recompute_all else (r[g] <= n[g])

    def gsum(g: int, attr: str) -> float:
        return sum(getattr(chunks[c], attr) for c in groups[g])

    ch = chunks[0]  # per-block coefficients are the same in every chunk
    # y[g] = 1 where device g (group g: its chunks) recomputes a block (r > 0): it then holds
    # the re-materialisation buffer, and device 0 recomputes the parts before the blocks too
    # (ChunkModel.pre_rec_s, ChunkMemory.pre_recompute_saved)
    y = {}
    if allow_recompute:
        for g in range(G):
            if any(chunks[c].memory.rebuilds_blocks for c in groups[g]):
                y[g] = var(f"y{g}", cat="Binary")
                prob += r[g] <= num_blocks * y[g]
                prob += y[g] <= r[g]  # and only there
    f = [gsum(g, "f0") + ch.f_blk * n[g] for g in range(G)]
    b = [gsum(g, "b0") + ch.b_blk * n[g] + ch.r_blk * r[g] + (gsum(g, "pre_rec_s") * y[g] if g in y else 0.0)
         for g in range(G)]
    s = [ch_.send_s for ch_ in chunks]
    sends = [sum(s[c] + (s[c - 1] if c else 0.0) for c in groups[g]) for g in range(G)]
    device_groups = [[d] for d in range(p)]
    M = var("M")
    Z = var("Z")
    if schedule == "interleaved":
        W = var("W")
        for gs in device_groups:
            prob += M >= pulp.lpSum(f[g] + b[g] + sends[g] for g in gs)
            prob += W >= pulp.lpSum(f[g] + b[g] for g in gs)
        t_pipe = m * M + (p - 1) / v * W + 2.0 * sum(s[: p - 1])
    else:
        for g in range(G):
            prob += M >= f[g] + b[g] + sends[g]
        t_pipe = pulp.lpSum(f) + pulp.lpSum(b) + 2.0 * sum(s) + (m - 1) * M
    for gs in device_groups:
        opt = pulp.lpSum(gsum(g, "opt0") + ch.opt_blk * n[g] for g in gs)
        dp = pulp.lpSum(gsum(g, "dp_s0") + ch.dp_s_blk * n[g] for g in gs)
        if all(chunks[c].dp_overlappable for g in gs for c in groups[g]):
            prob += Z >= dp - pulp.lpSum(b[g] for g in gs) + opt
            prob += Z >= opt
        else:
            prob += Z >= dp + opt
        mem = pulp.lpSum(
            sum(chunks[c].memory.const() for c in groups[g])
            + chunks[groups[g][0]].memory.per_block() * n[g]
            - chunks[groups[g][0]].memory.saved_by_recompute() * r[g]
            for g in gs
        )
        for g in gs:
            if g in y:
                rec_buffer = sum(chunks[c].memory.recompute_buffer - chunks[c].memory.pre_recompute_saved
                                 for c in groups[g])
                mem = mem + rec_buffer * y[g]
        prob += mem <= capacity_bytes
    prob += t_pipe + Z
    if cutoff is not None:
        prob += t_pipe + Z <= cutoff
    try:
        prob.solve(_solver())
    except IndexError:
        # pulp's HiGHS interface reads row values HiGHS did not return when presolve finds the
        # problem infeasible on huge coefficients (an 8M-token sequence's memory): no partition
        return None
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return None
    counts = [int(round(x.value())) for x in n]
    recs = [int(round(x.value())) for x in r] if allow_recompute else [0] * G
    blocks, rec = [0] * C, [0] * C
    for g, cs in enumerate(groups):
        v = len(cs)
        even = [counts[g] // v + (1 if j < counts[g] % v else 0) for j in range(v)]
        for c, (nb, nr) in zip(cs, spread(even, recs[g]), strict=True):
            blocks[c], rec[c] = nb, nr
    return Partition(tuple(blocks), tuple(rec), float(pulp.value(prob.objective)))


def partition_for(cm, cand, cap: float, cutoff: float | None = None) -> Partition | None:
    """`solve_partition` for one search candidate (smplan.planner.search_space.Candidate) with
    the CostModel `cm`'s chunk coefficients: None when nothing fits (or nothing beats `cutoff`)."""
    from .bounds import mesh_key_of

    key = mesh_key_of(cand)
    chunks = [cm.chunk(key, c, cand.kind) for c in range(cand.pp * cand.v)]
    return solve_partition(chunks, cm.profile.num_blocks, cand.m, cand.pp, cand.v, cand.schedule, cap,
                           allow_recompute=cand.kind != "none", recompute_all=cand.recompute_all, cutoff=cutoff)


def spread(sizes: list[int], recomputed: int) -> list[tuple[int, int]]:
    """(blocks, recomputed blocks) per chunk of one device: `recomputed` as evenly as the
    chunks of `sizes` hold them (never more on one chunk than it has, none left over)."""
    out, left = [], recomputed
    for j, size in enumerate(sizes):
        take = max(min(size, -(-left // (len(sizes) - j))), left - sum(sizes[j + 1:]))
        out.append((size, take))
        left -= take
    return out
