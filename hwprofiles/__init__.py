"""Hardware profiles and software-stack profiles, their loaders and validation, and the
hardware performance model."""

from .calibrated import uncalibrated_warning
from .cluster import Cluster, Efficiency, Gpu, HardwareProfileError, Link, PeakTflops, settable_keys
from .loader import (
    a100_figures_taken,
    bundled_profiles,
    load_cluster,
    override_rule,
    parse_override,
)
from .perf import (
    ALGORITHMS,
    COLLECTIVES,
    DTYPE_BYTES,
    PerfModelError,
    collective_time_s,
    expert_dispatch_time_s,
    link_for,
    matmul_efficiency,
    matmul_time_s,
    memory_bound_time_s,
    p2p_time_s,
    sharded_dp_collective_time_s,
    single_nic_collective_time_s,
    wave_efficiency,
)
from .stack import (
    DEFAULT_STACK,
    STACK_KEYS,
    Stack,
    StackError,
    bundled_stacks,
    load_stack,
    read_stack,
    with_stack,
)
from .topology import GroupSpan, ParallelLayout

__all__ = [
    "uncalibrated_warning",
    "ALGORITHMS",
    "COLLECTIVES",
    "DTYPE_BYTES",
    "Cluster",
    "DEFAULT_STACK",
    "Efficiency",
    "Gpu",
    "GroupSpan",
    "HardwareProfileError",
    "Link",
    "ParallelLayout",
    "PeakTflops",
    "PerfModelError",
    "STACK_KEYS",
    "Stack",
    "StackError",
    "a100_figures_taken",
    "bundled_profiles",
    "bundled_stacks",
    "collective_time_s",
    "expert_dispatch_time_s",
    "link_for",
    "load_cluster",
    "load_stack",
    "matmul_efficiency",
    "matmul_time_s",
    "memory_bound_time_s",
    "p2p_time_s",
    "read_stack",
    "override_rule",
    "parse_override",
    "settable_keys",
    "sharded_dp_collective_time_s",
    "single_nic_collective_time_s",
    "wave_efficiency",
    "with_stack",
]
