"""One candidate mesh to its plan: the partition ILP's stages (`solve`), the best of its
spreads where the pipeline is short, and the partition polished under the closed form
(`polish`). The search (search.py) decides which candidates get here and in what order."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from .closed_form import estimate_from_costs, replayed_microbatches
from .cost_model import CostModel
from .ilp import partition_for, spread
from .plan import Plan, Stage
from .search_space import Candidate

# The ILP minimises the textbook pipeline formulas (ilp.py), which see each stage only through
# its cycle; the closed form replays the schedule, where the place of a heavy stage counts (a
# 1F1B pipeline drains through every stage after its slowest). Changing the ILP's partition one
# block at a time while the closed form improves (`polish`) took 2.9% off DeepSeek-V3's pick
# (pp=4, v=7 on 1,024 H100s) and 1.5% off llama3_8b's on two 4-GPU L40S nodes
# (benchmarks/plan_ranking.py, part 5). The search polishes the plans it returns, best layout
# first, within these budgets for all of them: estimates (0.5-1 ms each for DeepSeek-V3) and
# replayed passes (micro-batches x chunks, ~0.2 us each; GPT 1T's pp=12 v=5 plan costs 5,760 a
# try), so a large model's search stays seconds. A plan's polish stops after POLISH_PATIENCE
# tries in a row that do not help, so that one plan does not spend the budget of the rest: with
# 256 estimates and 64 tries, the bandwidth sweep of that benchmark picked a slower plan at 64
# GB/s (4.456 s) than at 50 (4.441 s), its layout's v=4 left unpolished.
POLISH_ESTIMATES = 512
POLISH_PATIENCE = 128
POLISH_PASSES = 2**20


def polish(cm: CostModel, plan: Plan, cap: float, budget: list[int], keep_all: bool) -> Plan:
    """`plan` with single changes to its partition kept while the closed form gets faster and the
    memory fits: two chunks' blocks swapped, a block moved to another chunk (a plain one, or a
    recomputed one), a block's recomputation moved to another chunk, or one block fewer
    recomputed (`keep_all`: every block stays recomputed). The changes are tried in turn until
    a round of all of them or POLISH_PATIENCE estimates in a row do not help, or `budget`
    ([estimates, passes] left) runs out."""
    kind = plan.stages[0].recompute
    blocks = [st.num_blocks for st in plan.stages]
    recs = [st.num_recomputed for st in plan.stages]
    busy = [st.forward_s + st.backward_s for st in cm.plan_costs(plan).stages]
    # the heaviest chunk's blocks to the lightest chunk first: most of the gain in the fewest estimates
    pairs = sorted(itertools.permutations(range(len(blocks)), 2), key=lambda ab: busy[ab[1]] - busy[ab[0]])
    moves = [(a, b, "swap") for a, b in pairs if a < b]
    if keep_all:
        moves += [(a, b, "recomputed") for a, b in pairs]
    else:
        moves += [(a, b, what) for a, b in pairs for what in ("block", "recomputed", "recompute")]
        moves += [(a, a, "less") for a in range(len(blocks))] if kind != "none" else []
    passes = replayed_microbatches(plan.num_microbatches, plan.pp, plan.virtual_stages, plan.schedule) * len(blocks)
    tried = unhelpful = since_better = 0
    while since_better < len(moves) and unhelpful < POLISH_PATIENCE:
        move = moves[tried % len(moves)]
        tried, since_better = tried + 1, since_better + 1
        changed = _moved(blocks, recs, *move)
        if changed is None:
            continue
        if budget[0] < 1 or budget[1] < passes:
            break
        budget[0], budget[1], unhelpful = budget[0] - 1, budget[1] - passes, unhelpful + 1
        trial = _restaged(cm, plan, *changed, kind)
        if fits(trial, cap) and trial.predicted.step_time_s < plan.predicted.step_time_s * (1 - 1e-12):
            plan, (blocks, recs), since_better, unhelpful = trial, changed, 0, 0
    return plan


def _moved(blocks: list[int], recs: list[int], a: int, b: int, what: str) -> tuple[list, list] | None:
    """(blocks, recomputed) per chunk after one of `polish`'s changes, None where it cannot apply."""
    nb, nr = list(blocks), list(recs)
    if what == "swap":
        nb[a], nb[b], nr[a], nr[b] = nb[b], nb[a], nr[b], nr[a]
    elif what == "less":
        nr[a] -= 1
    elif what == "recompute":
        nr[a], nr[b] = nr[a] - 1, nr[b] + 1
    else:
        nb[a], nb[b] = nb[a] - 1, nb[b] + 1
        if what == "recomputed":
            nr[a], nr[b] = nr[a] - 1, nr[b] + 1
    if nb[a] < 1 or min(nr) < 0 or any(r > n for r, n in zip(nr, nb, strict=True)) or (nb, nr) == (blocks, recs):
        return None
    return nb, nr


