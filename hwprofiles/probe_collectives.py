"""Collective timings across N local processes for `smplan hw probe`, and their fits.

Ring alpha-beta forms (Thakur, Rabenseifner, Gropp 2005), the same as smplan.hwprofiles.perf:
all-reduce t = 2(n-1)*alpha + 2(n-1)/n * B / bw, all-gather t = (n-1)*alpha + (n-1)/n * B / bw,
send/recv t = alpha + B / bw. gloo on CPU, nccl on GPU.
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import time
from dataclasses import dataclass

import numpy as np

DEFAULT_MESSAGE_BYTES = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "send_recv")
# (bandwidth term multiplier, latency term multiplier) of each kind, ring alpha-beta
# (Thakur, Rabenseifner, Gropp 2005); the same forms as smplan.hwprofiles.perf._ring.
_ALPHA_BETA = {
    "all_reduce": (lambda n: 2.0 * (n - 1) / n, lambda n: 2.0 * (n - 1)),
    "all_gather": (lambda n: (n - 1) / n, lambda n: float(n - 1)),
    "send_recv": (lambda n: 1.0, lambda n: 1.0),
}
# No fit of a link is believed above this: NVLink 5, the fastest GPU link, moves 1.8 TB/s per GPU
# (NVIDIA GB200 NVL72 datasheet); twice that is beyond physical sense for any local probe.
MAX_LINK_GBPS = 3600.0
# What a worker records for a collective that added no time to the GEMM before it (noise won).
MEASURED_FLOOR_S = 1e-7
# Relative margin of the floor test: a float32 round trip moves the floor by 1.2e-8 relative (bfloat16 by
# at most 0.4%); a real timing within 1 ns of 0.1 us is noise anyway, far below any link's step.
FLOOR_RTOL = 0.01
# The least per-step latency a fit writes: NCCL's cost model gives a ring step over NVLink, the fastest
# local link, 0.47 us with its LL protocol (NVIDIA/nccl src/graph/tuning.cc, hwLat[NVLINK][RING][LL]
# of the 2.x tables; later releases give 0.6); less is noise.
MIN_STEP_LATENCY_US = 0.47


class ProbeError(ValueError):
    """A measurement could not finish (a worker died or hung, too many processes asked for);
    the message says what happened and what to try. A ValueError: the CLI prints one line."""


def check_nproc(nproc: int) -> None:
    """On GPU each process needs its own device; reject more before spawning any."""
    import torch

    if nproc < 1:
        raise ProbeError(f"--nproc-per-node must be at least 1, got {nproc}")
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ProbeError(f"--nproc-per-node {nproc} needs {nproc} GPUs but this machine has {count}; use --nproc-per-node {count} or fewer")


def fit_alpha_beta(times_s: dict[int, float], nproc: int, kind: str = "all_reduce",
                   max_gbps: float = MAX_LINK_GBPS) -> tuple[float, float]:
    """(bandwidth GB/s, latency us) of the ring alpha-beta form of `kind` (see the module doc);
    `robust_alpha_beta` says, besides, whether the timings were too noisy for the fit."""
    fit = robust_alpha_beta(times_s, nproc, kind, max_gbps)
    return fit.bandwidth_gbps, fit.latency_us


@dataclass(frozen=True)
class AlphaBetaFit:
    bandwidth_gbps: float
    latency_us: float
    noisy: bool  # the least-squares fit made no physical sense: these come from the extreme messages
    latency_assumed: bool = False  # no timing resolved it: MIN_STEP_LATENCY_US stands in
    bandwidth_assumed: bool = False  # every timing at the floor: the ceiling (max_gbps) stands in


def robust_alpha_beta(times_s: dict[int, float], nproc: int, kind: str = "all_reduce",
                      max_gbps: float = MAX_LINK_GBPS) -> AlphaBetaFit:
    """The alpha-beta fit of `kind`, or where the timings cannot carry one the robust estimate,
    flagged `noisy`: bandwidth from the largest message's time, latency from the smallest's
    less its bandwidth term (`fallback_latency_us`). They cannot where a fit makes no physical
    sense (a slope of zero or less, a latency below MIN_STEP_LATENCY_US, a bandwidth above
    `max_gbps`: timings on a loaded machine once fitted 5.2 PB/s and 0 us) or a time sits at
    the worker's floor (lost in the GEMM's noise; `is_measured`).

    Weighted by 1/t (relative error): an unweighted fit lets the 16 MiB point set the
    intercept, and a few hundred microseconds of its noise then read as latency.
    """
    beta_mult, alpha_mult = (f(nproc) for f in _ALPHA_BETA[kind])
    sizes = np.array(sorted(times_s), dtype=float)
    t = np.array([times_s[int(b)] for b in sizes], dtype=float)
    measured = is_measured(t)
    if measured.all():
        x, w = beta_mult * sizes, 1.0 / t
        slope, intercept = np.linalg.lstsq(np.stack([x * w, w], axis=1), np.ones_like(t), rcond=None)[0]
        latency_us = float(intercept / alpha_mult * 1e6)
        if slope > 0 and latency_us >= MIN_STEP_LATENCY_US and 1.0 / slope / 1e9 <= max_gbps:
            return AlphaBetaFit(float(1.0 / slope / 1e9), latency_us, noisy=False)
    if not measured.any():  # nothing measured: the ceiling and the fastest link's step, said as such
        return AlphaBetaFit(max_gbps, MIN_STEP_LATENCY_US, noisy=True, latency_assumed=True, bandwidth_assumed=True)
    sizes, t = sizes[measured], t[measured]
    x = beta_mult * sizes
    bandwidth_gbps = min(float(x[-1] / t[-1]) / 1e9, max_gbps)
    latency_us = fallback_latency_us(float(t[0]), float(x[0]) / (bandwidth_gbps * 1e9), alpha_mult)
    return AlphaBetaFit(bandwidth_gbps, latency_us, noisy=True, latency_assumed=latency_us <= MIN_STEP_LATENCY_US)


def is_measured(times_s: np.ndarray) -> np.ndarray:
    """Which timings were measured, not the worker's floor (send_recv's half floor included); the
    floor is matched with a margin (FLOOR_RTOL), as a float32 round trip reads it 1.0000000116860974e-07."""
    return times_s > MEASURED_FLOOR_S * (1.0 + FLOOR_RTOL)


def fallback_latency_us(smallest_time_s: float, bandwidth_term_s: float, alpha_mult: float) -> float:
    """Per-step latency from the smallest measured message: its time less its bandwidth term, at
    least MIN_STEP_LATENCY_US. Where the bandwidth term takes all of its time (a message too large
    to show the latency, timed faster per byte than the largest), the timings bound the latency only
    by that message's whole time (a 4 MiB send once gave 3601 us), while the smaller messages, lost
    in the noise, show it is far less: the fastest link's step is the estimate that they allow."""
    return max((smallest_time_s - bandwidth_term_s) / alpha_mult * 1e6, MIN_STEP_LATENCY_US)


