"""Hardware profiles, their loader and validation, and the hardware performance model."""

from .calibrated import uncalibrated_warning
from .cluster import Cluster, Efficiency, Gpu, HardwareProfileError, Link, PeakTflops, settable_keys
from .loader import bundled_profiles, load_cluster, parse_override
from .perf import (
    ALGORITHMS,
    COLLECTIVES,
    DTYPE_BYTES,
    PerfModelError,
    collective_time_s,
    link_for,
    matmul_efficiency,
    matmul_time_s,
    memory_bound_time_s,
    p2p_time_s,
    single_nic_collective_time_s,
)
from .topology import GroupSpan, ParallelLayout

__all__ = [
    "uncalibrated_warning",
    "ALGORITHMS",
    "COLLECTIVES",
    "DTYPE_BYTES",
    "Cluster",
    "Efficiency",
    "Gpu",
    "GroupSpan",
    "HardwareProfileError",
    "Link",
    "ParallelLayout",
    "PeakTflops",
    "PerfModelError",
    "bundled_profiles",
    "collective_time_s",
    "link_for",
    "load_cluster",
    "matmul_efficiency",
    "matmul_time_s",
    "memory_bound_time_s",
    "p2p_time_s",
    "parse_override",
    "settable_keys",
    "single_nic_collective_time_s",
]
