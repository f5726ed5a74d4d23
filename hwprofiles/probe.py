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
  Timings no fit of which makes physical sense (a loaded machine) give a robust estimate
  instead and one warning line (`probe_collectives.robust_alpha_beta`).
  Each collective is timed after a GEMM, as training issues it (see `probe_collectives._collective_worker`).
- On CPU a "GPU" is one process: GEMMs run on OMP_NUM_THREADS threads (default 1), as
  each executor worker does, so the peak is per process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .probe_collectives import (  # noqa: F401  (fit_* re-exported: the probe's public fits)
    COLLECTIVE_KINDS,
    DEFAULT_MESSAGE_BYTES,
    MAX_LINK_GBPS,
    ProbeError,
    check_nproc,
    collect,
    fit_alpha_beta,
    measure_collectives,
    noisy_fit_warning,
    robust_alpha_beta,
)

DEFAULT_SIZES = (64, 128, 256, 512, 1024)
# measured RSS of a gloo worker (torch 2.13 CPU, 2-core VM): 0.22 GiB bare, 0.28 GiB with smplan.executor
CPU_MEMORY_RESERVE_GIB = 0.5


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
    sm_count: int = 0  # the GPU's multiprocessors (CUDA's multiProcessorCount); 0 on CPU
    warnings: list[str] = field(default_factory=list)  # one line each: what in the measurement is not to be trusted


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


def measure_matmul(sizes=DEFAULT_SIZES, dtypes=("fp32", "bf16"), progress=None,
                   before_each=None) -> dict[str, dict[int, float]]:
    """TFLOP/s of square GEMMs by dtype and size; `before_each()` runs before each point
    (a barrier, so that concurrent processes measure the same point at the same time)."""
    import torch

    device, sync = _device_and_sync()
    torch_dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    out: dict[str, dict[int, float]] = {}
    for dtype in dtypes:
        out[dtype] = {}
        for d in sizes:
            a = torch.randn(d, d, device=device, dtype=torch_dtypes[dtype])
            b = torch.randn(d, d, device=device, dtype=torch_dtypes[dtype])
            if before_each:
                before_each()
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


def probe_dtypes(device: str) -> tuple[str, ...]:
    return ("fp32", "bf16") if device == "cpu" else ("fp32", "bf16", "fp16")


def progress_steps(sizes=DEFAULT_SIZES, nproc: int = 2) -> int:
    """How many times `probe` calls `progress` (for a progress bar's length)."""
    dtypes = probe_dtypes(_device_and_sync()[0])
    return len(dtypes) * len(sizes) + 1 + (len(COLLECTIVE_KINDS) if nproc > 1 else 1)


def _warn_on_stderr(line: str) -> None:
    # on a terminal the progress bar holds the line: start a new one
    print(("\n" if sys.stderr.isatty() else "") + line, file=sys.stderr)


def fit_collectives(collectives_s: dict[str, dict[int, float]], nproc: int,
                    memory_bandwidth_gbps: float) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """(kind -> (GB/s, us), warnings) of the timings: the robust alpha-beta fit of each kind,
    and one warning line naming the kinds whose timings were too noisy to fit."""
    # every byte a collective moves between local processes is read from and written to memory,
    # which the copy bandwidth (STREAM counts both) bounds; NVLink is far below HBM too
    ceiling = min(MAX_LINK_GBPS, memory_bandwidth_gbps) if memory_bandwidth_gbps > 0 else MAX_LINK_GBPS
    fits = {kind: robust_alpha_beta(t, nproc, kind, ceiling) for kind, t in collectives_s.items()}
    noisy = [kind for kind, fit in fits.items() if fit.noisy]
    latency = [kind for kind, fit in fits.items() if fit.latency_assumed]
    bandwidth = [kind for kind, fit in fits.items() if fit.bandwidth_assumed]
    return ({kind: (fit.bandwidth_gbps, fit.latency_us) for kind, fit in fits.items()},
            [noisy_fit_warning(noisy, latency, bandwidth)] if noisy else [])


def probe(nproc: int = 2, sizes=DEFAULT_SIZES, message_bytes=DEFAULT_MESSAGE_BYTES, progress=None,
          warn: Callable[[str], None] = _warn_on_stderr) -> ProbeResult:
    """Measure this machine; each line of `result.warnings` also goes to `warn` (stderr)."""
    import torch

    check_nproc(nproc)
    device, _ = _device_and_sync()
    result = ProbeResult(device=device, nproc=nproc)
    dtypes = probe_dtypes(device)
    saved_threads = torch.get_num_threads()
    if device == "cpu":
        # what each executor worker gets (smplan.executor.launch passes OMP_NUM_THREADS, default 1)
        result.threads_per_process = int(os.environ.get("OMP_NUM_THREADS", "1"))
        torch.set_num_threads(result.threads_per_process)
    try:
        if device == "cpu" and nproc > 1:
            result.matmul_tflops, result.memory_bandwidth_gbps = measure_compute_concurrently(
                nproc, sizes, dtypes, result.threads_per_process, progress)
        else:
            result.matmul_tflops = measure_matmul(sizes, dtypes, progress)
            result.memory_bandwidth_gbps = measure_memory_bandwidth_gbps()
        result.peak_tflops, result.matmul_half_dim = fit_saturating(result.matmul_tflops)
    finally:
        torch.set_num_threads(saved_threads)
    if progress:
        progress()
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        result.memory_gib = props.total_memory / 2**30
        result.sm_count = props.multi_processor_count
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        result.memory_gib = total / 2**30 / nproc
    if nproc > 1:
        result.collectives_s = measure_collectives(nproc, message_bytes, progress=progress)
        result.collective_fits, noisy = fit_collectives(result.collectives_s, nproc, result.memory_bandwidth_gbps)
        result.warnings += noisy
        result.allreduce_s = result.collectives_s["all_reduce"]
        result.link_bandwidth_gbps, result.link_latency_us = result.collective_fits["all_reduce"]
    else:
        result.link_bandwidth_gbps, result.link_latency_us = result.memory_bandwidth_gbps, 1.0
        if progress:
            progress()
    for line in result.warnings:
        warn(line)
    return result


