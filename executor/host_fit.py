"""Whether this machine can hold the processes `execute` would start on it, checked before launch.

A plan made for a GPU cluster (`smplan plan ... --hw h100x8 --nodes 2`) names its world size;
`execute` starts that many processes here. On GPUs each process needs a device of its own
(torch.cuda.set_device(LOCAL_RANK)); on CPU every process trains at fp32 in host memory. A
run that cannot start should be one line before launch, not an out-of-memory kill of rank 9.
"""

from __future__ import annotations

import os

# AdamW at fp32 keeps, per parameter, its weight, its gradient and two moments: 4 x 4 bytes
# (Kingma & Ba 2015; torch.optim.AdamW's exp_avg and exp_avg_sq). However the plan shards them,
# the run holds each at least once: a lower bound on host memory, activations not counted.
FP32_ADAMW_BYTES_PER_PARAM = 16
GIB = 2**30


def available_host_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux: what new processes can take without swapping), else
    the free physical pages; None when neither can be read (then nothing is checked)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def this_machine_problem(local_processes: int, nnodes: int, params: int, gpus: int | None,
                         available_bytes: int | None) -> str | None:
    """Why `local_processes` processes of a run over `nnodes` nodes cannot start here, or None.

    `gpus`: this machine's CUDA devices (None: no CUDA, the processes train on CPU).
    """
    if gpus is not None:
        if local_processes > gpus:
            return (f"the plan starts {local_processes} processes on this machine, one per GPU, but it has {gpus}; "
                    f"run it on the nodes it was planned for (--launcher slurm, or --nnodes N --nproc-per-node "
                    f"{gpus} on each), or plan for {gpus} GPUs")
        return None
    if available_bytes is None or params <= 0:
        return None
    need = FP32_ADAMW_BYTES_PER_PARAM * params / nnodes
    if need <= available_bytes:
        return None
    return (f"on CPU this run needs at least {need / GIB:.1f} GiB of host memory here ({params:,} parameters at "
            f"fp32 with AdamW, 16 bytes each, held at least once{' across ' + str(nnodes) + ' nodes' if nnodes > 1 else ''}), "
            f"but this machine has {available_bytes / GIB:.1f} GiB available; run it on the GPUs it was planned for "
            "(--launcher slurm), or plan a smaller model here")
