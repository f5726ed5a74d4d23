"""Whether a plan file's recorded prediction still belongs to its plan (`smplan simulate` and
`smplan execute` say so; a library user running a plan file calls `repriced` the same way).

`smplan plan` writes its pick's predicted figures into the file. A file edited by hand (a
larger global batch, another micro-batch), or written by another smplan version or profile,
keeps figures that are no longer its plan's; `execute` compares a run with them and sizes a
Slurm job's --time from them, so it prices the plan again first.
"""

from __future__ import annotations

from smplan.hwprofiles import bundled_profiles, load_cluster
from smplan.hwprofiles.paths import is_path
from smplan.planner import estimate_from_costs, profile_model
from smplan.planner.cost_model import plan_costs
from smplan.planner.model_file import split_ref

from .api import simulate_plan

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
    return _stale(target, recorded, step_time_s, "`smplan plan ... -o` writes it anew, and `execute` compares a run "
                  "with the simulated figure")


def _stale(target: str, recorded_s: float, simulated_s: float, then: str) -> str:
    return (f"note: {target} records a predicted step of {recorded_s:.4g} s but simulating it gives {simulated_s:.4g} s "
            f"(the file was edited, or written by another smplan version or profile); {then}")


def model_changed(plan, model: str | None, model_args: dict | None, defaults: dict | None = None) -> bool:
    """Whether --model / --arg given with a plan file build another model than the one it was
    priced for. `defaults`: the builder's own argument defaults, so that an --arg giving the value
    the plan already built with changes nothing. The same file name and builder in another folder
    (a moved checkout) is the same model."""
    built = {**(defaults or {}), **plan.model_args}
    missing = object()
    if model_args and any(built.get(k, missing) != v for k, v in model_args.items()):
        return True
    if not model:
        return False
    (theirs, their_builder), (ours, our_builder) = split_ref(plan.model), split_ref(model)
    return theirs.name != ours.name or their_builder != our_builder


def repriced(target: str, plan):
    """(plan, note, priced): `plan` with predicted figures that are its own. The recorded ones stay
    when the closed form or the simulation of the plan gives them; else the simulated figures
    replace them, and the note says so. `priced` is False where they could not be priced here
    (the note says why)."""
    recorded = plan.predicted
    if recorded is None:
        return plan, None, True
    if plan.hw not in bundled_profiles() and not is_path(plan.hw):
        return plan, None, True  # hardware that is no profile (a hand-written "local"): nothing to price with
    try:
        profile = profile_model(plan.model, plan.model_args, plan.seq_len, plan.dtype)
        cluster = load_cluster(plan.hw, nodes=plan.nodes, overrides=plan.hw_overrides, stack=plan.stack)
        closed = estimate_from_costs(plan_costs(plan, profile, cluster))
    except ValueError as err:  # a profile file moved away, a stack gone: say the figures went unchecked
        reason = (str(err).splitlines() or [type(err).__name__])[0]
        return plan, (f"note: {target}'s predicted figures could not be checked against its plan ({reason}); the "
                      "run is compared with them as recorded"), False
    if _matches(recorded.step_time_s, closed.step_time_s):
        return plan, None, True  # cheap first: a file written with --closed-form
    try:
        fresh = simulate_plan(plan, profile, cluster, record_events=False).figures
    except ValueError:  # too many micro-batches to simulate: the closed form, as `plan` records then
        fresh = closed
    if _matches(recorded.step_time_s, fresh.step_time_s):
        return plan, None, True
    note = _stale(target, recorded.step_time_s, fresh.step_time_s, "the run is compared with the simulated figures")
    return plan.replace(predicted=fresh), note, True
