"""Why the runner-ups lost, and the nearest change that makes an impossible request fit."""

from __future__ import annotations

from smplan.hwprofiles import Cluster

from .bounds import lower_bound
from .cost_model import CostModel
from .memory_model import capacity_bytes
from .model_profile import ModelProfile
from .plan import Plan
from .search_space import enumerate_candidates

GIB = 2.0**30
# Runner-ups within this share of the best's step time are reported as ties: the printed step
# times agree to 3 digits, so naming where the time went would blame a rounding difference.
TIE_SHARE = 5e-4


def explain(plans: list[Plan], rejected: list | None = None, limit: int = 3, objective: str = "time",
            without_cp: Plan | str | None = None, without_fix: tuple[str, Plan | str] | None = None) -> list[str]:
    """One line per runner-up: slower (or, under objective "cost", dearer) by how much and where
    the time went; OOM shapes. `without_cp` (search.best_without_cp): when the best splits the
    sequence (cp>1), a first line on what the best plan at cp=1 costs, or why none fits.
    `without_fix` = (the --fix keys set free, e.g. "cp=8"; the best plan without them or why none
    fits): what the user's layout keys cost against the search's own pick."""
    if not plans:
        return []
    best = plans[0].predicted
    lines = []
    if without_fix is not None:
        lines.append(_versus(f"without --fix {without_fix[0]}", without_fix[1], plans[0], objective))
    if plans[0].cp > 1 and without_cp is not None:
        lines.append(_versus("without cp", without_cp, plans[0], objective))
    for plan in plans[1:]:
        f = plan.predicted
        if objective == "cost":
            lines.append(_cost_line(plan, plans[0]))
            continue
        diff = {k: f.breakdown.get(k, 0.0) - best.breakdown.get(k, 0.0) for k in set(f.breakdown) | set(best.breakdown)}
        worst = max(diff, key=diff.get)
        # no kind of time to blame, on as many GPUs (so at the same cost): say it is a tie
        if abs(f.step_time_s / best.step_time_s - 1) < TIE_SHARE and plan.world_size == plans[0].world_size:
            lines.append(f"{_shape(plan)}: ties with the best ({f.step_time_s:.3f} s, {f.peak_memory_text} GiB vs "
                         f"{best.peak_memory_text} GiB): the cost model sees no difference between them")
            continue
        lines.append(
            f"{_shape(plan)}: {100 * (f.step_time_s / best.step_time_s - 1):+.1f}% step time "
            f"({f.step_time_s:.3f} s vs {best.step_time_s:.3f} s), mostly {worst.replace('_', ' ')} "
            f"(+{diff[worst]:.3f} s)"
        )
    oom = sorted((r for r in (rejected or []) if r[1] == "oom" and r[2] > 0), key=lambda r: r[2])
    seen = set()
    for cand, _, amount in oom:
        shape = (cand.dp, cand.tp, cand.pp, cand.mbs)
        if shape in seen:
            continue
        seen.add(shape)
        over = f"{amount / GIB:.1f} GiB" if amount >= 0.05 * GIB else f"{max(1.0, amount / 2**20):.0f} MiB"
        # a bound over every stage split and recompute choice: simulating one split can show more
        lines.append(f"{cand.describe()}: out of memory by at least {over} per GPU")
        if len(seen) >= limit:
            break
    return lines


def _gpu_seconds_per_token(plan: Plan) -> float:
    """What the cost objective ranks by (search.py: step time x GPUs over a step's tokens); the
    price per GPU-hour is one factor for every plan of a search, so it cannot change the order."""
    f = plan.predicted
    return f.step_time_s * plan.world_size / max(f.tokens_per_s * f.step_time_s, 1e-30)