def _restaged(cm: CostModel, plan: Plan, blocks: list[int], recompute: list[int], kind: str) -> Plan:
    """`plan` with these blocks and recomputed blocks per chunk, and their closed-form figures."""
    stages, start = [], 0
    for n, r in zip(blocks, recompute, strict=True):
        stages.append(Stage(start, start + n, kind, r))
        start += n
    out = replace(plan, stages=tuple(stages), predicted=None)
    return replace(out, predicted=estimate_from_costs(cm.plan_costs(out)))


def kth(best: dict, k: int) -> float:
    return sorted(v for v, _ in best.values())[k - 1]


def polished(cm: CostModel, cand: Candidate, cap: float, gbs: int, model_ref: str) -> Plan | None:
    """The plan the search returns for `cand` when it is the best: `solve`'s, polished (`polish`)."""
    plan = solve(cm, cand, cap, gbs, model_ref)
    return plan and polish(cm, plan, cap, [POLISH_ESTIMATES, POLISH_PASSES], cand.recompute_all)


def solve(cm: CostModel, cand: Candidate, cap: float, gbs: int, model_ref: str, cutoff: float | None = None) -> Plan | None:
    part = partition_for(cm, cand, cap, cutoff)
    if part is None:
        return None
    plan = plan_of(cm, cand, part.blocks, part.recompute, gbs, model_ref)
    if cand.schedule == "interleaved" and cand.v > 1:
        plan = _best_spread(cm, cand, plan, cap, gbs, model_ref)
    # The ILP sees an interleaved device's blocks spread evenly over its chunks; where they are not,
    # the estimate counts the first chunks' extra blocks at their larger flight (memory_model.block_flights)
    return plan if fits(plan, cap) else None


def fits(plan: Plan, cap: float) -> bool:
    """The plan's estimated peak within `cap` bytes (and float noise)."""
    return plan.predicted.peak_memory_gib * 2**30 <= cap * (1 + 1e-9)


# How far above the plans still to beat the ILP may stop with pp > 1: its objective, the textbook
# formulas, is the closed form at pp = 1 (one device, m passes, the tail without ZeRO-2's
# reduce-scatters first) but can exceed the replay with pp > 1. Over the interleaved partitions
# whose bound is within 5% of the best it did by up to 2.3% (GPT 1T on 3,072 A100s) and 4.5%
# (GPT-3 175B on 1,024; benchmarks/plan_ranking.py part 3); a review found 7.3% on small models
# (1F1B pp=8, m=9; interleaved pp=4, v=2, m=12) and 9% over the polished plan. In a short
# pipeline (`long_pipeline`) a heavy first stage drains early and it did by 13%
# (tests/planner/test_search.py): there the ILP solves without a cutoff.
SPREAD_MARGIN = 0.10


def long_pipeline(cand: Candidate) -> bool:
    """1F1B with more micro-batches than stages, interleaving with 3 rounds or more, GPipe."""
    if cand.schedule == "interleaved" and cand.v > 1:
        return cand.m >= 3 * cand.pp
    return cand.m > cand.pp or cand.schedule == "gpipe"
# Splits of the interleaved devices' blocks over their chunks tried, all combinations, when there
# are at most this many (small models, where a block's place matters most).
MAX_SPREADS = 64


