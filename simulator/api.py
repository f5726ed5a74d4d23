"""The step simulator's public entry points: `simulate_step` (from PlanCosts) and `simulate_plan`."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from smplan.hwprofiles import Cluster
from smplan.hwprofiles.topology import ParallelLayout
from smplan.planner.costs import PlanCosts, StageCosts
from smplan.planner.plan import Figures

from . import figures as fig
from .step import RawStep, SimEvent, StepSimulation

DP_PATTERNS = ("allreduce", "ps")
# Micro-batch passes (micro-batches x pipeline chunks) one step simulation takes: each costs
# ~25 us of wall time and ~0.4 kB (2e5 took 5 s on one core), so this is about half a minute.
MAX_SIMULATED_PASSES = 2**20


class SimulationError(ValueError):
    """A simulation request that does not fit the plan or the cluster; says what to change."""


@dataclass
class StepResult:
    figures: Figures
    stage_utilisation: list[dict]
    events: list[SimEvent]
    contention: bool
    dp_pattern: str = "allreduce"
    schedule: str = "1f1b"
    pp: int = 1
    virtual_stages: int = 1
    num_microbatches: int = 1
    closed_form_step_time_s: float | None = None
    links: list[dict] = field(default_factory=list)
    raw: RawStep | None = field(default=None, repr=False)
    memory_capacity_gib: float = 0.0  # usable memory of one GPU (0: not known)

    @property
    def step_time_s(self) -> float:
        return self.figures.step_time_s

    @property
    def fits_memory(self) -> bool:
        return not self.memory_capacity_gib or self.figures.peak_memory_gib <= self.memory_capacity_gib

    def to_dict(self) -> dict:
        """DESIGN.md figures at the top level, then what only the simulator knows."""
        out = self.figures.to_dict()
        out.update(
            contention=self.contention,
            dp_pattern=self.dp_pattern,
            schedule=self.schedule,
            pp=self.pp,
            virtual_stages=self.virtual_stages,
            num_microbatches=self.num_microbatches,
            closed_form_step_time_s=self.closed_form_step_time_s,
            memory_capacity_gib=self.memory_capacity_gib,
            fits_memory=self.fits_memory,
            stage_utilisation=self.stage_utilisation,
            links=self.links,
        )
        return out


def simulate_step(
    costs: PlanCosts,
    layout: ParallelLayout,
    cluster: Cluster,
    contention: bool = True,
    *,
    dp_pattern: str = "allreduce",
    ps_servers: int | None = None,
    record_events: bool = True,
) -> StepResult:
    """Simulate one step of `costs` laid out as `layout` on `cluster`.

    `dp_pattern="ps"` replaces the DP all-reduce by parameter-server push/pull
    (TensorFlow ParameterServerStrategy) with `ps_servers` server nodes (default: one
    per node of the job) as a what-if; everything else stays as the cost model says.
    """
    if layout.pp != costs.pp:
        raise SimulationError(
            f"layout pp={layout.pp} but the costs are for pp={costs.pp}; build both from one plan"
        )
    chunks = costs.pp * costs.virtual_stages
    passes = costs.num_microbatches * chunks
    if passes > MAX_SIMULATED_PASSES:
        raise SimulationError(
            f"{costs.num_microbatches:,} micro-batches per step through {chunks} pipeline "
            f"chunk{'s' if chunks > 1 else ''} are {passes:,} passes; the step simulation takes at most "
            f"{MAX_SIMULATED_PASSES:,}: raise mbs or dp, or lower gbs"
        )
    if dp_pattern not in DP_PATTERNS:
        raise SimulationError(
            f"dp pattern must be one of {', '.join(DP_PATTERNS)}, got {dp_pattern!r}"
        )
    dp_seconds = None
    if dp_pattern == "ps":
        dp_seconds = [ps_seconds(st, costs, layout, cluster, ps_servers) for st in costs.stages]
    dp_span = layout.span("dp")
    link_class = {"dp": "nic" if dp_span.crosses_nodes else "nvlink"}
    if dp_pattern == "ps":
        link_class["dp"] = "nic"
    sim = StepSimulation(costs, link_class, contention, dp_seconds, record_events)
    raw = sim.run()
    nodes = [layout.node_of(layout.rank(d, 0, 0)) for d in range(costs.pp)]
    return StepResult(
        figures=fig.figures(raw, costs),
        stage_utilisation=fig.utilisation(raw, nodes),
        events=raw.events,
        contention=contention,
        dp_pattern=dp_pattern,
        schedule=costs.schedule,
        pp=costs.pp,
        virtual_stages=costs.virtual_stages,
        num_microbatches=costs.num_microbatches,
        closed_form_step_time_s=_closed_form(costs),
        links=_link_rows(raw, nodes),
        raw=raw,
        memory_capacity_gib=costs.capacity_bytes / 2**30,
    )


def ps_seconds(
    stage: StageCosts,
    costs: PlanCosts,
    layout: ParallelLayout,
    cluster: Cluster,
    servers: int | None,
) -> float:
    """Push gradients to, then pull parameters from, `servers` parameter-server nodes.

    Each worker GPU moves its own gradient bytes through its NIC share; each server node
    takes every worker's share of the model through all its NICs, so with few servers the
    servers are the bottleneck (Li et al., OSDI 2014; TF ParameterServerStrategy docs).
    """
    from smplan.hwprofiles.perf import p2p_time_s

    if layout.dp == 1 or stage.dp_comm_bytes <= 0:
        return 0.0
    servers = servers or layout.nodes
    if servers < 1:
        raise SimulationError(f"ps_servers must be at least 1, got {servers}")
    # Every GPU of every replica pushes its shard of every chunk; all chunks meet at the
    # servers at about the same time (pessimistic for 1F1B, whose last stage ends first).
    total = layout.dp * layout.tp * sum(s.dp_comm_bytes for s in costs.stages)
    worker = p2p_time_s(stage.dp_comm_bytes, True, cluster)
    # A server node's NICs are gpus_per_node GPU-shares in parallel.
    server = p2p_time_s(total / servers / cluster.gpus_per_node, True, cluster)
    return 2.0 * max(worker, server)


def _closed_form(costs: PlanCosts) -> float | None:
    """The planner's closed-form step time for the same costs, when the planner provides it."""
    try:
        module = importlib.import_module("smplan.planner.cost_model")
        return float(module.estimate_from_costs(costs).step_time_s)
    except (ImportError, AttributeError):
        return None


def _link_rows(raw: RawStep, nodes: list[int]) -> list[dict]:
    rows = []
    for key in sorted(raw.link_busy_s):
        cls, device, direction = key
        rows.append(
            {
                "link": f"node{nodes[device]}/{cls}/{direction}/stage{device}",
                "busy_s": raw.link_busy_s[key],
                "shared_s": raw.link_shared_s.get(key, 0.0),
            }
        )
    return rows


def simulate_plan(
    plan,
    profile,
    cluster: Cluster,
    contention: bool = True,
    *,
    dp_pattern: str = "allreduce",
    ps_servers: int | None = None,
    record_events: bool = True,
) -> StepResult:
    """Cost the plan with the planner's cost model, then simulate its step."""
    from smplan.planner.cost_model import plan_costs

    costs = plan_costs(plan, profile, cluster)
    layout = ParallelLayout.folded(plan.pp, plan.dp, plan.cp, plan.tp, cluster.fast_domain_gpus)
    return simulate_step(
        costs,
        layout,
        cluster,
        contention,
        dp_pattern=dp_pattern,
        ps_servers=ps_servers,
        record_events=record_events,
    )
