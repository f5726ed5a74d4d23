"""Run a what-if sweep: profile once per model variant, evaluate points in parallel
processes, choose the recommended point and compute its details.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from smplan.display import days_text
from smplan.hwprofiles import load_stack
from smplan.planner import parse_inline
from smplan.report.points import POINTS_VERSION, conditions_only, derive, unit_of

from .details import details
from .grid import PointSpec, grid
from .point import evaluate, plan_from_record, point_cluster
from .question import Question

# A point is recommended if it is the cheapest (per token) among those within this factor
# of the best time to train (or throughput): fast enough, without paying for the last 20%.
NEAR_BEST = 1.25
SPAWN_COST_S = 1.5  # starting one spawned worker (imports), measured on a 2-core machine

_WORKER: dict = {}


def run_whatif(q: Question, jobs: int | None = None, progress=None, note=None) -> dict:
    """The points record (smplan.report.points schema) of question `q`.

    `progress(done, total, label, elapsed_s)` is called before the first point (done 0) and after every point; `note(text)` before a
    slow step (profiling a model that is not cached: seconds to minutes for hf: models); `jobs`
    processes evaluate points in parallel (default: the CPU count; 1 = in this process).
    """
    load_stack(q.stack)  # a wrong --stack is the user's one-line error, not a reason on every point
    specs = grid(list(q.varies))
    q = _one_global_batch(q, specs)
    profiles = _profiles(q, specs, note)
    tasks = [(spec, _profile_key(q, spec)) for spec in specs]
    points = _map(q, tasks, profiles, jobs, progress)
    if not any(getattr(profile, "seq_len", 0) for profile in profiles.values()):  # a failed profile is a str
        q = dataclasses.replace(q, unit="sample")
    if all((p["reason"] or "").startswith("internal error") for p in points):
        raise RuntimeError(f"every point failed: {points[0]['reason']}")
    record = {"version": POINTS_VERSION, "question": q.to_dict(), "points": points}
    derive(record)
    rid, why = recommend(record)
    models = [v.key for v in q.varies if v.kind == "arg"]
    if rid is not None and models and _work_per_token_differs(points):
        # a smaller model trains more tokens: the pick says what it compared
        why = (f"The points build different models ({', '.join(models)} varies), whose {q.unit}s are not worth "
               f"the same: this compares their cost and speed only. {why}")
    keys = [v.key for v in q.varies]
    if rid is not None and conditions_only(keys):
        why = _best_case(points, rid, keys)
    record["recommended"], record["recommendation"] = rid, why
    record["details"] = {}
    if rid is not None:
        point = points[rid]
        spec = specs[rid]
        profile = profiles[_profile_key(q, spec)]
        record["details"] = details(q, point, plan_from_record(point), profile, point_cluster(q, spec))
    return record


def _best_case(points: list[dict], rid: int, keys: list[str]) -> str:
    """Why a sweep of conditions (a GPU's MTBF, the restart time) has no recommendation: none of
    them is the user's to choose; the goodput they span is the answer (when the points have runs)."""
    said = f"The varied {', '.join(keys)} describe the cluster, not a choice: #{rid} is the best case."
    timed = [p for p in points if p["feasible"] and p.get("run")]
    if len(timed) < 2:
        return said
    low, high = min(timed, key=lambda p: p["run"]["goodput"]), max(timed, key=lambda p: p["run"]["goodput"])
    if f"{low['run']['goodput']:.1%}" == f"{high['run']['goodput']:.1%}":  # one figure, not a range of one point
        return f"{said} Goodput is {high['run']['goodput']:.1%} at every point."
    return (f"{said} Goodput runs from {low['run']['goodput']:.1%} (#{low['id']} {low['label']}) to "
            f"{high['run']['goodput']:.1%} (#{high['id']} {high['label']}).")


# Model FLOPs per token differing by more than this share among the points: models of another
# size (this module's choice, not measured; an argument that only picks a kernel leaves the work
# per token as it is, tests/cli/test_whatif_review_cli.py).
MODEL_WORK_SHARE = 0.05


def _work_per_token_differs(points: list[dict]) -> bool:
    """Whether the feasible points' model FLOPs per token (model TFLOP/s x GPUs / tokens/s) differ
    by more than MODEL_WORK_SHARE: their tokens are then not worth the same."""
    work = [p["figures"]["model_tflops_per_gpu"] * p["num_gpus"] / p["figures"]["tokens_per_s"]
            for p in points if p["feasible"] and p["figures"]["tokens_per_s"] > 0]
    return bool(work) and max(work) > (1 + MODEL_WORK_SHARE) * min(work)


def _one_global_batch(q: Question, specs: list[PointSpec]) -> Question:
    """Every point trains the same recipe: without a global batch from the user (--global-batch,
    gbs in --plan, or varied), all points take the planner's default of the largest point
    (one sequence per GPU there), so adding GPUs is strong scaling, not a bigger batch."""
    fixed_in_plan = q.plan is not None and "global_batch" in parse_inline(q.plan)
    if q.global_batch is not None or fixed_in_plan or any(spec.global_batch for spec in specs):
        return q
    try:
        largest = max(point_cluster(q, spec).num_gpus for spec in specs)
    except ValueError:
        return q  # a point's cluster does not load: that point reports it
    return dataclasses.replace(q, global_batch=largest, global_batch_is_default=True)


def _profile_key(q: Question, spec: PointSpec) -> tuple:
    """(model args, seq_len, dtype): what the point's profile depends on."""
    from .point import point_cluster, point_dtype

    args = {**q.model_args, **spec.model_args}
    try:
        dtype = point_dtype(q, spec, point_cluster(q, spec))
    except ValueError:  # the point's cluster does not load: the point reports it
        dtype = q.dtype or "bf16"
    return tuple(sorted(args.items())), spec.seq_len or q.seq_len, dtype


def _profiles(q: Question, specs: list[PointSpec], note=None) -> dict:
    """One ModelProfile per distinct (model args, seq_len, dtype); a failure is the reason string.

    When nothing model-related varies, or every variant fails, it is the user's error: raise it.
    """
    from smplan.planner.profiler import profile_model

    out: dict = {}
    varies_model = any(v.kind in ("arg", "seq_len") for v in q.varies)
    first = None
    for spec in specs:
        key = _profile_key(q, spec)
        if key in out:
            continue
        args, seq_len, dtype = dict(key[0]), key[1], key[2]
        try:
            out[key] = profile_model(q.model, args=args, seq_len=seq_len, dtype=dtype, progress=note)
        except ValueError as err:
            if not varies_model:
                raise
            out[key] = f"the model cannot be built with {spec.label}: {err}"
            first = first or err
    if all(isinstance(v, str) for v in out.values()):
        raise first
    return out


def _map(q: Question, tasks, profiles: dict, jobs: int | None, progress) -> list[dict]:
    """Evaluate every task; the first in this process, the rest in a pool when worth it.

    Starting spawned workers costs about a second each (imports); a sweep whose points
    take milliseconds (a fixed plan) runs faster in this process.
    """
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))
    done: list[dict | None] = [None] * len(tasks)
    start = time.perf_counter()

    def finish(i: int, point: dict) -> None:
        done[i] = point
        if progress is not None:
            progress(sum(p is not None for p in done), len(tasks), point["label"], time.perf_counter() - start)

    spec, key = tasks[0]
    if progress is not None:  # the first point plans and simulates in seconds: say the sweep started
        progress(0, len(tasks), f"planning {spec.label}", 0.0)
    finish(0, evaluate(q, spec, profiles[key]))
    first_s = time.perf_counter() - start
    rest = list(range(1, len(tasks)))
    if jobs == 1 or first_s * len(rest) < SPAWN_COST_S * 2:
        for i in rest:
            spec, key = tasks[i]
            finish(i, evaluate(q, spec, profiles[key]))
        return done
    # spawn: the parent may hold torch's thread pools (profiling); forking those can hang.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init, initargs=(q, profiles)) as pool:
        futures = {pool.submit(_evaluate, *tasks[i]): i for i in rest}
        for fut in as_completed(futures):
            finish(futures[fut], fut.result())
    return done


