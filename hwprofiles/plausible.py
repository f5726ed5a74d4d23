"""Values a hand-written hardware profile most likely states in the wrong unit.

Validation (profile_file.py) refuses what cannot be a value at all (a string, a negative
number); a number of the wrong unit passes it and predicts nonsense (a bf16 peak of 756e12,
FLOP/s for TFLOP/s, gave 1.7 s steps at 0.0% MFU). The bounds below lie far outside any
accelerator of 2026, so a value past them is named in a warning; nothing is refused here
(cluster.py refuses what is past MAX_NUMBER, with the same hint: cluster.unit_fix).
"""

from __future__ import annotations

from .cluster import PROBED_CPU_NAME, PROBED_NAMES, unit_fix
from .loader import read_profile
from .stack import US_KEYS, us_unit_warning

# The largest 2026 datasheet figures, with headroom: GB300 / B300 dense FP4 15,000 TFLOP/s, 288 GB of
# HBM3e at 8 TB/s (NVIDIA Blackwell Ultra datasheet, 2025); NVLink 5 900 GB/s per direction per GPU.
MAX_PEAK_TFLOPS = 100_000.0
MAX_MEMORY_GIB = 4_096.0
MAX_BANDWIDTH_GBPS = 100_000.0
# The fastest NIC a GPU has to itself in 2026: 800 Gb/s = 100 GB/s per direction (NVIDIA ConnectX-8
# SuperNIC datasheet, 2025; one per GPU in B300 / GB300 nodes). A larger inter-node figure per GPU is
# most likely Gb/s, or a whole node's NICs.
MAX_NIC_GBPS_PER_GPU = 100.0
# 10 ns: below any GPU link's latency (one InfiniBand switch hop alone is ~130 ns port to port,
# NVIDIA Quantum HDR QM8700 datasheet); a positive figure under it is seconds typed as microseconds.
MIN_LINK_LATENCY_US = 0.01
# PCIe x16 per direction: 5.0 carries 64 GB/s, 6.0 128 GB/s (PCI-SIG PCIe 5.0 / 6.0 base specifications,
# 32 / 64 GT/s x 16 lanes / 8). A PCIe box (intra_node.fabric = "pcie") cannot pass more between its GPUs;
# an NVSwitch gives each GPU at least 150 GB/s (DGX-2, V100: 6 NVLink2 links of 25 GB/s, NVIDIA DGX-2
# datasheet), so a "switch" figure at PCIe 5.0's or below is a PCIe box that left fabric at its default.
MAX_PCIE_GBPS = 128.0
PCIE5_GBPS = 64.0
# 1 ms: far above any link's latency (Ethernet across a data centre is tens of microseconds); a figure
# past it is nanoseconds typed as microseconds.
MAX_LINK_LATENCY_US = 1000.0
# 10 million hours (over a thousand years) per GPU: Llama 3's 16,384 H100s saw 419 interruptions in 54
# days, about 50,000 GPU-hours each (Dubey et al. 2024, section 3.3.4); a figure past it is seconds.
MAX_GPU_MTBF_HOURS = 1e7
# The smallest GPU figures, with headroom: NVIDIA T4, 65 fp16 TFLOP/s on 320 GB/s (T4 datasheet, 2018).
# A probed CPU profile (gpu.name "cpu") measures far less and is not held to them.
MIN_GPU_HALF_TFLOPS = 1.0
MIN_GPU_MEMORY_BANDWIDTH_GBPS = 50.0

# What a network figure means, whatever its key's name suggests (`_gbps` reads as gigabits to many).
PER_GPU_GBPS = ("GB/s (gigabytes, not gigabits) per GPU per direction: divide a NIC's Gb/s by 8 and by the GPUs "
                "that share it (one 400 Gb/s NIC per node of 8 GPUs: 6.25)")


def implausible_values(name_or_path: str, overrides: dict[str, object] | None = None,
                       given_by: str = "--hw-set") -> list[str]:
    """One warning line per value of the profile, or of its `--hw-set` overrides (dotted keys),
    that is likely in the wrong unit; `given_by` names where the overrides came from."""
    stated = _flat(read_profile(name_or_path))
    given = {key: value for key, value in (overrides or {}).items() if _checked(key)}
    found = _findings({**stated, **given}, set(given))
    return [f"warning: {given_by if key in given else name_or_path}: {key} = {value:g} {why}"
            for key, value, why in found]


def implausible_varied(name_or_path: str, overrides: dict[str, object], key: str, values) -> list[str]:
    """The warnings of `whatif --vary KEY=V1,V2` for the values of KEY (the profile's own are said once,
    by implausible_values)."""
    lines: list[str] = []
    for value in values:
        if not _checked(key):
            continue
        found = _findings({**_flat(read_profile(name_or_path)), **overrides, key: value}, {key})
        lines += [f"warning: --vary on {name_or_path}: {k} = {v:g} {why}" for k, v, why in found if k == key]
    return lines


