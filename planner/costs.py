"""The cost contract between the planner's cost model and the simulator.

`smplan.planner.cost_model.plan_costs(plan, profile, cluster)` fills these; the closed-form
estimate (planner) and the discrete-event simulation (simulator) both start from them, so
with contention off the two agree exactly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the fullest GPU of one pipeline stage."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float  # temporary buffers: all-gathered params, logits, comm buckets
    reserve_bytes: float  # framework reserve (CUDA context, fragmentation)

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.buffers_bytes
            + self.reserve_bytes
        )

    def to_gib(self) -> dict[str, float]:
        gib = 2.0**30
        out = {f.name.removesuffix("_bytes"): getattr(self, f.name) / gib for f in dataclasses.fields(self)}
        out["total"] = self.total_bytes / gib
        return out


@dataclass(frozen=True)
class ZeroUnit:
    """One ZeRO-2/3 / FSDP unit of a chunk, one micro-batch: its passes' seconds without its
    collectives and the collectives' seconds alone (forward: parameter all-gather; backward:
    the all-gather again, ZeRO-3 only, and the gradient reduce-scatter)."""

    forward_s: float
    forward_comm_s: float
    backward_s: float
    backward_comm_s: float
    recompute_s: float = 0.0  # of backward_s: the recomputed forward


@dataclass(frozen=True)
class StageCosts:
    """One pipeline stage (one model chunk under interleaving): seconds per micro-batch.

    `forward_s` and `backward_s` are what the stage's GPU is busy for, including the
    tensor-parallel collectives inside its blocks (they sit on the critical path) and, in
    `backward_s`, any recomputed forward.
    """

    forward_s: float
    backward_s: float
    recompute_s: float = 0.0  # of backward_s: the recomputed forward's compute (its collectives count as comm)
    tp_comm_forward_s: float = 0.0  # the part of forward_s that is TP communication
    tp_comm_backward_s: float = 0.0  # the part of backward_s that is TP communication
    send_bytes: float = 0.0  # activation bytes this stage sends downstream per micro-batch, per GPU
    send_s: float = 0.0  # time of that send (the gradient comes back with the same size)
    send_crosses_node: bool = False
    dp_comm_bytes: float = 0.0  # gradient (and ZeRO parameter) bytes per GPU per step
    dp_comm_s: float = 0.0  # time of this stage's DP / ZeRO collectives per step, unoverlapped
    dp_overlappable: bool = True  # whether it may overlap the last backward (bucketing on)
    optimizer_s: float = 0.0
    memory: MemoryBreakdown | None = None
    # Of forward_s / backward_s: the expert all-to-alls and the exposed context-parallel K/V
    # collectives (the simulator puts them on the links of their groups).
    ep_comm_forward_s: float = 0.0
    ep_comm_backward_s: float = 0.0
    cp_comm_forward_s: float = 0.0
    cp_comm_backward_s: float = 0.0
    # The rest of those collectives, hidden under the passes' compute (not in forward_s /
    # backward_s): the simulator runs them beside the compute on the same links.
    ep_hidden_forward_s: float = 0.0
    ep_hidden_backward_s: float = 0.0
    cp_hidden_forward_s: float = 0.0
    cp_hidden_backward_s: float = 0.0
    ep_crosses_node: bool = False  # whether the ep group spans nodes (NIC) or not (NVLink)
    cp_crosses_node: bool = False
    # ZeRO-2/3 / FSDP: the units (embedding, blocks, head, in forward order) whose parameters
    # each pass gathers and whose gradients it reduce-scatters layer by layer. forward_s /
    # backward_s already hold those collectives overlapped (max) or added; the simulator plays
    # them unit by unit on the DP links (prefetched gathers, trailing reduce-scatters). () : none.
    zero_units: tuple[ZeroUnit, ...] = ()
    zero_crosses_node: bool = False
    # Of forward_s / backward_s: the GPU idle while the host launches the pass's kernels (the
    # pass is bound by the host, not the GPU: CUDA graphs or a bigger micro-batch would help).
    host_wait_forward_s: float = 0.0
    host_wait_backward_s: float = 0.0

    @property
    def zero_reduce_s(self) -> float:
        """Seconds of the gradient reduce-scatters one backward pass issues on the DP links
        (ZeRO-2/3 / FSDP; 0 without): the links are busy with them until the pass ends, so the
        step's own DP collective cannot use that time."""
        return sum(max(0.0, u.backward_comm_s - u.forward_comm_s) for u in self.zero_units)


@dataclass(frozen=True)
class PlanCosts:
    """All stage costs of a plan, plus what the figures need."""

    stages: tuple[StageCosts, ...]  # len = pp * virtual_stages, in model order
    num_microbatches: int
    pp: int
    virtual_stages: int = 1
    schedule: str = "1f1b"
    model_flops_per_step: float = 0.0  # 6N-style model FLOPs of one step, whole cluster
    hardware_flops_per_step: float = 0.0  # executed: with recompute, without causal attention's masked half
    tokens_per_step: int = 0
    samples_per_step: int = 0
    num_gpus: int = 1
    peak_tflops_per_gpu: float = 1.0  # for MFU, at the plan's dtype
    usd_per_gpu_hour: float = 0.0
    capacity_bytes: float = 0.0  # usable memory of one GPU
    # ep > 1 or cp > 1: the breakdowns always carry their keys (zero where all of it hid)
    expert_or_context_parallel: bool = False
    extras: dict = field(default_factory=dict)

    @property
    def waits_for_host(self) -> bool:
        """Whether any pass is bound by the host's launches: the breakdowns then carry `host_wait`."""
        return any(s.host_wait_forward_s > 0.0 or s.host_wait_backward_s > 0.0 for s in self.stages)

    def device_stage(self, chunk: int) -> int:
        """The pipeline rank that runs model chunk `chunk` (Narayanan et al. 2021 interleaving)."""
        return chunk % self.pp
