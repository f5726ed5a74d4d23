"""Values a hand-written hardware profile most likely states in the wrong unit.

Validation (profile_file.py) refuses what cannot be a value at all (a string, a negative
number); a number of the wrong unit passes it and predicts nonsense (a bf16 peak of 756e12,
FLOP/s for TFLOP/s, gave 1.7 s steps at 0.0% MFU). The bounds below lie far outside any
accelerator of 2026, so a value past them is named in a warning; nothing is refused.
"""

from __future__ import annotations

from .cluster import PROBED_CPU_NAME
from .loader import read_profile

# The largest 2026 datasheet figures, with headroom: GB300 / B300 dense FP4 15,000 TFLOP/s, 288 GB of
# HBM3e at 8 TB/s (NVIDIA Blackwell Ultra datasheet, 2025); NVLink 5 900 GB/s per direction per GPU.
MAX_PEAK_TFLOPS = 100_000.0
MAX_MEMORY_GIB = 4_096.0
MAX_BANDWIDTH_GBPS = 100_000.0
# The smallest GPU figures, with headroom: NVIDIA T4, 65 fp16 TFLOP/s on 320 GB/s (T4 datasheet, 2018).
# A probed CPU profile (gpu.name "cpu") measures far less and is not held to them.
MIN_GPU_HALF_TFLOPS = 1.0
MIN_GPU_MEMORY_BANDWIDTH_GBPS = 50.0


def implausible_values(name_or_path: str) -> list[str]:
    """One warning line per value of the profile that is likely in the wrong unit."""
    data = read_profile(name_or_path)
    gpu = data.get("gpu", {}) if isinstance(data.get("gpu"), dict) else {}
    on_gpu = gpu.get("name") != PROBED_CPU_NAME
    found: list[tuple[str, float, str]] = []

    def number(value) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    peaks = gpu.get("peak_tflops", {}) if isinstance(gpu.get("peak_tflops"), dict) else {}
    for dtype, value in peaks.items():
        if number(value) and value > MAX_PEAK_TFLOPS:
            found.append((f"gpu.peak_tflops.{dtype}", value, "TFLOP/s (divide a FLOP/s figure by 1e12)"))
        elif number(value) and on_gpu and dtype in ("bf16", "fp16") and 0 < value < MIN_GPU_HALF_TFLOPS:
            found.append((f"gpu.peak_tflops.{dtype}", value, "TFLOP/s (multiply a PFLOP/s figure by 1000)"))
    memory, hbm = gpu.get("memory_gib"), gpu.get("memory_bandwidth_gbps")
    if number(memory) and memory > MAX_MEMORY_GIB:
        found.append(("gpu.memory_gib", memory, "GiB per GPU (not MB, nor the whole node)"))
    if number(hbm) and (hbm > MAX_BANDWIDTH_GBPS or (on_gpu and hbm < MIN_GPU_MEMORY_BANDWIDTH_GBPS)):
        found.append(("gpu.memory_bandwidth_gbps", hbm, "GB/s (multiply a TB/s figure by 1000)"))
    for link in ("intra_node", "inter_node"):
        value = data.get(link, {}).get("bandwidth_gbps") if isinstance(data.get(link), dict) else None
        if number(value) and value > MAX_BANDWIDTH_GBPS:
            found.append((f"{link}.bandwidth_gbps", value, "GB/s per GPU and direction (divide a bit/s figure by 8e9)"))
    return [f"warning: {name_or_path}: {key} = {value:g} looks like another unit; it is read in {unit}"
            for key, value, unit in found]
