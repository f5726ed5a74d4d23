"""One point of a sweep: cluster, plan (searched or fixed), simulated step, run over time.

`evaluate` never raises for a point that cannot run: it returns the point record with
`feasible: false` and the reason (no plan fits, the fixed plan does not fit in memory,
the degrees do not divide the cluster...). Only the planner, the simulator and hwprofiles
public functions are called.
"""

from __future__ import annotations

import dataclasses

from smplan.display import memory_need_text
from smplan.errors import is_user_error
from smplan.hwprofiles import DEFAULT_STACK, Cluster, load_cluster, load_stack
from smplan.hwprofiles.paths import recorded_ref
from smplan.planner import ModelProfile, Plan, even_stages, parse_inline, plan_from_inline
from smplan.planner.plan import idle_nodes_problem

from .grid import PointSpec
from .question import Question
from .run import run_record


class InfeasiblePoint(ValueError):
    """This point cannot run as asked; the message is the reason shown in the report."""


def point_cluster(q: Question, spec: PointSpec) -> Cluster:
    overrides = {**q.hw_overrides, **spec.cluster_overrides}
    return load_cluster(spec.hw or q.hw, nodes=spec.nodes or q.nodes, overrides=overrides, stack=_stack(q, spec))


def point_dtype(q: Question, spec: PointSpec, cluster: Cluster) -> str:
    """This point's training dtype: a --vary or --plan dtype, else the question's, else the GPU's
    default, as `smplan plan` and `simulate` take it (fp16 on a V100, fp32 on a probed CPU)."""
    from smplan.planner.feasibility import default_dtype

    fixed = {**(parse_inline(q.plan) if q.plan else {}), **spec.plan_keys}.get("dtype")
    return fixed or q.dtype or default_dtype(cluster.gpu.peak_tflops, cluster.gpu.name)


def _stack(q: Question, spec: PointSpec) -> str:
    """This point's stack: a --vary stack value, else --stack, else the default."""
    return spec.stack or q.stack or DEFAULT_STACK


def point_plan(q: Question, spec: PointSpec, profile: ModelProfile, cluster: Cluster) -> Plan:
    """The fixed plan with this point's overrides, or the planner's best plan here."""
    gbs = spec.global_batch or q.global_batch
    # the hardware and stack as a plan file records them (a path made absolute, not the file's name)
    common = dict(model=q.model, hw=recorded_ref(spec.hw or q.hw), nodes=cluster.nodes)
    stack = recorded_ref(_stack(q, spec))
    overlap_dp = load_stack(stack).overlap_grad_reduce  # the stack's default for an unfixed overlap_dp
    if q.plan is not None:
        keys = {"overlap_dp": overlap_dp, "dtype": point_dtype(q, spec, cluster), **parse_inline(q.plan),
                **spec.plan_keys}
        if gbs:
            keys["global_batch"] = gbs
        plan = plan_from_inline(
            keys, gpus_per_node=cluster.gpus_per_node, num_blocks=profile.num_blocks,
            model_args=profile.args, seq_len=profile.seq_len or None, hw_overrides=_overrides(q, spec), **common,
        ).replace(stack=stack)
        idle = idle_nodes_problem("the plan", plan.world_size, cluster.gpus_per_node, cluster.nodes)
        if idle:  # its figures would be labelled with GPUs that do nothing
            given = "--vary dp" if "dp" in spec.plan_keys else "dp= in --plan"
            raise InfeasiblePoint(f"{idle}: {given} fixes it; leave dp out to fill each size")
        return plan
    from smplan.planner.search import search
    from smplan.simulator.rank import RANKED_PLANS, rank_by_simulation

    constraints: dict = {"top": RANKED_PLANS, "dtype": point_dtype(q, spec, cluster), "overlap_dp": overlap_dp}
    if spec.plan_keys:
        constraints["fix"] = dict(spec.plan_keys)
    if gbs:
        constraints["global_batch"] = gbs
    result = search(profile, cluster, **constraints, alternates=True)
    plans = result.plans
    if not plans:
        raise InfeasiblePoint(f"no plan fits {cluster.num_gpus} x {cluster.gpu.name} ({cluster.gpu.memory_gib:g} GiB)")
    # as `smplan plan` picks: the search's best few, ranked by their simulated step
    plans, alternates = ([p.replace(model=q.model, model_args=profile.args, hw=common["hw"], hw_overrides=_overrides(q, spec),
                                    stack=stack)
                          for p in some] for some in (plans, result.alternates))
    return rank_by_simulation(plans, lambda _: cluster, profile=profile, alternates=alternates)[0][0]


def _overrides(q: Question, spec: PointSpec) -> dict:
    return {**q.hw_overrides, **spec.cluster_overrides}


