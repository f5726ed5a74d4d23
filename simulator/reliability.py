"""A plan's whole run under failures: step time from the step simulation, checkpoint cost
from the model's state bytes and the storage bandwidth, then `failures.analyse_run`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from smplan.hwprofiles import Cluster

from .failures import ReliabilityError, RunDoesNotFinish, RunReport, RunSpec, analyse_run

# Pinned GPU -> host copy over PCIe 4.0 x16: ~20-25 GB/s measured (nvbandwidth, DGX A100);
# what an async checkpoint (torch.distributed.checkpoint async_save) blocks training for.
HOST_COPY_GBPS = 20.0


@dataclass(frozen=True)
class RunTarget:
    days: float | None = None  # failure-free training days
    tokens: float | None = None  # tokens to train on

    def work_s(self, tokens_per_s: float, step_time_s: float) -> float:
        """Failure-free seconds of training in whole steps, at least one (a run cannot stop inside
        one; `smplan whatif` counts them so too): the steps of --days, or those --tokens needs."""
        if (self.days is None) == (self.tokens is None):
            raise ReliabilityError("give exactly one of --days D or --tokens T")
        if self.days is not None:
            if self.days <= 0:
                raise ReliabilityError(f"--days must be greater than 0, got {self.days}")
            return whole_steps(self.days * 86400.0, step_time_s) * step_time_s
        if self.tokens <= 0:
            raise ReliabilityError(f"--tokens must be greater than 0, got {self.tokens}")
        if tokens_per_s <= 0:
            raise ReliabilityError("the plan's model has no tokens per step; use --days instead of --tokens")
        return whole_steps(self.tokens, tokens_per_s * step_time_s) * step_time_s


def whole_steps(amount: float, per_step: float) -> int:
    """The steps that cover `amount` (seconds or tokens) at `per_step` each: rounded up, at least
    one (a run cannot stop inside a step), an exact multiple's float noise (a relative 1e-12, which
    holds at any count) not counted as one more."""
    return max(1, math.ceil(amount / per_step * (1.0 - 1e-12)))


def checkpoint_bytes(params: int, dtype: str) -> float:
    """Weights plus optimizer states (Megatron/DCP save both; gradients are not saved)."""
    from smplan.planner.memory_model import state_bytes_per_param

    weights, _, optimizer = state_bytes_per_param(dtype)
    return params * (weights + optimizer)


def writer_nodes(world_size: int, cluster: Cluster) -> int:
    """Nodes a plan of `world_size` GPUs spans: each writes its ranks' shards."""
    return -(-world_size // cluster.gpus_per_node)


def checkpoint_write_gbps(nodes: int, cluster: Cluster) -> float:
    """GB/s a checkpoint is written at: every node writes its shard in parallel at
    `storage.checkpoint_write_gbps`, up to the file system's `storage.filesystem_write_gbps`."""
    storage = cluster.storage
    return min(max(nodes, 1) * storage.checkpoint_write_gbps, storage.filesystem_write_gbps)


def checkpoint_seconds(nbytes: float, nodes: int, cluster: Cluster) -> float:
    """Seconds to write `nbytes` of checkpoint from `nodes` nodes (`checkpoint_write_gbps`)."""
    return nbytes / (checkpoint_write_gbps(nodes, cluster) * 1e9)


def gpu_hours(wall_s: float, num_gpus: int) -> float:
    """GPU-hours of a run that holds `num_gpus` for `wall_s` seconds (what a cloud bills)."""
    return wall_s / 3600.0 * num_gpus


@dataclass
class PlanReliability:
    report: RunReport | None  # None: the run does not finish (`reason` says why)
    step_time_s: float
    tokens_per_s: float
    checkpoint_bytes: float
    num_gpus: int
    nodes: int = 1  # the nodes writing the checkpoint, each its shard
    peak_memory_gib: float = 0.0  # the step's fullest GPU, as `simulate` gives it
    memory_capacity_gib: float = 0.0  # what a GPU can use (0: not known)
    reason: str | None = None  # why the run does not finish (RunDoesNotFinish's message); None when it does
    spec: RunSpec | None = None  # what was simulated
    usd_per_gpu_hour: float = 0.0  # the profile's price ([cost]), for the run's cost

    @property
    def gpu_hours_mean(self) -> float | None:
        """GPU-hours of the mean wall-clock, failures and checkpoints included (None: no finish)."""
        return gpu_hours(self.report.wall_mean_s, self.num_gpus) if self.report is not None else None

    @property
    def usd_mean(self) -> float | None:
        """What the mean wall-clock costs at the profile's price (`smplan whatif`'s usd)."""
        hours = self.gpu_hours_mean
        return None if hours is None else hours * self.usd_per_gpu_hour

    @property
    def fits_memory(self) -> bool:
        return not self.memory_capacity_gib or self.peak_memory_gib <= self.memory_capacity_gib

    @property
    def finishes(self) -> bool:
        return self.report is not None

    def to_dict(self) -> dict:
        """The report's fields, or for a run that does not finish only its inputs; `feasible` and
        `reason` as `smplan whatif` marks a point whose run does not finish."""
        if self.report is not None:
            out = self.report.to_dict()
        else:
            spec = self.spec
            out = {"work_s": spec.work_s, "job_mtbf_s": spec.job_mtbf_s, "checkpoint_s": spec.checkpoint_s,
                   "restart_s": spec.restart_s, "spares": spec.spares,
                   "repair_hours": spec.repair_hours if spec.spares is not None else None,
                   "weibull_shape": spec.weibull_shape} if spec else {}
        out.update(
            feasible=self.finishes,
            reason=self.reason,
            step_time_s=self.step_time_s,
            tokens_per_s=self.tokens_per_s,
            checkpoint_bytes=self.checkpoint_bytes,
            num_gpus=self.num_gpus,
            nodes=self.nodes,
            peak_memory_gib=self.peak_memory_gib,
            memory_capacity_gib=self.memory_capacity_gib,
            fits_memory=self.fits_memory,
            gpu_hours_mean=self.gpu_hours_mean,
            usd_per_gpu_hour=self.usd_per_gpu_hour,
            usd_mean=self.usd_mean,
        )
        return out


def plan_reliability(
    plan,
    profile,
    cluster: Cluster,
    target: RunTarget,
    *,
    interval_minutes: float | None = None,
    mtbf_hours: float | None = None,
    restart_minutes: float | None = None,
    checkpoint_minutes: float | None = None,
    async_checkpoint: bool = False,
    spares: int | None = None,
    repair_hours: float = 24.0,
    weibull_shape: float | None = None,
    seeds: int = 100,
    seed: int = 0,
    contention: bool = True,
) -> PlanReliability:
    """Goodput and wall-clock of training `plan` for `target`, over `seeds` failure draws."""
    from .api import simulate_plan

    step = simulate_plan(plan, profile, cluster, contention, record_events=False)
    figures = step.figures
    work = target.work_s(figures.tokens_per_s, figures.step_time_s)
    nbytes = checkpoint_bytes(profile.params, plan.dtype)
    nodes = writer_nodes(plan.world_size, cluster)
    ckpt_s = checkpoint_minutes * 60.0 if checkpoint_minutes is not None else checkpoint_seconds(nbytes, nodes, cluster)
    if interval_minutes is not None and interval_minutes <= 0:
        raise ReliabilityError(f"--checkpoint-interval must be 'auto' or minutes > 0, got {interval_minutes}")
    spec = RunSpec(
        work_s=work,
        num_gpus=plan.world_size,
        gpu_mtbf_hours=mtbf_hours if mtbf_hours is not None else cluster.reliability.gpu_mtbf_hours,
        restart_s=(restart_minutes if restart_minutes is not None else cluster.reliability.restart_minutes) * 60.0,
        checkpoint_s=ckpt_s,
        async_checkpoint=async_checkpoint,
        async_blocking_s=nbytes / plan.world_size / (HOST_COPY_GBPS * 1e9),
        weibull_shape=weibull_shape,
        spares=spares,
        gpus_per_node=cluster.gpus_per_node,
        repair_hours=repair_hours,
    )
    try:
        report, reason = analyse_run(spec, interval_minutes * 60.0 if interval_minutes else None, seeds, seed), None
    except RunDoesNotFinish as err:  # the run's fate, not a wrong input: returned, for --json to print it
        report, reason = None, str(err)
    return PlanReliability(report, figures.step_time_s, figures.tokens_per_s, nbytes, plan.world_size, nodes,
                           figures.peak_memory_gib, step.memory_capacity_gib, reason, spec,
                           cluster.cost.usd_per_gpu_hour)