def _best_spread(cm: CostModel, cand: Candidate, plan: Plan, cap: float, gbs: int, model_ref: str) -> Plan:
    """The ILP sees an interleaved device's chunks only through their sums and spreads its blocks
    evenly, the remainder on its first chunks; the estimate also sees where they sit (the DP
    overlap window, the first chunk's in-flight activations). Try the other splits of each
    device's blocks over its chunks (`_placements`) and keep the fastest that fits."""
    p, v = cand.pp, cand.v
    blocks = [st.num_blocks for st in plan.stages]
    recs = [st.num_recomputed for st in plan.stages]
    per_device = []
    for d in range(p):
        chunks = list(range(d, p * v, p))
        n, r = sum(blocks[c] for c in chunks), sum(recs[c] for c in chunks)
        per_device.append(_placements(n, r, v))

    def build(choice: list[int]) -> Plan | None:
        b, rc = [0] * (p * v), [0] * (p * v)
        for d, k in enumerate(choice):
            for j, (nb, nr) in enumerate(per_device[d][k]):
                b[d + j * p], rc[d + j * p] = nb, nr
        if min(b) < 1:
            return None
        out = plan_of(cm, cand, b, rc, gbs, model_ref)
        return out if fits(out, cap) else None

    def better(a: Plan | None, b: Plan) -> bool:  # the ILP's own spread may not fit (block_flights)
        return a is not None and (not fits(b, cap) or a.predicted.step_time_s < b.predicted.step_time_s * (1 - 1e-12))

    if math.prod(len(o) for o in per_device) > MAX_SPREADS:
        # Many blocks per chunk: one block's place moves the estimate by far less than the
        # 0.04% seen with 5 blocks (tests/planner/test_search.py), and trying them all costs
        # seconds (gpt3_175b, v=8: 0.6 s -> 10 s); keep the ILP's spread, or where its extra
        # blocks on the first chunks (which hold the most micro-batches) do not fit, try them
        # on the last chunks (`_placements` lists the even splits first, this one last of them)
        if fits(plan, cap):
            return plan
        last = [math.comb(v, sum(blocks[c] for c in range(d, p * v, p)) % v) - 1 for d in range(p)]
        return build(last) or plan
    for choice in itertools.product(*(range(len(o)) for o in per_device)):
        trial = build(list(choice))
        if better(trial, plan):
            plan = trial
    return plan


# Per device, every split of its blocks over its chunks is tried up to this many splits, else
# only the even ones (n // v each, the remainder on any of the chunks).
MAX_SPLITS_PER_DEVICE = 24


def _placements(n: int, r: int, v: int) -> list[list[tuple[int, int]]]:
    """Ways to put a device's n blocks (r recomputed) on its v chunks, the ILP's even spread first."""
    even = [[n // v + (1 if j in extra else 0) for j in range(v)] for extra in itertools.combinations(range(v), n % v)]
    splits = even
    if math.comb(n - 1, v - 1) <= MAX_SPLITS_PER_DEVICE:
        cuts = (itertools.combinations(range(1, n), v - 1))
        every = [[b - a for a, b in zip((0, *c), (*c, n), strict=True)] for c in cuts]
        splits = even + [sizes for sizes in every if sizes not in even]
    return [spread(sizes, r) for sizes in splits]


def plan_of(cm: CostModel, cand: Candidate, blocks, recompute, gbs: int, model_ref: str) -> Plan:
    cl, prof = cm.cluster, cm.profile
    plan = Plan(
        model=model_ref,
        hw=cl.name,
        nodes=-(-cand.world // cl.gpus_per_node),
        dp=cand.dp,
        tp=cand.tp,
        pp=cand.pp,
        ep=cand.ep,
        cp=cand.cp,
        capacity_factor=cand.capacity_factor,
        micro_batch=cand.mbs,
        global_batch=gbs,
        schedule=cand.schedule,
        virtual_stages=cand.v,
        zero=cand.zero,
        sequence_parallel=cand.sp,
        overlap_dp=cand.overlap_dp,
        dtype=cand.dtype,
        grad_compress=cand.grad_compress,
        fp8_scaling=cand.fp8_scaling,
        stages=(),
        model_args=dict(prof.args),
        seq_len=prof.seq_len or None,
    )
    return _restaged(cm, plan, blocks, recompute, cand.kind)
