"""Whether a plan file's recorded prediction still belongs to its plan (simulate, execute).

`smplan plan` writes its pick's predicted figures into the file. A file edited by hand (a
larger global batch, another micro-batch), or written by another smplan version or profile,
keeps figures that are no longer its plan's; `execute` compares a run with them and sizes a
Slurm job's --time from them, so it prices the plan again first.
"""

from __future__ import annotations

from smplan.hwprofiles import load_cluster
from smplan.planner import estimate_from_costs, profile_model
from smplan.planner.cost_model import plan_costs
from smplan.planner.model_file import split_ref
from smplan.simulator import simulate_plan

# `smplan plan` records its pick's simulated step (contention on, all-reduce), or the closed form's
# (--closed-form, or too many micro-batches to simulate): the same file simulated as it is gives
# one of the two to float rounding; past this share it is not that file's prediction any more
# (edited, or written by another smplan version or profile).
STALE_PREDICTION_SHARE = 0.01


def _matches(recorded_s: float, *step_times_s: float | None) -> bool:
    return any(t and abs(t / recorded_s - 1.0) <= STALE_PREDICTION_SHARE for t in step_times_s)


def stale_prediction_note(target: str, plan, step_time_s: float, closed_form_s: float | None) -> str | None:
    """One line when a plan file's recorded prediction is neither figure simulating it gives."""
    recorded = plan.predicted.step_time_s if plan.predicted is not None else None
    if not recorded or _matches(recorded, step_time_s, closed_form_s):
        return None
    return (f"note: {target} records a predicted step of {recorded:.4g} s but simulating it gives {step_time_s:.4g} s "
            "(the file was edited, or written by another smplan version or profile); `smplan plan ... -o` "
            "writes it anew, and `execute` compares a run with the simulated figure")


def model_changed(plan, model: str | None, model_args: dict | None) -> bool:
    """Whether --model / --arg given with a plan file build another model than the one it was
    priced for. The same file name and builder in another folder (a moved checkout) is the same model."""
    if model_args and any(plan.model_args.get(k) != v for k, v in model_args.items()):
        return True
    if not model:
        return False
    (theirs, their_builder), (ours, our_builder) = split_ref(plan.model), split_ref(model)
    return theirs.name != ours.name or their_builder != our_builder


def repriced(target: str, plan):
    """(plan, note): `plan` with predicted figures that are its own. The recorded ones stay when
    the closed form or the simulation of the plan gives them; else the simulated figures replace
    them, and the note says so."""
    recorded = plan.predicted
    if recorded is None:
        return plan, None
    try:
        profile = profile_model(plan.model, plan.model_args, plan.seq_len, plan.dtype)
        cluster = load_cluster(plan.hw, nodes=plan.nodes, overrides=plan.hw_overrides, stack=plan.stack)
        closed = estimate_from_costs(plan_costs(plan, profile, cluster))
    except ValueError:  # hardware that is no profile (a hand-written "local"): nothing to price with
        return plan, None
    if _matches(recorded.step_time_s, closed.step_time_s):
        return plan, None  # cheap first: a file written with --closed-form
    try:
        fresh = simulate_plan(plan, profile, cluster, record_events=False).figures
    except ValueError:  # too many micro-batches to simulate: the closed form, as `plan` records then
        fresh = closed
    if _matches(recorded.step_time_s, fresh.step_time_s):
        return plan, None
    note = (f"note: {target} records a predicted step of {recorded.step_time_s:.4g} s but its plan simulates to "
            f"{fresh.step_time_s:.4g} s (the file was edited, or written by another smplan version or profile); "
            "the run is compared with the simulated figures")
    return plan.replace(predicted=fresh), note