def _findings(values: dict[str, object], given: set[str]) -> list[tuple[str, float, str]]:
    """(key, value, why) for each value likely in another unit; `given` the overridden keys."""
    on_gpu = values.get("gpu.name") != PROBED_CPU_NAME
    probed = values.get("gpu.name") in PROBED_NAMES  # `smplan hw probe` names the device so
    found: list[tuple[str, float, str]] = []
    other = "looks like another unit; it is read in"
    for key, value in values.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if key.startswith("gpu.peak_tflops."):
            dtype = key.rsplit(".", 1)[1]
            if value > MAX_PEAK_TFLOPS:
                found.append((key, value, f"{other} TFLOP/s ({unit_fix(key)})"))
            elif on_gpu and dtype in ("bf16", "fp16") and 0 < value < MIN_GPU_HALF_TFLOPS:
                found.append((key, value, f"{other} TFLOP/s (multiply a PFLOP/s figure by 1000)"))
        elif key == "gpu.memory_gib" and value > MAX_MEMORY_GIB:
            found.append((key, value, f"{other} GiB per GPU (not MB, nor the whole node; {unit_fix(key)})"))
        elif key == "gpu.memory_bandwidth_gbps" and (
                value > MAX_BANDWIDTH_GBPS or (on_gpu and value < MIN_GPU_MEMORY_BANDWIDTH_GBPS)):
            found.append((key, value, f"{other} GB/s (multiply a TB/s figure by 1000)"))
        elif key in ("intra_node.bandwidth_gbps", "inter_node.bandwidth_gbps") and value > MAX_BANDWIDTH_GBPS:
            found.append((key, value, f"{other} GB/s per GPU and direction ({unit_fix(key)})"))
        elif key == "inter_node.bandwidth_gbps" and value > MAX_NIC_GBPS_PER_GPU:
            found.append((key, value, f"is more than any NIC gives one GPU (800 Gb/s = 100 GB/s); it is read in "
                                      f"{PER_GPU_GBPS}"))
        elif key.endswith("latency_us") and 0 < value < MIN_LINK_LATENCY_US:
            found.append((key, value, f"{other} microseconds (multiply a seconds figure by 1e6)"))
        elif key.endswith("latency_us") and value > MAX_LINK_LATENCY_US and not probed:  # a probe measures its own
            found.append((key, value, f"{other} microseconds (divide a nanoseconds figure by 1000)"))
        elif key == "reliability.gpu_mtbf_hours" and value > MAX_GPU_MTBF_HOURS:
            found.append((key, value, f"{other} hours per GPU (divide a seconds figure by 3600); large clusters see "
                                      "about 50,000 hours (Llama 3's H100s)"))
        elif key == "cost.usd_per_gpu_hour" and value == 0 and not probed:  # a probed file states 0 (probe.py)
            found.append((key, value, "makes every $ figure 0, and whatif's cost charts and cheapest point say "
                                      "nothing; give the price of a GPU-hour (rented, or your own amortised)"))
        elif key.startswith("efficiency.") and key.split(".")[1] in US_KEYS:
            line = us_unit_warning("", key, value)
            if line:
                found.append((key, value, line.split(f"{key} = {value:g} ", 1)[1]))
    inter, intra = values.get("inter_node.bandwidth_gbps"), values.get("intra_node.bandwidth_gbps")
    fabric = values.get("intra_node.fabric", "switch")  # cluster.IntraLink's default
    flagged = {key for key, _, _ in found}
    if isinstance(intra, int | float) and "intra_node.bandwidth_gbps" not in flagged and not probed:
        if fabric == "pcie" and intra > MAX_PCIE_GBPS:
            found.append(("intra_node.bandwidth_gbps", intra, f"is more than a PCIe 6.0 x16 slot carries ({MAX_PCIE_GBPS:g} "
                                                              f"GB/s each way) on intra_node.fabric = \"pcie\"; it is read in "
                                                              f"{PER_GPU_GBPS}"))
        elif fabric == "switch" and intra <= PCIE5_GBPS:
            found.append(("intra_node.bandwidth_gbps", intra, "is a PCIe figure, but intra_node.fabric is \"switch\" (NVSwitch, "
                                                              "the default), where the stack's tp_comm_overlap hides tensor "
                                                              "parallelism's collectives under the GEMMs; a box without NVLink "
                                                              "sets fabric = \"pcie\""))
        flagged = {key for key, _, _ in found}
    if (isinstance(inter, int | float) and isinstance(intra, int | float) and not flagged & {
            "inter_node.bandwidth_gbps", "intra_node.bandwidth_gbps"} and inter > intra):
        # a GPU's traffic to another node crosses its own PCIe / NVLink first: the faster of the two is inside
        only_intra = "intra_node.bandwidth_gbps" in given and "inter_node.bandwidth_gbps" not in given
        key = "intra_node.bandwidth_gbps" if only_intra else "inter_node.bandwidth_gbps"
        shown = inter if key.startswith("inter") else intra
        found.append((key, shown, f"puts the network between nodes (inter_node {inter:g}) above the link inside "
                                  f"one (intra_node {intra:g}); both are read in {PER_GPU_GBPS}"))
    return found


def _checked(key: str) -> bool:
    """Whether an override of `key` is one _findings looks at."""
    return (key in ("gpu.name", "gpu.memory_gib", "gpu.memory_bandwidth_gbps", "intra_node.bandwidth_gbps",
                    "inter_node.bandwidth_gbps", "intra_node.fabric", "cost.usd_per_gpu_hour", "reliability.gpu_mtbf_hours") or ".peak_tflops." in key or key.endswith("latency_us")
            or (key.startswith("efficiency.") and key.split(".")[1] in US_KEYS))


def _flat(data: dict, prefix: str = "") -> dict[str, object]:
    """{"gpu": {"memory_gib": 80}} -> {"gpu.memory_gib": 80}; read before validation, so any shape."""
    flat: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