def _init(q: Question, profiles: dict) -> None:
    _WORKER["q"], _WORKER["profiles"] = q, profiles


def _evaluate(spec: PointSpec, key) -> dict:
    return evaluate(_WORKER["q"], spec, _WORKER["profiles"][key])


def recommend(record: dict) -> tuple[int | None, str]:
    """(id, why): the cheapest point among those near the best time to train / throughput."""
    ok = [p for p in record["points"] if p["feasible"]]
    unit = unit_of(record)
    if not ok:  # each reason once, in the points' order (the table's)
        reasons = list(dict.fromkeys(p["reason"] for p in record["points"] if p.get("reason")))
        return None, "; ".join(reasons[:3]) or "no point could be evaluated"
    timed = [p for p in ok if p.get("run")]
    if timed and record["question"].get("tokens"):
        best = min(p["run"]["days"] for p in timed)
        near = [p for p in timed if p["run"]["days"] <= NEAR_BEST * best]
        pick = min(near, key=lambda p: (p["run"]["usd"], p["run"]["days"]))
        why = (f"The cheapest point (${pick['run']['usd']:,.0f}) among those within {NEAR_BEST:g}x of the "
               f"fastest time to train ({days_text(best)} days).")
    elif timed:
        best = max(p["run"]["tokens"] for p in timed)
        near = [p for p in timed if p["run"]["tokens"] * NEAR_BEST >= best]
        pick = min(near, key=lambda p: (p["run"]["usd"] / p["run"]["tokens"], -p["run"]["tokens"]))
        why = (f"The lowest cost per {unit} among the points that train within {NEAR_BEST:g}x of the most "
               f"{unit}s ({best:.3g}) in {record['question']['days']:g} days.")
    else:
        best = max(p["figures"]["tokens_per_s"] for p in ok)
        near = [p for p in ok if p["figures"]["tokens_per_s"] * NEAR_BEST >= best]
        pick = min(near, key=lambda p: p["figures"]["usd_per_step"] / max(p["figures"]["tokens_per_s"], 1e-30)
                   / max(p["figures"]["step_time_s"], 1e-30))
        # no run: the cost of a step (its time x the GPUs x the price per GPU-hour) over its tokens
        why = (f"The lowest cost per {unit} of a step (step time x GPUs x price per GPU-hour; --tokens or --days "
               f"adds failures and checkpoints) among the points within {NEAR_BEST:g}x of the best throughput "
               f"({best:,.0f} {unit}s/s).")
    return pick["id"], why
