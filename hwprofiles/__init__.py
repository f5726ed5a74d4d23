"""Hardware profiles, their loader and validation, and the hardware performance model."""

from .cluster import Cluster, Efficiency, Gpu, HardwareProfileError, Link, PeakTflops, settable_keys
from .loader import bundled_profiles, load_cluster, parse_override

__all__ = [
    "Cluster",
    "Efficiency",
    "Gpu",
    "HardwareProfileError",
    "Link",
    "PeakTflops",
    "bundled_profiles",
    "load_cluster",
    "parse_override",
    "settable_keys",
]