def _cost_line(plan: Plan, best_plan: Plan) -> str:
    """A runner-up under objective "cost": how much dearer per token, and the step time and GPU
    count that make it so (a "mostly pp p2p" blame of step time would explain the wrong figure)."""
    f, best = plan.predicted, best_plan.predicted
    ratio = _gpu_seconds_per_token(plan) / _gpu_seconds_per_token(best_plan)
    where = (f"{f.step_time_s:.3f} s on {plan.world_size} GPUs vs {best.step_time_s:.3f} s on "
             f"{best_plan.world_size}")
    if abs(ratio - 1) < TIE_SHARE:
        return f"{_shape(plan)}: ties with the best on cost per token ({where})"
    price = ""
    if f.usd_per_step and best.usd_per_step:
        def per_million(x: Plan) -> float:
            return x.predicted.usd_per_step / (x.predicted.tokens_per_s * x.predicted.step_time_s) * 1e6
        price = f", ${per_million(plan):.3f} vs ${per_million(best_plan):.3f} per 1M tokens"
    return f"{_shape(plan)}: {100 * (ratio - 1):+.1f}% cost per token ({where}{price})"


def _shape(plan: Plan) -> str:
    sched = plan.schedule + (f" v={plan.virtual_stages}" if plan.virtual_stages > 1 else "")
    return f"{plan.degrees} mbs={plan.micro_batch} {sched} zero={plan.zero} recompute={plan.recompute}"


def _versus(label: str, other: Plan | str, best: Plan, objective: str) -> str:
    """"LABEL: +16.7% step time (shape: a s vs b s)": another search's best against the best (or why
    it has none)."""
    if isinstance(other, str):
        return f"{label}: {other}"
    alt, ours = other.predicted, best.predicted
    ratio = alt.step_time_s / ours.step_time_s
    if objective == "cost":
        return f"{label}: {_cost_line(other, best)}"
    if abs(ratio - 1) < TIE_SHARE:
        return (f"{label}: ties with the best ({_shape(other)}: {alt.step_time_s:.3f} s, {alt.peak_memory_text} GiB "
                f"vs {ours.peak_memory_text} GiB)")
    return f"{label}: {100 * (ratio - 1):+.1f}% step time ({_shape(other)}: {alt.step_time_s:.3f} s vs {ours.step_time_s:.3f} s)"


def nearest_feasible_change(profile: ModelProfile, cluster: Cluster, fixed: dict, result, max_nodes: int | None,
                            batch_given: bool = True) -> tuple[str, str]:
    """(what does not fit, the first of: recompute, ZeRO-3, a smaller micro-batch, more nodes, that fits).
    Without `batch_given` the global batch is the default, one sample per GPU, on any node count."""
    cap = capacity_bytes(cluster)

    def fits(fx: dict, cl: Cluster, mn) -> bool:
        cm = CostModel(profile, cl)
        return any(not lower_bound(cm, c, capacity_bytes(cl))[1] for c in enumerate_candidates(profile, cl, fx, mn))

    smallest = min((r[2] for r in result.rejected if r[1] == "oom" and r[2] > 0), default=0.0)
    head = f"no plan fits in {cluster.gpu.memory_gib:g} GiB per GPU on {cluster.num_gpus} GPUs"
    if smallest:
        head += f" (the closest is at least {max(0.1, smallest / GIB):.1f} GiB over)"
    tries = []
    if fixed.get("recompute") in ("none", "selective", "sac"):
        tries.append(("recompute=full", {**fixed, "recompute": "full"}))
    if fixed.get("zero", 3) != 3:
        tries.append(("zero=3", {**fixed, "zero": 3}))
    if fixed.get("micro_batch", 1) > 1:
        tries.append(("mbs=1", {**fixed, "micro_batch": 1}))
    for label, fx in tries:
        if fits(fx, cluster, max_nodes):
            return head, f"the smallest change that fits: {label}"
    fx = dict(fixed)
    if not batch_given:  # a rerun with more nodes defaults to their GPUs' count
        fx["global_batch"] = None

    def fits_on(fx: dict, cl: Cluster, mn) -> bool:
        return fits({**fx, "global_batch": fx["global_batch"] or cl.num_gpus}, cl, mn)

    def fewest_nodes(fx: dict) -> int | None:
        nodes = max_nodes or cluster.nodes
        for _ in range(8):
            if fits_on(fx, cluster.with_nodes(2 * nodes), None):
                return _fewest_nodes(profile, cluster, fx, nodes + 1, 2 * nodes, fits_on)
            nodes *= 2
        return None

    flag = "--max-nodes" if max_nodes else "--nodes"  # the option the user searched with
    # the user's --fix dp first (a hint that drops it named 5 nodes for --fix dp=8, which then did not fit)
    fewest = fewest_nodes(fx)
    if fewest:
        return head, f"the smallest change that fits: {flag} {fewest}"
    if "dp" in fx:  # more nodes at a fixed dp only grow tp x pp: without it they can add replicas
        fewest = fewest_nodes({k: v for k, v in fx.items() if k != "dp"})
        if fewest:
            return head, f"the smallest change that fits: {flag} {fewest} without --fix dp={fx['dp']}"
    if fx.get("zero", 3) != 3:  # more nodes shard the model states only under ZeRO-3
        fewest = fewest_nodes({**fx, "zero": 3})
        if fewest:
            return head, f"the smallest change that fits: {flag} {fewest} with zero=3"
    del cap
    # the fixed keys whose release could lower what a GPU holds (zero=3, recompute=full, mbs=1 are the least)
    pinned = [f"{k}={fx[k]}" for k in ("tp", "pp", "ep", "cp") if k in fx]
    pinned += [f"mbs={fx['micro_batch']}"] if fx.get("micro_batch", 1) > 1 else []
    pinned += [f"zero={fx['zero']}"] if fx.get("zero", 3) < 3 else []
    pinned += [f"recompute={fx['recompute']}"] if fx.get("recompute", "full") != "full" else []
    if pinned:  # what each GPU holds is the fixed keys', whatever the nodes (a review's mixtral with tp=pp=ep=1, zero=0)
        return head, (f"no node count within 256x fits with --fix {','.join(pinned)}, which set what each GPU holds: "
                      "drop one of them, or use a smaller model or GPUs with more memory")
    return head, "no change within 256x the nodes fits either: use a smaller model or GPUs with more memory"


