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


def implausible_values(name_or_path: str, overrides: dict[str, object] | None = None) -> list[str]:
    """One warning line per value of the profile, or of its `--hw-set` overrides (dotted keys),
    that is likely in the wrong unit."""
    stated = _flat(read_profile(name_or_path))
    given = {key: value for key, value in (overrides or {}).items() if key in _CHECKED or ".peak_tflops." in key}
    values = {**stated, **given}
    on_gpu = values.get("gpu.name") != PROBED_CPU_NAME
    found: list[tuple[str, float, str]] = []
    for key, value in values.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if key.startswith("gpu.peak_tflops."):
            dtype = key.rsplit(".", 1)[1]
            if value > MAX_PEAK_TFLOPS:
                found.append((key, value, "TFLOP/s (divide a FLOP/s figure by 1e12)"))
            elif on_gpu and dtype in ("bf16", "fp16") and 0 < value < MIN_GPU_HALF_TFLOPS:
                found.append((key, value, "TFLOP/s (multiply a PFLOP/s figure by 1000)"))
        elif key == "gpu.memory_gib" and value > MAX_MEMORY_GIB:
            found.append((key, value, "GiB per GPU (not MB, nor the whole node)"))
        elif key == "gpu.memory_bandwidth_gbps" and (
                value > MAX_BANDWIDTH_GBPS or (on_gpu and value < MIN_GPU_MEMORY_BANDWIDTH_GBPS)):
            found.append((key, value, "GB/s (multiply a TB/s figure by 1000)"))
        elif key in ("intra_node.bandwidth_gbps", "inter_node.bandwidth_gbps") and value > MAX_BANDWIDTH_GBPS:
            found.append((key, value, "GB/s per GPU and direction (divide a bit/s figure by 8e9)"))
    return [f"warning: {'--hw-set' if key in given else name_or_path}: {key} = {value:g} looks like another unit; "
            f"it is read in {unit}" for key, value, unit in found]


# the keys checked above besides the peaks (and gpu.name, which tells a probed CPU profile)
_CHECKED = ("gpu.name", "gpu.memory_gib", "gpu.memory_bandwidth_gbps", "intra_node.bandwidth_gbps",
            "inter_node.bandwidth_gbps")


def _flat(data: dict, prefix: str = "") -> dict[str, object]:
    """{"gpu": {"memory_gib": 80}} -> {"gpu.memory_gib": 80}; read before validation, so any shape."""
    flat: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
