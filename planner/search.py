"""plan_search: enumerate mesh shapes around the partition ILP, pruned by closed-form bounds.

Outside the ILP: world size (all GPUs, or 1..--max-nodes nodes), tp (inside a node,
dividing the heads), cp (powers of two with 2*cp dividing seq_len, offered from seq_len
8192 on: below that no published recipe uses it), pp (<= blocks), dp = world / (tp cp pp)
dividing the global batch, ep (divisors of tp*cp*dp that divide the experts), the
micro-batch size, the schedule (1F1B; interleaved with v chunks; GPipe only when asked:
under this cost model it takes 1F1B's time with more memory), the ZeRO stage and the
recomputation kind. Inside it (smplan.planner.ilp): blocks per stage and recomputed blocks per
stage under every stage's memory limit.

Each candidate first gets a lower bound on its step time (cheap arithmetic, see
`bounds.lower_bound`): paths through the busiest device, the least recomputation any
partition needs to fit, and the tail no partition avoids. Candidates are
solved in order of their bound and the loop stops when the bound reaches the K-th best solved
plan. The bounds are paths of the schedule's task graph, and AMP's time where it was measured
to be a floor (bounds.textbook_is_floor); the ILP minimises the textbook formulas, not the
closed form (ilp.py), so with pp > 1 its cutoff is SPREAD_MARGIN looser, or absent in a short
pipeline, and the plans returned are polished under the closed form (`polish`). Layouts are
ranked by their ILP partitions; on small models a candidate's polished plan equals brute force
over every partition, and no bound passes it (tests/planner/test_search.py).
Dominated choices are skipped: sequence parallelism costs the same communication as plain
TP with less memory and element-wise time (so tp > 1 uses it unless fixed), and ZeRO-1
costs ZeRO-0's communication with less memory and optimizer time (so dp > 1 starts at 1).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from smplan.hwprofiles import Cluster

from .bounds import compute_lower_bound, lower_bound
from .cost_model import CostModel
from .explain import nearest_feasible_change
from .feasibility import default_dtype
from .memory_model import capacity_bytes
from .model_profile import ModelProfile
from .plan import INLINE_KEYS, Plan, PlanError, parse_inline
from .search_space import (
    CP_MIN_SEQ_LEN,
    Candidate,
    check_fix_syntax,
    enumerate_candidates,
    recomputes_every_block,
    validate_constraints,
    why_no_candidates,
)
from .solve import POLISH_ESTIMATES, POLISH_PASSES, SPREAD_MARGIN, kth, long_pipeline, polish, solve


class NoFeasiblePlan(PlanError):
    """Nothing fits; the message names the smallest change that would. `what` is the message without
    that change: what does not fit (all of it when no mesh shape met the fixed keys and the batch)."""

    def __init__(self, what: str, change: str = ""):
        super().__init__(f"{what}; {change}" if change else what)
        self.what = what


@dataclass
class SearchResult:
    plans: list[Plan]
    rejected: list[tuple[Candidate, str, float]] = field(default_factory=list)  # (cand, reason, amount)
    candidates: int = 0
    solved: int = 0
    seconds: float = 0.0
    unsupported: dict = field(default_factory=dict)  # dimension -> why the model cannot run it
    num_experts: int = 0  # routed experts per MoE layer of the model (0: dense)
    not_searched: dict = field(default_factory=dict)  # dimension -> why the search left it out (--fix prices it)
    without_cp: Plan | str | None = None  # the best plan at cp=1, or why there is none (plan_model's without_cp)
    without_fix: Plan | str | None = None  # the best plan with the layout keys of --fix free (plan_model's without_fix)
    freed: str = ""  # those keys as --fix gave them ("cp=8,mbs=2")
    # runner-up plans of the layouts in `plans` (ALTERNATE_SHARE): the simulated ranking tries them too
    alternates: list[Plan] = field(default_factory=list)


def plan_search(profile: ModelProfile, cluster: Cluster, **constraints) -> list[Plan]:
    """The best plans for `profile` on `cluster`, best first, each with `.predicted` Figures.

    Constraints: global_batch, fix (dict of plan fields or inline text "tp=8,pp=2"),
    objective ("time" | "cost"), top (K), max_nodes (search 1..max_nodes nodes; min_nodes
    raises the low end), overlap_dp, dtype, progress (callable), alternates (also collect each
    layout's runner-ups, SearchResult.alternates, for a simulated ranking: ALTERNATE_SHARE).
    """
    return search(profile, cluster, **constraints).plans


def search(
    profile: ModelProfile,
    cluster: Cluster,
    *,
    global_batch: int | None = None,
    fix: dict | str | None = None,
    objective: str = "time",
    top: int = 5,
    max_nodes: int | None = None,
    min_nodes: int | None = None,
    overlap_dp: bool | None = None,
    dtype: str | None = None,
    progress: Callable[[str], None] | None = None,
    model_ref: str | None = None,
    alternates: bool = False,
) -> SearchResult:
    t0 = time.perf_counter()
    if objective not in ("time", "cost"):
        raise PlanError(f"objective must be 'time' or 'cost', got {objective!r}")
    fixed = validate_constraints(profile, cluster, fix, global_batch, max_nodes, overlap_dp, dtype, min_nodes)
    gbs = fixed["global_batch"]
    cm = CostModel(profile, cluster)
    cap = capacity_bytes(cluster)
    result = SearchResult(plans=[])
    scale = (lambda c: c.world) if objective == "cost" else (lambda c: 1.0)
    heap: list[tuple[float, int, int, Candidate]] = []
    for i, cand in enumerate(enumerate_candidates(profile, cluster, fixed, max_nodes, min_nodes)):
        result.candidates += 1
        heap.append((compute_lower_bound(cm, cand) * scale(cand), i, 0, cand))
    heapq.heapify(heap)
    best: dict[tuple, tuple[float, Plan]] = {}  # one plan per layout (dp, tp, pp, micro-batch, cp, ep)
    runners: dict[tuple, list[tuple[float, Plan]]] = {}  # every plan solved, per layout
    share = ALTERNATE_SHARE if alternates else 0.0  # runner-ups only for a simulated ranking (rank.py)
    while heap:
        lb, i, level, cand = heapq.heappop(heap)
        if len(best) >= top and lb >= kth(best, top) * (1 - 1e-12):
            break
        mesh = cand.mesh
        if mesh in best and lb >= best[mesh][0] * (1 + share):
            continue
        if level == 0:  # refine: memory (least recomputation), DP/optimizer tail
            bound, why, amount = lower_bound(cm, cand, cap)
            if why:
                result.rejected.append((cand, why, amount))
            else:
                heapq.heappush(heap, (max(lb, bound * scale(cand)), i, 1, cand))
            continue
        cutoff = None
        if (len(best) >= top or mesh in best) and (cand.pp == 1 or long_pipeline(cand)):
            limit = min(kth(best, top) if len(best) >= top else math.inf,
                        best[mesh][0] * (1 + share) if mesh in best else math.inf)
            cutoff = limit / scale(cand) * (1 if cand.pp == 1 else 1 + SPREAD_MARGIN)
        plan = solve(cm, cand, cap, gbs, model_ref or profile.model, cutoff)
        result.solved += 1
        if progress and result.solved % 25 == 0 and time.perf_counter() - t0 > 2.0:
            progress(f"solved {result.solved} partitions ({time.perf_counter() - t0:.1f} s)")
        if plan is None:
            if cutoff is None:
                result.rejected.append((cand, "oom", 0.0))
            continue
        value = plan.predicted.step_time_s * scale(cand)
        runners.setdefault(mesh, []).append((value, plan))
        if mesh not in best or value < best[mesh][0]:
            best[mesh] = (value, plan)
    ranked = sorted(best.items(), key=lambda kv: kv[1][0])[:top]
    value = (lambda p: p.predicted.step_time_s * p.world_size) if objective == "cost" else \
        (lambda p: p.predicted.step_time_s)
    result.plans, result.alternates = _polished_layouts(cm, ranked, runners if alternates else {}, cap, value,
                                                        recomputes_every_block(fixed))
    result.seconds = time.perf_counter() - t0
    # PowerSGD narrows the search to plain DDP (tp=pp=1, zero=0): say so where nothing fits
    why = (f"; grad_compress={fixed['grad_compress']} allows only tp=1, pp=1, zero=0 (torch DDP's hook): "
           "grad_compress=bf16 keeps every layout" if fixed.get("grad_compress", "none").startswith("powersgd") else "")
    if not result.plans and not result.candidates:  # no shape meets the fixed keys and the batch
        raise NoFeasiblePlan(why_no_candidates(profile, cluster, fixed, max_nodes, min_nodes) + why)
    if not result.plans:
        given = dict(parse_inline(fix) if isinstance(fix, str) else (fix or {}))
        batch_given = global_batch is not None or "global_batch" in given  # else one sample per GPU
        what, change = nearest_feasible_change(profile, cluster, fixed, result, max_nodes, batch_given)
        raise NoFeasiblePlan(what, change + why)
    return result


# A layout's (dp, tp, pp, micro-batch, cp, ep) runner-up plans (another schedule, v, ZeRO stage or
# recompute kind) within this share of the search's best closed form are simulated by the ranking
# too. The closed form used to see an interleaved device's chunks only through their sums: for a
# review's llama3_8b on 2 L40S x4 nodes it put v=8, 6, 7, 5 and 4 of one layout within 0.5%
# (4.479-4.500 s) where they simulated at 4.66-4.78 s and, for v=4, 4.55 s, and the pick lost v=4
# to its own v=8. It now replays the schedule as the simulation does with contention off
# (closed_form.compute_end_s), and runner-ups stand in for what only the simulated links see:
# ZeRO-2/3's per-layer collectives sharing the NIC with the DP stream and the sends (up to 4.7%
# there, benchmarks/plan_ranking.py part 2). 6% made GPT 1T's search 25% slower.
ALTERNATE_SHARE = 0.02
# Runner-ups per layout, and in all: the ranking simulates each (seconds for the largest models,
# rank.RANKED_PLANS), so these bound what the fix can add to `plan`'s time.
ALTERNATES_PER_MESH = 4
MAX_ALTERNATES = 10


def _polished_layouts(cm: CostModel, ranked: list, runners: dict, cap: float,
                      value: Callable[[Plan], float], keep_all: bool) -> tuple[list[Plan], list[Plan]]:
    """(each layout's best plan, their runner-ups), both polished (`polish`) and best first.

    `ranked`: (layout, (value, best plan)) of the layouts returned; `runners`: every plan solved
    per layout ({} for no runner-ups). A layout's runner-ups are its other plans within
    ALTERNATE_SHARE of the first's value, ALTERNATES_PER_MESH of them per layout and
    MAX_ALTERNATES in all at most. One budget for all, spent layout by layout, best first, a
    layout's runner-ups with it (polishing every best first left the sweep of
    benchmarks/plan_ranking.py part 1 4.493 s at 64 GB/s, its v=4 runner-up unpolished, over
    4.441 s at 50): a layout far down may go unpolished. A runner-up that polishes faster than its
    layout's best takes its place. `keep_all`: every block recomputes (a fixed recompute kind).
    """
    if not ranked:
        return [], []
    budget = [POLISH_ESTIMATES, POLISH_PASSES]
    limit = ranked[0][1][0] * (1 + ALTERNATE_SHARE)
    layouts = []
    for mesh, (_, chosen) in ranked:  # the best layouts first: they take the budget before the rest
        seen, mine = [chosen.replace(predicted=None)], [polish(cm, chosen, cap, budget, keep_all)]
        layouts.append(mine)
        for v, plan in sorted(runners.get(mesh, ()), key=lambda vp: vp[0]):
            bare = plan.replace(predicted=None)  # two recompute kinds can end in the same plan
            if v <= limit and bare not in seen and len(seen) <= ALTERNATES_PER_MESH:
                seen.append(bare)
                mine.append(polish(cm, plan, cap, budget, keep_all))
        unique: list[Plan] = []  # two plans can polish to the same one
        for p in sorted(mine, key=value):
            if all(p.replace(predicted=None) != q.replace(predicted=None) for q in unique):
                unique.append(p)
        mine[:] = unique
    plans = sorted((mine[0] for mine in layouts), key=value)
    top = value(plans[0]) * (1 + ALTERNATE_SHARE)
    others = sorted((p for mine in layouts for p in mine[1:] if value(p) <= top), key=value)
    return plans, others[:MAX_ALTERNATES]


def plan_model(
    ref: str,
    cluster: Cluster,
    *,
    model_args: dict | None = None,
    seq_len: int | None = None,
    dtype: str | None = None,
    **constraints,
) -> SearchResult:
    """Profile the model file `ref` and search its plans (what `smplan plan` runs).

    dtype None: the GPU's default (`feasibility.default_dtype`: bf16, or fp16 on GPUs without
    a bf16 peak such as V100, fp32 on a probed CPU). `progress` (callable) also hears when profiling starts.
    """
    from .profiler import profile_model

    without_cp = constraints.pop("without_cp", False)
    without_fix = constraints.pop("without_fix", False)
    fixed = check_fix_syntax(constraints.get("fix"), dtype)
    # --fix dtype=fp8 profiles as --dtype fp8 does
    dtype = dtype or fixed.get("dtype") or default_dtype(cluster.gpu.peak_tflops, cluster.gpu.name)
    profile = profile_model(ref, model_args or {}, seq_len=seq_len, dtype=dtype, progress=constraints.get("progress"))
    constraints["dtype"] = constraints.get("dtype") or dtype
    result = search(profile, cluster, model_ref=ref, **constraints)
    result.unsupported = dict(profile.unsupported)
    result.num_experts = profile.num_experts
    if not profile.has_tp_plan:  # tensor parallelism is the model file's to lay out
        result.unsupported.setdefault("tp", "the model file defines no tp_plan(block) (README: The model file)")
    if profile.seq_len < CP_MIN_SEQ_LEN and "cp" not in result.unsupported and "cp" not in fixed:
        result.not_searched["cp"] = (f"searched from {CP_MIN_SEQ_LEN}-token sequences on, where long-context recipes "
                                     f"start it; --fix cp=2 prices it at {profile.seq_len}")
    if without_cp and "cp" not in fixed and any(p.cp > 1 for p in result.plans):
        result.without_cp = best_without_cp(profile, cluster, ref, {**constraints, "fix": fixed})
    free = {k: v for k, v in fixed.items() if k not in LAYOUT_KEYS}
    if without_fix and free != fixed:
        result.without_fix = best_with_fix(profile, cluster, ref, constraints, free)
        short = {field: key for key, field in reversed(INLINE_KEYS.items())}  # mbs, not micro_batch
        result.freed = ",".join(f"{short[k]}={int(v) if isinstance(v, bool) else v}"
                                for k, v in fixed.items() if k in LAYOUT_KEYS)
    if seq_len is not None:
        result.plans = [replace(p, seq_len=seq_len) for p in result.plans]
        result.alternates = [replace(p, seq_len=seq_len) for p in result.alternates]
        result.without_cp, result.without_fix = (replace(x, seq_len=seq_len) if isinstance(x, Plan) else x
                                                 for x in (result.without_cp, result.without_fix))
    return result


# The --fix keys that lay the model out (`plan --explain` prices the best plan with them free);
# the rest (dtype, global batch, fp8 scaling, gradient compression, capacity factor) set what is
# trained, not how, and stay.
LAYOUT_KEYS = ("dp", "tp", "pp", "cp", "ep", "zero", "recompute", "micro_batch", "schedule", "virtual_stages",
               "sequence_parallel", "overlap_dp")


def best_without_cp(profile: ModelProfile, cluster: Cluster, ref: str, constraints: dict) -> Plan | str:
    """The best plan under `constraints` with cp=1 (what `plan --explain` sets a cp plan against),
    or why none fits: one more search, 0.13 s for examples/gpt.py:llama3_8b at 131072 tokens on
    8 h100x8 nodes (the first took 0.41 s), as it prunes against a single best."""
    return best_with_fix(profile, cluster, ref, constraints, {**constraints.get("fix", {}), "cp": 1})


def best_with_fix(profile: ModelProfile, cluster: Cluster, ref: str, constraints: dict, fix: dict) -> Plan | str:
    """The best plan under `constraints` with `fix` for its fixed keys, or why none fits (one more
    search, for a single best)."""
    try:
        return search(profile, cluster, model_ref=ref, **{**constraints, "fix": fix, "top": 1, "progress": None,
                                                          "alternates": False}).plans[0]
    except PlanError as err:
        # the smallest change that fits (nearest_feasible_change) is one for another search than the
        # user's; keep what does not fit
        return err.what if isinstance(err, NoFeasiblePlan) else str(err)