def noisy_fit_warning(kinds, latency_assumed=(), bandwidth_assumed=()) -> str:
    """The one line `hw probe` prints when some collective's timings were too noisy to fit; it
    names the figures no timing resolved, which the profile then assumes."""
    assumed = ""
    if bandwidth_assumed:
        assumed += (f"; no {', '.join(bandwidth_assumed)} timing rose above the noise, so its bandwidth is the "
                    f"ceiling: this machine's memory-copy rate, at most {MAX_LINK_GBPS:,.0f} GB/s")
    if latency_assumed:
        assumed += (f"; the {', '.join(latency_assumed)} latency was not resolved, so it is NVLink's "
                    f"{MIN_STEP_LATENCY_US:g} us a step (set the link's latency_us with --hw-set if you know it)")
    return (f"warning: the {', '.join(kinds)} timings were noisy (no alpha-beta fit of them makes physical sense), "
            "so the profile takes the bandwidth from the largest message and the latency from the smallest"
            f"{assumed}; re-probe on an idle machine for a proper fit")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collective_op(kind: str, buf, rank: int, world: int):
    import torch
    import torch.distributed as dist

    if kind == "all_reduce":
        return lambda: dist.all_reduce(buf)
    if kind == "all_gather":
        chunk = buf[: max(1, buf.numel() // world)]  # the output (buf) holds every rank's chunk
        out = [torch.empty_like(chunk) for _ in range(world)]
        return lambda: dist.all_gather(out, chunk)
    peer = rank ^ 1  # ranks pair up 0-1, 2-3, ...; an odd last rank sits out

    def send_recv():
        if peer >= world:
            return
        if rank % 2 == 0:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)

    return send_recv


def _best_per_call(fn, sync, count: int, repeats: int, barrier) -> float:
    """Best of `repeats` of `count` back-to-back calls, seconds per call (a busy core only adds time)."""
    best = float("inf")
    for _ in range(repeats):
        barrier()
        start = time.perf_counter()
        for _ in range(count):
            fn()
        sync()
        best = min(best, (time.perf_counter() - start) / count)
    return best


def _collective_worker(rank: int, world: int, port: int, sizes: tuple[int, ...], queue,
                       repeats: int = 3, min_time_s: float = 0.03) -> None:
    """Time each collective the way training issues it: after a burst of compute.

    Back-to-back collectives keep every rank hot and in step; in training each one follows
    a layer's GEMMs, which evict the buffers from cache and let ranks drift apart, and on a
    CPU the waiting rank must be woken. Measured on a 2-core VM with gloo: a 256 KiB
    all-reduce took 0.4 ms back to back but added 1.3 ms after a 1.6 ms GEMM. So each call
    is timed as (GEMM + collective) - (GEMM alone).
    """
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        device = "cuda" if backend == "nccl" else "cpu"
        sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
        # a layer-sized GEMM (b*s=512 tokens, hidden 256 -> 1024): ~1.5 ms on one CPU core
        a = torch.randn(512, 256, device=device)
        w = torch.randn(256, 1024, device=device)

        def compute():
            torch.mm(a, w)

        results: dict[str, dict[int, float]] = {k: {} for k in COLLECTIVE_KINDS}
        compute_s = _best_per_call(compute, sync, 20, repeats, dist.barrier)
        for kind in COLLECTIVE_KINDS:
            for size in sizes:
                buf = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
                op = _collective_op(kind, buf, rank, world)

                def step(op=op):
                    compute()
                    op()

                step()
                sync()
                # Every rank must run the same number of calls: agree on it from one timing.
                dist.barrier()
                start = time.perf_counter()
                step()
                sync()
                once = torch.tensor([time.perf_counter() - start])
                dist.all_reduce(once, op=dist.ReduceOp.MAX)
                count = max(2, min(300, int(min_time_s / max(once.item(), 1e-6))))
                both_s = _best_per_call(step, sync, count, repeats, dist.barrier)
                # float64: a float32 tensor reads the floor back as 1.0000000116860974e-07, above MEASURED_FLOOR_S
                one = torch.tensor([max(both_s - compute_s, MEASURED_FLOOR_S)], dtype=torch.float64)
                dist.all_reduce(one, op=dist.ReduceOp.MAX)  # a collective is as slow as its slowest rank
                results[kind][size] = one.item()
                if kind == "send_recv":
                    results[kind][size] /= 2.0  # one round trip is two messages
            if rank == 0:
                queue.put(("progress", kind))
        if rank == 0:
            queue.put(("done", results))
    finally:
        dist.destroy_process_group()


def collect(procs, q, expected: int, timeout_s: float, what: str, progress=None) -> list:
    """The values of `expected` ("done", value) messages the worker `procs` put on `q`; other
    messages are progress ticks. A worker that dies or a deadline that passes is one
    ProbeError; the workers are always reaped (joined, killed if they hang on)."""
    done, deadline = [], time.monotonic() + timeout_s
    try:
        while len(done) < expected:
            try:
                kind, value = q.get(timeout=1.0)
            except queue_mod.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise ProbeError(
                        f"{what}: worker {procs.index(dead[0])} of {len(procs)} exited with code "
                        f"{dead[0].exitcode} (out of memory?); run again with fewer processes (--nproc-per-node) or on an "
                        "idle machine") from None
                if time.monotonic() > deadline:
                    raise ProbeError(
                        f"{what}: no result from {len(procs)} processes within {timeout_s:.0f} s (a worker hung); "
                        "run again with fewer processes (--nproc-per-node) or on an idle machine") from None
                continue
            if kind == "done":
                done.append(value)
            elif progress:
                progress()
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return done


def measure_collectives(nproc: int, sizes=DEFAULT_MESSAGE_BYTES, timeout_s: float = 180.0,
                        progress=None) -> dict[str, dict[int, float]]:
    """Seconds per collective, by kind and message bytes, across `nproc` local processes.

    A worker that dies (or hangs) is killed and reported; no process outlives the call.
    """
    import multiprocessing as mp

    check_nproc(nproc)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_collective_worker, args=(r, nproc, port, tuple(sizes), q), daemon=True)
             for r in range(nproc)]  # daemon: they die with the caller
    for p in procs:
        p.start()
    return collect(procs, q, 1, timeout_s, "collective probe", progress)[0]