# Node counts `_fewest_nodes` tries one by one; a wider range is first bisected on the bounds.
# A budget, not a physical figure: 16 counts of bounds take 0.1-1.2 s (a review's runs, 405B to
# DeepSeek-V3), which keeps a failed `plan` near the time of a successful one.
NODE_SCAN = 16
# ILP partitions one node count may try before it counts as not fitting: a budget too (each takes
# ~10-50 ms); candidates come in enumeration order, so past it a count that fits can be skipped
# and the hint names a larger one, never one that does not fit.
MAX_FIT_SOLVES = 60


def _fewest_nodes(profile: ModelProfile, cluster: Cluster, fx: dict, lo: int, hi: int, fits) -> int:
    """The fewest nodes in lo..hi on which a plan fits, by the search's own test (a candidate's
    ILP partition fits), `hi` (which the bounds let through) where none of them is shown to.
    The bounds are optimistic (a count they pass may not fit), and memory is not monotone in the
    node count (divisors of the layers and the batch)."""
    if hi - lo >= NODE_SCAN:  # bisect the bounds' test: the fewest nodes it lets through
        low, high = lo, hi
        while low < high:
            mid = (low + high) // 2
            low, high = (low, mid) if fits(fx, cluster.with_nodes(mid), None) else (mid + 1, high)
        lo = low
    for nodes in range(lo, min(hi, lo + NODE_SCAN)):
        bigger = cluster.with_nodes(nodes)
        if fits(fx, bigger, None) and _partition_fits(profile, bigger, {**fx, "global_batch": fx["global_batch"] or bigger.num_gpus}):
            return nodes
    return hi


def _partition_fits(profile: ModelProfile, cluster: Cluster, fx: dict) -> bool:
    from .ilp import partition_for

    cm, cap, tries = CostModel(profile, cluster), capacity_bytes(cluster), 0
    for cand in enumerate_candidates(profile, cluster, fx, None):
        if lower_bound(cm, cand, cap)[1]:
            continue
        if partition_for(cm, cand, cap) is not None:
            return True
        tries += 1
        if tries >= MAX_FIT_SOLVES:
            return False
    return False
