"""Measure the local machine and describe it as a hardware profile (`smplan hw probe`).

Each measurement is fitted to the same formula the performance model uses, so the
profile predicts what was measured:
- GEMMs: achieved FLOP/s f(d) = P * d / (d + h) in the square size d (the saturating curve
  of `perf.matmul_efficiency`), P per dtype and one h, fitted robustly in log space.
- HBM: a large copy reads and writes every byte once (STREAM "copy", McCalpin 1995).
- Collectives: ring alpha-beta (Thakur et al. 2005), fitted over message sizes across
  `nproc` local processes: all-reduce t = 2(n-1)*alpha + 2(n-1)/n * B / bw, all-gather
  t = (n-1)*alpha + (n-1)/n * B / bw, send/recv t = alpha + B / bw. The profile's link is
  the all-reduce fit (what tensor and data parallelism issue); the others are reported.
  Each collective is timed after a GEMM, as training issues it (see `_collective_worker`).
- On CPU a "GPU" is one process: GEMMs run on cores / nproc threads, as each executor
  worker does (OMP_NUM_THREADS), so the peak is per process.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

DEFAULT_SIZES = (64, 128, 256, 512, 1024)
DEFAULT_MESSAGE_BYTES = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "send_recv")
# (bandwidth term multiplier, latency term multiplier) of each kind, ring alpha-beta
# (Thakur, Rabenseifner, Gropp 2005); the same forms as hwprofiles.perf._ring.
_ALPHA_BETA = {
    "all_reduce": (lambda n: 2.0 * (n - 1) / n, lambda n: 2.0 * (n - 1)),
    "all_gather": (lambda n: (n - 1) / n, lambda n: float(n - 1)),
    "send_recv": (lambda n: 1.0, lambda n: 1.0),
}


@dataclass
class ProbeResult:
    device: str
    nproc: int
    matmul_tflops: dict[str, dict[int, float]] = field(default_factory=dict)  # dtype -> size -> TFLOP/s
    peak_tflops: dict[str, float] = field(default_factory=dict)
    matmul_half_dim: float = 0.0
    memory_bandwidth_gbps: float = 0.0
    memory_gib: float = 0.0
    allreduce_s: dict[int, float] = field(default_factory=dict)  # bytes -> seconds
    link_bandwidth_gbps: float = 0.0
    link_latency_us: float = 0.0
    collectives_s: dict[str, dict[int, float]] = field(default_factory=dict)  # kind -> bytes -> seconds
    collective_fits: dict[str, tuple[float, float]] = field(default_factory=dict)  # kind -> (GB/s, us)
    threads_per_process: int = 1


def _timeit(fn: Callable[[], None], sync: Callable[[], None], min_time_s: float = 0.05, repeats: int = 3) -> float:
    """Best-of-`repeats` seconds per call, each repeat running for at least `min_time_s`."""
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= min_time_s:
                break
        best = min(best, elapsed / calls)
    return best


def _device_and_sync():
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.cuda.synchronize
    return "cpu", lambda: None


def measure_matmul(sizes=DEFAULT_SIZES, dtypes=("fp32", "bf16"), progress=None) -> dict[str, dict[int, float]]:
    import torch

    device, sync = _device_and_sync()
    torch_dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    out: dict[str, dict[int, float]] = {}
    for dtype in dtypes:
        out[dtype] = {}
        for d in sizes:
            a = torch.randn(d, d, device=device, dtype=torch_dtypes[dtype])
            b = torch.randn(d, d, device=device, dtype=torch_dtypes[dtype])
            seconds = _timeit(lambda a=a, b=b: torch.mm(a, b), sync)
            out[dtype][d] = 2.0 * d**3 / seconds / 1e12
            if progress:
                progress()
    return out


def fit_saturating(curves: dict[str, dict[int, float]]) -> tuple[dict[str, float], float]:
    """Peaks P per dtype and one shared half-size h of f(d) = P*d/(d+h).

    Fitted in log space with a median loss over a grid of h: one slow outlier (a busy
    core) must not drag the curve, which a plain least-squares fit on 1/f lets it do.
    """
    best = (float("inf"), {}, 0.0)
    for h in np.concatenate([[0.0], np.geomspace(1.0, 8192.0, 200)]):
        peaks, residuals = {}, []
        for dtype, points in curves.items():
            d = np.array(sorted(points), dtype=float)
            f = np.array([points[int(x)] for x in d])
            shape = d / (d + h)
            peaks[dtype] = float(np.median(f / shape))
            residuals.extend(np.abs(np.log(f) - np.log(peaks[dtype] * shape)))
        loss = float(np.median(residuals))
        if loss < best[0]:
            best = (loss, peaks, float(h))
    return best[1], best[2]


def measure_memory_bandwidth_gbps(megabytes: int = 256) -> float:
    import torch

    device, sync = _device_and_sync()
    n = megabytes * (1 << 20) // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = _timeit(lambda: dst.copy_(src), sync)
    return 2.0 * src.numel() * 4 / seconds / 1e9


def fit_alpha_beta(times_s: dict[int, float], nproc: int, kind: str = "all_reduce") -> tuple[float, float]:
    """(bandwidth GB/s, latency us) of the ring alpha-beta form of `kind` (see the module doc).

    Weighted by 1/t (relative error): an unweighted fit lets the 16 MiB point set the
    intercept, and a few hundred microseconds of its noise then read as latency.
    """
    beta_mult, alpha_mult = (f(nproc) for f in _ALPHA_BETA[kind])
    sizes = np.array(sorted(times_s), dtype=float)
    t = np.array([times_s[int(b)] for b in sizes])
    x = beta_mult * sizes
    w = 1.0 / t
    slope, intercept = np.linalg.lstsq(np.stack([x * w, w], axis=1), np.ones_like(t), rcond=None)[0]
    if slope <= 0:  # noise hid the bandwidth term: take the largest message's rate
        slope = float(t[-1] / x[-1])
    bandwidth_gbps = 1.0 / slope / 1e9
    latency_us = max(float(intercept), 0.0) / alpha_mult * 1e6
    return float(bandwidth_gbps), float(latency_us)


def fit_ring_allreduce(times_s: dict[int, float], nproc: int) -> tuple[float, float]:
    """(bandwidth GB/s, latency us) of t = 2(n-1)*alpha + 2(n-1)/n * B / bw."""
    return fit_alpha_beta(times_s, nproc, "all_reduce")


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
                one = torch.tensor([max(both_s - compute_s, 1e-7)])
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


def measure_collectives(nproc: int, sizes=DEFAULT_MESSAGE_BYTES, timeout_s: float = 180.0,
                        progress=None) -> dict[str, dict[int, float]]:
    """Seconds per collective, by kind and message bytes, across `nproc` local processes.

    A worker that dies (or hangs) is killed and reported; no process outlives the call.
    """
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_collective_worker, args=(r, nproc, port, tuple(sizes), q)) for r in range(nproc)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                what, value = q.get(timeout=1.0)
            except queue_mod.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"collective probe: a worker exited with code {dead[0].exitcode}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"collective probe took longer than {timeout_s:.0f} s") from None
                continue
            if what == "done":
                result = value
                break
            if progress:
                progress()
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return result


def measure_allreduce(nproc: int, sizes=DEFAULT_MESSAGE_BYTES, timeout_s: float = 120.0) -> dict[int, float]:
    """Seconds per all-reduce by message bytes across `nproc` local processes."""
    return measure_collectives(nproc, sizes, timeout_s)["all_reduce"]


def probe_dtypes(device: str) -> tuple[str, ...]:
    return ("fp32", "bf16") if device == "cpu" else ("fp32", "bf16", "fp16")


def progress_steps(sizes=DEFAULT_SIZES, nproc: int = 2) -> int:
    """How many times `probe` calls `progress` (for a progress bar's length)."""
    dtypes = probe_dtypes(_device_and_sync()[0])
    return len(dtypes) * len(sizes) + 1 + (len(COLLECTIVE_KINDS) if nproc > 1 else 1)


def probe(nproc: int = 2, sizes=DEFAULT_SIZES, message_bytes=DEFAULT_MESSAGE_BYTES, progress=None) -> ProbeResult:
    import torch

    device, _ = _device_and_sync()
    result = ProbeResult(device=device, nproc=nproc)
    dtypes = probe_dtypes(device)
    saved_threads = torch.get_num_threads()
    if device == "cpu":
        # what each executor worker gets (executor.launch passes OMP_NUM_THREADS, default 1)
        result.threads_per_process = int(os.environ.get("OMP_NUM_THREADS", "1"))
        torch.set_num_threads(result.threads_per_process)
    try:
        result.matmul_tflops = measure_matmul(sizes, dtypes, progress)
        result.peak_tflops, result.matmul_half_dim = fit_saturating(result.matmul_tflops)
        result.memory_bandwidth_gbps = measure_memory_bandwidth_gbps()
    finally:
        torch.set_num_threads(saved_threads)
    if progress:
        progress()
    if device == "cuda":
        result.memory_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        result.memory_gib = total / 2**30 / nproc
    if nproc > 1:
        result.collectives_s = measure_collectives(nproc, message_bytes, progress=progress)
        result.collective_fits = {k: fit_alpha_beta(t, nproc, k) for k, t in result.collectives_s.items()}
        result.allreduce_s = result.collectives_s["all_reduce"]
        result.link_bandwidth_gbps, result.link_latency_us = result.collective_fits["all_reduce"]
    else:
        result.link_bandwidth_gbps, result.link_latency_us = result.memory_bandwidth_gbps, 1.0
        if progress:
            progress()
    return result


def to_toml(result: ProbeResult, name: str = "local") -> str:
    """The probe as a profile in the bundled profiles' format (loads through `--hw PATH`)."""
    peak = result.peak_tflops
    bf16 = peak.get("bf16", peak["fp32"])
    fp16 = peak.get("fp16", bf16)
    lines = [
        f"# Measured by `smplan hw probe` on {time.strftime('%Y-%m-%d')} ({result.device}, {result.nproc} processes).",
        "# GEMM peak and half-size: log-space median fit of f(d) = P*d/(d+h) to square matmuls",
        f"# ({result.threads_per_process} thread(s) per process on CPU); memory bandwidth: STREAM-style copy;",
        "# link: ring all-reduce alpha-beta fit (weighted by 1/t). Other collectives, same fit:",
        *(f"#   {kind}: {gbps:.4g} GB/s, {us:.1f} us" for kind, (gbps, us) in result.collective_fits.items()),
        f'name = "{name}"',
        f'description = "probed {result.device} machine, {result.nproc} processes"',
        "nodes = 1",
        f"gpus_per_node = {result.nproc}",
        "",
        "[gpu]",
        f'name = "{result.device}"',
        f"memory_gib = {result.memory_gib:.3f}                # {'device memory' if result.device == 'cuda' else 'RAM / processes'}",
        f"memory_bandwidth_gbps = {result.memory_bandwidth_gbps:.3f}   # measured copy bandwidth",
        "",
        "[gpu.peak_tflops]                # fitted P of the GEMM curve, per dtype",
        f"bf16 = {bf16:.6f}",
        f"fp16 = {fp16:.6f}",
        f"tf32 = {peak['fp32']:.6f}",
        f"fp32 = {peak['fp32']:.6f}",
        "fp8 = 0.0",
        "",
        "[intra_node]",
        f"bandwidth_gbps = {result.link_bandwidth_gbps:.4f}       # all-reduce fit across local processes",
        f"latency_us = {result.link_latency_us:.3f}",
        "",
        "[inter_node]                     # single machine: no inter-node link was measured",
        f"bandwidth_gbps = {result.link_bandwidth_gbps:.4f}",
        f"latency_us = {result.link_latency_us:.3f}",
        "",
        "[reliability]                    # not measurable by a probe: Llama 3 paper per-GPU figure",
        "gpu_mtbf_hours = 50000.0",
        "restart_minutes = 1.0",
        "",
        "[cost]",
        "usd_per_gpu_hour = 0.0",
        'source = "local machine"',
        "",
        "[efficiency]                     # the fit puts the curve in the peak and half-size",
        "matmul_max = 1.0",
        f"matmul_half_dim = {result.matmul_half_dim:.3f}",
        "memory_bound = 1.0",
        "network = 1.0",
        *_eager_fusion_line(),
        "",
    ]
    return "\n".join(lines)


def _eager_fusion_line() -> list[str]:
    """`smplan execute` runs eager PyTorch: no element-wise op is fused into another, so
    none of the fusible traffic stays on chip (Efficiency.elementwise_fusion = 0 is eager)."""
    import dataclasses

    from .cluster import Efficiency

    if "elementwise_fusion" not in {f.name for f in dataclasses.fields(Efficiency)}:
        return []
    return ["elementwise_fusion = 0.0         # eager PyTorch (the executor): nothing fused"]