def _compute_worker(rank: int, sizes, dtypes, threads: int, barrier, queue) -> None:
    import torch

    torch.set_num_threads(threads)
    progress = (lambda: queue.put(("progress", None))) if rank == 0 else None
    wait = lambda: barrier.wait(timeout=120)  # noqa: E731  (a peer that died must not hang us)
    curves = measure_matmul(sizes, dtypes, progress, before_each=wait)
    wait()
    queue.put(("done", (curves, measure_memory_bandwidth_gbps())))


def measure_compute_concurrently(nproc: int, sizes, dtypes, threads: int, progress=None,
                                 timeout_s: float = 300.0) -> tuple[dict[str, dict[int, float]], float]:
    """GEMM curves and copy bandwidth per process while all `nproc` processes run at once.

    On CPU the "GPUs" of a run share the cores, caches and memory bus: one process alone
    sees more than each of `nproc` does in training, and with more processes than cores
    (4 on 2) about cores/nproc of it. Measured on a 2-core VM with 4 processes: 99 GFLOP/s
    and 6.8 GB/s each against 175 GFLOP/s and 13.3 GB/s alone; calibrating 4-process runs
    on the lone figures pushed memory_bound down to 0.15. Each point is the median over
    the processes.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(nproc)
    procs = [ctx.Process(target=_compute_worker, args=(r, tuple(sizes), tuple(dtypes), threads, barrier, q),
                         daemon=True) for r in range(nproc)]
    for proc in procs:
        proc.start()
    done = collect(procs, q, nproc, timeout_s, "compute probe", progress)
    curves = {dt: {d: float(np.median([c[dt][d] for c, _ in done])) for d in done[0][0][dt]} for dt in dtypes}
    return curves, float(np.median([bw for _, bw in done]))


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
        *(f"# {line}" for line in result.warnings),
        f"name = {json.dumps(name)}",  # a JSON string is a TOML basic string
        f'description = "probed {result.device} machine, {result.nproc} processes"',
        "nodes = 1",
        f"gpus_per_node = {result.nproc}",
        "",
        "[gpu]",
        f'name = "{result.device}"',
        f"memory_gib = {result.memory_gib:.3f}                # {'device memory' if result.device == 'cuda' else 'RAM / processes'}",
        f"memory_bandwidth_gbps = {result.memory_bandwidth_gbps:.3f}   # measured copy bandwidth",
        *([f"sm_count = {result.sm_count}                   # CUDA multiProcessorCount"] if result.sm_count else []),
        "",
        "[gpu.peak_tflops]                # fitted P of the GEMM curve, per dtype",
        f"bf16 = {bf16:.6f}",
        f"fp16 = {fp16:.6f}",
        f"tf32 = {peak['fp32']:.6f}",
        f"fp32 = {peak['fp32']:.6f}",
        "fp8 = 0.0",
        "",
        "[intra_node]",
        f"bandwidth_gbps = {result.link_bandwidth_gbps:.4f}       # "
        + ("all-reduce fit across local processes" if result.collective_fits
           else "not measured (one process): the memory bandwidth"),
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
        *_cpu_reserve_lines(result),
        "matmul_max = 1.0",
        f"matmul_half_dim = {result.matmul_half_dim:.3f}",
        "memory_bound = 1.0",
        "network = 1.0",
        "elementwise_fusion = 0.0         # eager PyTorch fuses no element-wise kernels",
        "tp_comm_overlap = 0.0            # smplan execute waits for its TP collectives",
        "ep_a2a_overlap = 0.0             # and for its expert all-to-alls",
        'ep_dispatcher = "all_to_all"     # which are torch.distributed all_to_all_single calls',
        'zero_granularity = "block"             # its ZeRO-1/2/3 is FSDP2, one collective per block',
        'cp_comm = "all_gather"           # its context parallelism all-gathers K/V before attention',
        'pp_send = "full"                 # its pipeline stages send their whole output',
        'sp_saved_input = "gathered"      # its sequence parallelism (DTensor) keeps gathered linear inputs',
        'cross_entropy = "traced"         # it runs the model file\'s loss as written',
        "",
    ]
    return "\n".join(lines)



def _cpu_reserve_lines(result: ProbeResult) -> list[str]:
    """A CPU profile's memory reserve (a GPU's keeps the profile default, 2 GiB for CUDA and NCCL)."""
    if result.device == "cuda":
        return []
    return [f"memory_reserve_gib = {CPU_MEMORY_RESERVE_GIB}         # torch + gloo per CPU worker: no CUDA context"]
