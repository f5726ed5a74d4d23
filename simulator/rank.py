"""Rank the planner's best plans by their simulated step, the figures `smplan simulate` reports.

The planner searches with closed forms (closed_form.estimate_from_costs): its pipeline is the
schedule replayed, as the simulation runs it with contention off, but it is blind to what only
the step simulation's links see (the DP stream, per-layer ZeRO collectives and sends sharing
them) and bounds each device's DP tail without the cool-down's idle. Its top
plans are therefore simulated, each as `smplan simulate PLAN.json` would (contention on), their
time figures replaced by the simulation's and the list re-sorted, so the plan file's
prediction is the one `simulate` gives and the first plan is the best one simulated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from smplan.hwprofiles import Cluster
from smplan.planner import TIE_SHARE, ModelProfile, Plan, profile_model

from .api import simulate_plan

# Plans the search hands to the step simulation for the final ranking: a handful of seconds at
# most (1T GPT on 3,072 GPUs, 512 micro-batches: 3.3 s for its slowest plan, measured here).
RANKED_PLANS = 10
# A plan of more micro-batch passes (micro-batches x pipeline chunks) than this keeps its closed
# form: ~1.6 s of simulation each (25 us a pass, api.MAX_SIMULATED_PASSES), so ten stay seconds.
RANK_MAX_PASSES = 2**16
# Passes the search's runner-ups (rank_by_simulation's alternates) may simulate in all, on top of
# the ranked plans: ~1.6 s (GPT 1T on 3,072 GPUs: 16,384 passes simulated in 0.81 s here).
ALTERNATE_PASSES = 2**15
# The closed-form estimate's figures the simulation replaces; the memory figures are the
# cost model's in both (the simulator does not change what a GPU holds).
TIME_FIGURES = ("step_time_s", "tokens_per_s", "samples_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu",
                "mfu", "bubble_fraction", "breakdown", "usd_per_step")


def simulated(plan: Plan, cluster: Cluster, profile: ModelProfile | None = None) -> Plan:
    """`plan` with the time figures of its simulated step (contention on) as its prediction;
    `profile` None: the plan's model profiled as `simulate PLAN.json` does (cached). A plan of
    over RANK_MAX_PASSES passes is returned as it is (see `too_long_to_rank`)."""
    if too_long_to_rank(plan):
        return plan
    profile = profile or profile_model(plan.model, plan.model_args, plan.seq_len, plan.dtype)
    figures = simulate_plan(plan, profile, cluster, record_events=False).figures
    if plan.predicted is None:
        return plan.replace(predicted=figures)
    return plan.replace(predicted=dataclasses.replace(
        plan.predicted, **{k: getattr(figures, k) for k in TIME_FIGURES}))


def too_long_to_rank(plan: Plan) -> bool:
    """Whether simulating `plan`'s step would take more than RANK_MAX_PASSES passes."""
    return plan.num_microbatches * plan.pp * plan.virtual_stages > RANK_MAX_PASSES


def rank_by_simulation(plans: list[Plan], cluster_for: Callable[[Plan], Cluster], objective: str = "time",
                       profile: ModelProfile | None = None, alternates: Sequence[Plan] = ()) -> tuple[list[Plan], bool]:
    """(`plans` simulated (`simulated`) and sorted by the objective, True): the step time, or
    for "cost" the GPU-seconds of a step (step time x GPUs, as the planner's search scores it).
    `alternates` (the search's runner-ups of the same layouts) are simulated too, and each layout
    keeps its fastest simulated plan (alternates past ALTERNATE_PASSES are left out). When any of
    `plans` is too long to simulate (`too_long_to_rank`): (`plans` as they are, False), since
    closed-form and simulated figures are not ranked against each other."""
    if any(too_long_to_rank(p) for p in plans):
        return list(plans), False
    done = [simulated(p, cluster_for(p), profile) for p in (*plans, *alternates_within_budget(alternates))]
    if objective == "cost":
        ordered = prefer_simpler_among_ties(done, lambda p: p.predicted.step_time_s * p.world_size)
    else:
        ordered = prefer_simpler_among_ties(done, lambda p: p.predicted.step_time_s)
    return _first_per_layout(ordered), True


def alternates_within_budget(alternates: Sequence[Plan]) -> list[Plan]:
    """`alternates` in order, each while their passes stay within ALTERNATE_PASSES in all."""
    out, passes = [], 0
    for p in alternates:
        n = p.num_microbatches * p.pp * p.virtual_stages
        if passes + n <= ALTERNATE_PASSES:
            out.append(p)
            passes += n
    return out


def _first_per_layout(plans: list[Plan]) -> list[Plan]:
    """The first plan of each layout (nodes, dp, tp, pp, cp, ep, micro-batch), in order: a list of
    layouts, as the search returns them."""
    seen, out = set(), []
    for p in plans:
        layout = (p.nodes, p.dp, p.tp, p.pp, p.cp, p.ep, p.micro_batch)
        if layout not in seen:
            seen.add(layout)
            out.append(p)
    return out


def prefer_simpler_among_ties(plans: list[Plan], value: Callable[[Plan], float]) -> list[Plan]:
    """`plans` sorted by `value`; within a tie (planner.TIE_SHARE of the group's first: step times
    printed alike; a host-bound step, max(host, GPU), gives several layouts the same), the one that
    recomputes fewer blocks, then the one with more memory to spare, first: nothing is gained
    by recomputing or by running at the memory limit."""
    ordered = sorted(plans, key=value)
    out, i = [], 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and value(ordered[j + 1]) <= value(ordered[i]) * (1 + TIE_SHARE):
            j += 1
        out += sorted(ordered[i:j + 1], key=lambda p: (p.recomputed_blocks[0], p.predicted.peak_memory_gib))
        i = j + 1
    return out
