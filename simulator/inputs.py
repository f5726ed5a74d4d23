"""Turn what a user typed (a plan file, or a model with --hw and inline --plan keys) into
(plan, profile, cluster) for the step and run simulations."""

from __future__ import annotations

from smplan.hwprofiles import (
    DEFAULT_STACK,
    HardwareProfileError,
    load_cluster,
    load_stack,
    override_rule,
    parse_override,
)
from smplan.planner import Plan, PlanError, parse_inline, plan_from_inline, profile_model
from smplan.planner.feasibility import default_dtype
from smplan.planner.model_file import not_a_model_problem
from smplan.planner.plan import idle_nodes_problem, is_plan_file_name, model_not_found


def resolve_target(
    target: str,
    *,
    hw: str | None = None,
    nodes: int | None = None,
    hw_set: tuple[str, ...] | list[str] = (),
    plan_text: str | None = None,
    model_args: dict | None = None,
    seq_len: int | None = None,
    stack: str | None = None,
):
    """(plan, profile, cluster) from `PLAN.json`, or from `MODEL --hw HW --plan "tp=.."`.

    `stack` (--stack) replaces a plan file's stack, as `hw` replaces its hardware; for a model
    it is recorded in the plan and gives `overlap_dp` its default (hwprofiles/stack.py)."""
    if is_plan_file_name(target):
        if plan_text:
            raise PlanError(f"{target} is a plan file; drop --plan (or give a model file instead of the plan)")
        if model_args or seq_len:  # its stage split was made for the file's shape
            raise PlanError(f"{target} is a plan file, which fixes the model's --arg and --seq-len; drop them, or "
                            "plan that shape again (smplan plan MODEL --arg ... -o plan.json)")
        plan = Plan.load(target)
        missing = model_not_found(plan, target)
        if missing:
            raise PlanError(missing)
        if stack:
            plan = plan.replace(stack=stack)
        given = dict(parse_override(item) for item in hw_set)
        own = {k: v for k, v in plan.hw_overrides.items() if k not in given}  # --hw-set wins over the file
        if own:  # the file's own overrides, named as the file's (not --hw-set) when wrong
            base = load_cluster(hw or plan.hw, stack=plan.stack)  # a wrong --hw or stack is not the file's
            try:
                base.with_overrides(own)
            except HardwareProfileError as err:
                raise PlanError(f"{target}: hw_overrides: {override_rule(err)}; fix the plan file") from None
        overrides = {**plan.hw_overrides, **given}
        cluster = load_cluster(hw or plan.hw, nodes=nodes or plan.nodes, overrides=overrides, stack=plan.stack)
        idle = nodes and idle_nodes_problem(target, plan.world_size, cluster.gpus_per_node, nodes)
        if idle:  # the plan's layout would run on its first nodes, the rest idle
            raise PlanError(f"{idle}: drop --nodes, re-plan for them (smplan plan MODEL --nodes {nodes}) or compare "
                            "sizes (smplan whatif --vary nodes=...)")
        # on the file's own hardware only: another --hw may hold more GPUs per node
        idle = not (nodes or hw) and idle_nodes_problem(target, plan.world_size, cluster.gpus_per_node, cluster.nodes)
        if idle:  # a hand-edited file: its degrees no longer fill the nodes it names
            raise PlanError(f"{idle}: set its nodes to what dp x tp x pp x cp uses, or its degrees to fill them, "
                            "or re-plan (smplan plan MODEL --nodes N -o plan.json)")
        profile = profile_model(plan.model, plan.model_args, plan.seq_len, plan.dtype)
        return plan.replace(hw_overrides=overrides), profile, cluster  # the overrides simulated: file's and --hw-set's
    not_a_model = not_a_model_problem(target)
    if not_a_model:
        raise PlanError(not_a_model)
    if not hw:
        raise PlanError(f"{target!r} is not a plan file, so it is a model: give --hw NAME (smplan hw list) and --plan")
    if not plan_text:
        raise PlanError('a model needs --plan "tp=..,pp=..,dp=..,mbs=..,gbs=.." (omitted keys take defaults)')
    keys = parse_inline(plan_text)
    cluster = load_cluster(hw, nodes=nodes, overrides=list(hw_set), stack=stack)
    keys.setdefault("overlap_dp", load_stack(stack).overlap_grad_reduce)
    keys.setdefault("dtype", default_dtype(cluster.gpu.peak_tflops, cluster.gpu.name))  # as `plan` does: fp16 on a V100
    profile = profile_model(target, model_args or {}, seq_len, keys["dtype"])
    cannot = profile.degree_problem(**{k: keys.get(k) for k in ("tp", "pp", "cp", "ep")})
    if cannot:  # before plan_from_inline's rules on the cluster's size, whose hints would lead into it
        raise PlanError(cannot)
    plan = plan_from_inline(
        keys,
        model=target,
        hw=hw,
        nodes=cluster.nodes,
        gpus_per_node=cluster.gpus_per_node,
        num_blocks=profile.num_blocks,
        model_args=model_args,
        seq_len=seq_len,
        hw_overrides=dict(parse_override(item) for item in hw_set),
    ).replace(stack=stack or DEFAULT_STACK)
    idle = nodes and idle_nodes_problem(f"--plan {plan_text!r}", plan.world_size, cluster.gpus_per_node, nodes)
    if idle:
        raise PlanError(f"{idle}: drop dp= from --plan (it then fills the nodes) or drop --nodes")
    return plan, profile, cluster