def evaluate(q: Question, spec: PointSpec, profile: ModelProfile | str) -> dict:
    """The point record (smplan.report.points schema) of one grid point."""
    point = {"id": spec.id, "label": spec.label, "settings": dict(spec.settings), "feasible": False,
             "reason": None, "plan": None, "plan_label": None, "plan_inline": None, "figures": None,
             "run": None, "hw": spec.hw or q.hw, "gpu": "", "nodes": spec.nodes or q.nodes or 0,
             "num_gpus": 0, "memory_capacity_gib": 0.0, "usd_per_gpu_hour": 0.0, "moe": False}
    try:
        cluster = point_cluster(q, spec)
        point.update(hw=cluster.name, gpu=cluster.gpu.name, nodes=cluster.nodes, num_gpus=cluster.num_gpus,
                     memory_capacity_gib=float(cluster.gpu.memory_gib), usd_per_gpu_hour=cluster.cost.usd_per_gpu_hour)
        if isinstance(profile, str):  # the profile of this point's model args failed
            raise InfeasiblePoint(profile)
        point["moe"] = profile.num_experts > 1  # priced with the stack's host time per MoE layer at any ep
        plan = point_plan(q, spec, profile, cluster)
        point.update(plan=_plan_dict(plan), plan_label=plan_label(plan), plan_inline=plan_inline(plan))
        figures, capacity, _ = simulate(plan, profile, cluster)
        point.update(figures=figures, memory_capacity_gib=capacity)
        if figures["peak_memory_gib"] > point["memory_capacity_gib"]:
            raise InfeasiblePoint(
                f"needs {memory_need_text(figures['peak_memory_gib'])} GiB on its fullest GPU (its memory reserve included) but "
                f"{cluster.gpu.name} has {point['memory_capacity_gib']:g} GiB; add recompute, zero, tp or pp"
            )
        if q.timed:
            point["run"] = run_record(q, spec, plan, figures, cluster, profile.params)
        point["feasible"] = True
    except Exception as err:
        if is_user_error(err):  # our packages' one-line errors: this point cannot run
            point["reason"] = str(err)
        else:  # a bug (a plain ValueError too) must not pass for an infeasible point, nor lose the others
            point["reason"] = f"internal error ({type(err).__name__}: {err}); please report it"
    return point


def simulate(plan: Plan, profile: ModelProfile, cluster: Cluster, record_events: bool = False):
    """(figures dict, usable GiB per GPU, StepResult) of one simulated step of `plan`."""
    from smplan.simulator import simulate_plan

    result = simulate_plan(plan, profile, cluster, record_events=record_events)
    return result.figures.to_dict(), result.memory_capacity_gib, result


def _plan_dict(plan: Plan) -> dict:
    data = plan.to_dict()
    data.pop("predicted", None)
    return data


def plan_label(plan: Plan) -> str:
    """Short, human: "tp=8 pp=4 dp=2 mbs=1 gbs=512 recompute=full" (of some blocks: "recompute=full 34/80")."""
    parts = [f"tp={plan.tp}", f"pp={plan.pp}", f"dp={plan.dp}"]
    parts += [f"{k}={getattr(plan, k)}" for k in ("ep", "cp") if getattr(plan, k) > 1]
    parts += [f"mbs={plan.micro_batch}", f"gbs={plan.global_batch}"]
    if plan.dtype == "fp8":
        parts.append("mxfp8" if plan.fp8_scaling == "block" else "fp8")
    if plan.schedule != "1f1b" and plan.pp > 1:
        parts.append(plan.schedule + (f" v={plan.virtual_stages}" if plan.virtual_stages > 1 else ""))
    if plan.zero:
        parts.append(f"zero={plan.zero}")
    if plan.sequence_parallel and plan.tp > 1:
        parts.append("sp")
    if plan.recompute != "none":
        parts.append(plan.recompute_label)  # "recompute=full 34/80"
    return " ".join(parts)


def plan_inline(plan: Plan) -> str:
    """The --plan form; `stages=` carries the stage split and per-chunk recompute counts where
    they differ from the even split with every block recomputed (the inline default)."""
    keys = [f"tp={plan.tp}", f"pp={plan.pp}", f"dp={plan.dp}", f"mbs={plan.micro_batch}",
            f"gbs={plan.global_batch}", f"recompute={plan.recompute}", f"schedule={plan.schedule}"]
    if plan.schedule == "interleaved":
        keys.append(f"v={plan.virtual_stages}")
    keys += [f"sp={int(plan.sequence_parallel)}", f"zero={plan.zero}", f"overlap_dp={int(plan.overlap_dp)}"]
    keys += [f"{k}={getattr(plan, k)}" for k in ("ep", "cp") if getattr(plan, k) > 1]
    if plan.capacity_factor != 1.0:
        keys.append(f"cf={plan.capacity_factor:g}")
    if plan.dtype != "bf16":
        keys.append(f"dtype={plan.dtype}")
    if plan.fp8_scaling != "tensor":
        keys.append(f"fp8_scaling={plan.fp8_scaling}")
    if plan.grad_compress != "none":
        keys.append(f"grad_compress={plan.grad_compress}")
    even = even_stages(plan.stages[-1].last_block, len(plan.stages), plan.recompute)
    if [(s.num_blocks, s.num_recomputed) for s in plan.stages] != [(s.num_blocks, s.num_recomputed) for s in even]:
        keys.append("stages=" + "/".join(f"{s.num_blocks}:{s.num_recomputed}" for s in plan.stages))
    return ",".join(keys)


def plan_from_record(point: dict) -> Plan:
    """The Plan of a point record (for the recommended point's details)."""
    data = dict(point["plan"])
    return Plan.from_dict({k: v for k, v in data.items() if k in {f.name for f in dataclasses.fields(Plan)}})
