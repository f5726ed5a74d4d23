"""Whether this machine can hold the processes `execute` would start on it, checked before launch.

A plan made for a GPU cluster (`smplan plan ... --hw h100x8 --nodes 2`) names its world size;
`execute` starts that many processes here. On GPUs each process needs a device of its own
(torch.cuda.set_device(LOCAL_RANK)); on CPU every process trains in host memory. A run that
cannot start should be one line before launch, not an out-of-memory kill of rank 9.
"""

from __future__ import annotations

import os
from pathlib import Path

# AdamW keeps, per parameter, its weight, its gradient and two moments, each in the parameter's
# dtype (torch.optim.AdamW's exp_avg and exp_avg_sq are zeros_like(param); Kingma & Ba 2015):
# 4 x the parameter bytes. However the plan shards them, the run holds each at least once: a
# lower bound on host memory, activations not counted (`state_copies` adds the replicas a
# plan's data parallelism keeps).
ADAMW_COPIES_PER_PARAM = 4
GIB = 2**30
# What one training process holds of its own, however small its model: the Python interpreter,
# torch 2.13's CPU build, a gloo process group, smplan.executor, autograd and the optimizer
# running (RssAnon 224 MiB of each worker of `execute "dp=4,zero=1" --model examples/gpt.py:tiny`
# while it trained, measured on this project's 2-core machine, Linux x86-64; file pages the
# processes share come on top). A plan for 32 GPUs started on one CPU machine pays it 32 times.
PROCESS_RUNTIME_BYTES = 224 * 2**20
# cgroup v2's limit and usage of this process's group (a container, a Slurm job's cgroup):
# MemAvailable is the machine's, and the kernel kills the group at its own limit.
CGROUP = Path("/sys/fs/cgroup")
MEMINFO = Path("/proc/meminfo")


def available_host_bytes(cgroup: Path = CGROUP, meminfo: Path = MEMINFO) -> int | None:
    """What new processes can take without swapping: MemAvailable of /proc/meminfo (Linux), else
    the free physical pages, capped by the cgroup's memory.max less its memory.current; None
    when nothing can be read (then nothing is checked)."""
    machine = None
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    machine = int(line.split()[1]) * 1024  # kB
                    break
    except (OSError, ValueError, IndexError):
        pass
    if machine is None:
        try:
            machine = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            machine = None
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        used = int((cgroup / "memory.current").read_text().strip())
        if limit != "max":
            group = max(0, int(limit) - used)
            return group if machine is None else min(machine, group)
    except (OSError, ValueError):
        pass
    return machine


def state_copies(dp: int, zero: int, pp: int = 1, cp: int = 1, ep: int = 1) -> int:
    """Copies of the model's parameters the whole run holds at least, as weights, gradients and
    AdamW's two moments, under `execute`'s data parallelism over dp x cp replicas
    (executor/build.py). DDP (zero=0) keeps all four on every replica. FSDP2 (zero>=1) keeps
    one sharded copy of each, and beside it every replica's gathered weights from forward to
    backward unless ZeRO-3 reshards them (not with pipeline stages: planner
    feasibility.effective_zero), and its whole gradients where pipeline stages defer the
    reduce-scatter to the last backward. Tensor and pipeline parallelism split a replica
    without copying it. With experts (ep>1) the routed weights are replicated fewer times: one
    replica is counted, a lower bound still."""
    replicas = dp * cp if ep <= 1 else 1
    if zero <= 0 or replicas == 1:
        return ADAMW_COPIES_PER_PARAM * replicas
    gathered = 0 if zero >= 3 and pp == 1 else replicas
    whole_grads = replicas if pp > 1 else 0
    return ADAMW_COPIES_PER_PARAM + gathered + whole_grads


def this_machine_problem(local_processes: int, nnodes: int, param_bytes: int, gpus: int | None,
                         available_bytes: int | None, copies: int = ADAMW_COPIES_PER_PARAM) -> str | None:
    """Why `local_processes` processes of a run over `nnodes` nodes cannot start here, or None.

    `param_bytes`: the model's parameters in their dtype; `gpus`: this machine's CUDA devices
    (None: no CUDA, the processes train on CPU, each also holding PROCESS_RUNTIME_BYTES);
    `copies`: of the parameters, the whole run's weights, gradients and moments (`state_copies`).
    """
    if gpus is not None:
        if local_processes > gpus:
            return (f"the plan starts {local_processes} processes on this machine, one per GPU, but it has {gpus}; "
                    f"run it on the nodes it was planned for (--launcher slurm, or --nnodes N --nproc-per-node "
                    f"{gpus} on each), or plan for {gpus} GPUs")
        return None
    if available_bytes is None or param_bytes <= 0:
        return None
    runtime = local_processes * PROCESS_RUNTIME_BYTES
    need = copies * param_bytes / nnodes + runtime
    if need <= available_bytes:
        return None
    across = f" across {nnodes} nodes" if nnodes > 1 else ""
    processes = "process's" if local_processes == 1 else f"{local_processes} processes'"
    held = ("at least once" if copies <= ADAMW_COPIES_PER_PARAM
            else f"on the data-parallel replicas: {copies} parameter-sized buffers in all")
    return (f"on CPU this run needs at least {need / GIB:.1f} GiB of host memory here (the model's "
            f"{param_bytes / GIB:.1f} GiB of parameters, with their gradients and AdamW's two moments, held "
            f"{held}{across}, and {runtime / GIB:.1f} GiB for its {processes} torch runtime), "
            f"but this machine has {available_bytes / GIB:.1f} GiB available; run it on the GPUs it was planned "
            "for, or plan fewer GPUs or a smaller model here")


def shared_cores_note(local_processes: int, cores: int | None = None) -> str | None:
    """Processes training on CPU beyond this machine's cores (`cores`: those this process may run
    on) take turns on them: the run is right, its step times are the sharing's (a review started 4
    on 2 cores without a word)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if local_processes <= cores:
        return None
    return (f"note: {local_processes} processes train on this machine's {cores} CPU cores: they take turns, so the "
            "step times measure the sharing, not the plan")
