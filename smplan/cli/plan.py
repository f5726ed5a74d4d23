"""`smplan plan MODEL --hw HW`: the best parallel plans (smplan.planner.search.plan_model)."""

from __future__ import annotations

from pathlib import Path

import click

from smplan.display import mfu_percent_text
from smplan.hwprofiles import DEFAULT_STACK, PROBED_CPU_NAME, load_stack, parse_override
from smplan.hwprofiles.paths import recorded_ref
from smplan.planner.explain import explain
from smplan.planner.plan import is_plan_file_name
from smplan.planner.search import plan_model
from smplan.simulator.rank import RANKED_PLANS as RANKED
from smplan.simulator.rank import alternates_within_budget, rank_by_simulation, too_long_to_rank

from .checks import check_output_file
from .main import UserError
from .notes import (
    a2a_overlap_note,
    batch_divisors_note,
    capped_context_note,
    causal_mfu_note,
    gemm_tile_note,
    host_wait_note,
    not_offered_note,
    sac_stack_note,
)
from .options import (
    GLOBAL_BATCH,
    NODES,
    SEQ_LEN,
    cluster_from,
    dtype_option,
    echo_json,
    hw_options,
    json_option,
    model_args_from,
    model_args_option,
    non_empty_path,
    warn_about_profiles,
)
from .table import format_table, sequence_phrase


@click.command()
@click.argument("model", metavar="MODEL")
@hw_options()
@click.option("--max-nodes", type=NODES, default=None,
              help="Search node counts from --nodes (default 1) up to N, instead of exactly --nodes.")
@model_args_option
@click.option("--global-batch", type=GLOBAL_BATCH, default=None, help="Sequences per optimizer step (default: one per GPU).")
@click.option("--seq-len", type=SEQ_LEN, default=None, help="Sequence length (builder argument).")
@dtype_option
@click.option("--fix", "fix", multiple=True, metavar="KEY=VALUE",
              help="Fix a plan key (inline plan keys: tp, pp, dp, ep, cp, mbs, zero, recompute, schedule, v, sp, overlap_dp, dtype, cf (MoE: the busiest expert's load over the average, >= 1, default 1.0), grad_compress, fp8_scaling=tensor|block (MXFP8, with dtype fp8); v>1 implies schedule=interleaved). A fixed recompute=KIND recomputes every block, as Megatron's flag does; unfixed, the search recomputes only the blocks memory needs. Repeatable, each key once.")
@click.option("--objective", type=click.Choice(["time", "cost"]), default="time", show_default=True,
              help="time: the fastest step; cost: the fewest dollars per token (with --max-nodes, fewer nodes may win).")
@click.option("--top", type=click.IntRange(min=1), default=5, show_default=True, help="Plans to list.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, callback=non_empty_path, help="Write the best plan (JSON).")
@click.option("--force", is_flag=True, help="Overwrite --output if it exists.")
@click.option("--explain", "show_explain", is_flag=True, help="Say why the runner-ups lost, why a dimension is not offered, and what --fix's "
              "layout keys cost against the best plan without them.")
@click.option("--closed-form", is_flag=True,
              help=f"Rank by the search's closed-form estimate only; by default its best {RANKED} plans are "
                   "simulated (as `smplan simulate` does) and ranked by that.")
@json_option
def plan(model, hw, stack, nodes, hw_set, max_nodes, model_args, global_batch, seq_len, dtype, fix, objective, top,
         output, force, show_explain, closed_form, as_json) -> None:
    """Find the fastest (or cheapest) way to train MODEL on the cluster.

    MODEL is a model file, path/to/model.py[:builder] (README: The model file), or hf:DIR, a folder
    holding a Hugging Face config.json (built from it: no weights, no download).

    \b
    Examples:
      smplan plan examples/gpt.py:gpt3_175b --hw a100x8 --nodes 128 --global-batch 1536
      smplan plan examples/gpt.py:tiny --hw a100x8 --fix tp=2 --top 3 --explain
      smplan plan examples/gpt.py:llama3_8b --hw a100x8 --max-nodes 4 --objective cost -o plan.json

    Plans may fill a GPU up to its memory less efficiency.memory_reserve_gib (2 GiB: CUDA
    context, NCCL buffers, fragmentation; 0.5 GiB in a profile `smplan hw probe` wrote on a CPU). For more headroom, raise it, e.g.
    --hw-set efficiency.memory_reserve_gib=8.
    """
    check_output_file(output, "-o/--output", force)
    # the other commands tell a plan file from a model by its name (a device such as /dev/null is no file)
    if output and not is_plan_file_name(output) and (Path(output).is_file() or not Path(output).exists()):
        raise UserError(f"-o {output}: a plan file's name ends in .json, which is how simulate, reliability "
                        f"and whatif tell it from a model; use -o {Path(output).with_suffix('.json')}")
    cluster = cluster_from(hw, max_nodes or nodes, hw_set, stack)
    warned = warn_about_profiles(hw, stack=stack, overrides=dict(parse_override(kv) for kv in hw_set))
    before = [*warned, gemm_tile_note(cluster)]  # the notes said before the table (stderr), in --json's notes first
    if before[-1]:
        click.echo(before[-1], err=True)
    result = plan_model(
        model, cluster, model_args=model_args_from(model_args), seq_len=seq_len, dtype=dtype,
        global_batch=global_batch, fix=",".join(fix) or None, objective=objective,
        top=top if closed_form else max(top, RANKED), max_nodes=max_nodes,
        min_nodes=nodes if max_nodes else None, progress=lambda msg: click.echo(msg, err=True),
        overlap_dp=load_stack(stack).overlap_grad_reduce,  # the stack's default; --fix overlap_dp=.. wins
        without_cp=show_explain,  # --explain sets a cp plan against the best at cp=1
        without_fix=show_explain,  # and the best against the best with --fix's layout keys free
        alternates=not closed_form,  # runner-ups of the best layouts, for the simulated ranking
    )
    plans = [p.replace(stack=recorded_ref(stack) if stack else DEFAULT_STACK) for p in result.plans]
    simulated, alternates = False, []
    if not closed_form:
        # each as `smplan simulate PLAN.json` will run it: the plan's hardware, nodes and stack
        alternates = alternates_within_budget([p.replace(stack=plans[0].stack) for p in result.alternates])
        plans, simulated = rank_by_simulation(plans, lambda p: cluster_from(hw, p.nodes, hw_set, stack), objective,
                                              alternates=alternates)
        if not simulated:
            before.append(f"note: {sum(map(too_long_to_rank, plans))} of the best {len(plans)} plans run too many "
                          "micro-batches to simulate quickly, so all keep the search's closed-form ranking "
                          "(`smplan simulate PLAN.json` may differ by a few %)")
            click.echo(before[-1], err=True)
    # each as the -o file records it (the --hw given, a path made absolute, and --hw-set's values typed as
    # the loader types them): `plan --json | jq .plans[0].plan` simulates as the plan file does
    placed = {"hw": recorded_ref(hw), "hw_overrides": dict(parse_override(kv) for kv in hw_set)}
    plans = [p.replace(**placed) for p in plans[:top]]

    def like_the_best(other):
        """Another search's best, priced as the best was (simulated where it was): or why there is none."""
        if isinstance(other, str | None):
            return other
        other = other.replace(stack=plans[0].stack)
        if simulated:  # figures of one kind with the best's
            other = rank_by_simulation([other], lambda p: cluster_from(hw, p.nodes, hw_set, stack), objective)[0][0]
        return other

    without_cp = like_the_best(result.without_cp) if show_explain and plans[0].cp > 1 else result.without_cp
    without_fix = (result.freed, like_the_best(result.without_fix)) if result.without_fix is not None else None
    notes = _notes(plans[0], result, cluster, stack, model, model_args, seq_len)
    if output:
        plans[0].save(output)
    if as_json:
        record = {"plans": [_plan_json(p) for p in plans],
                  "search": {"candidates": result.candidates, "solved": result.solved, "seconds": result.seconds,
                             "ranked_by": "simulation" if simulated else "closed form",
                             "runner_ups_simulated": len(alternates) if simulated else 0},
                  # every note and warning the text prints
                  "notes": [note for note in before if note] + notes}
        if show_explain:  # the same lines the table prints, and the dimensions the model rules out
            record["explain"] = explain(plans, result.rejected, objective=objective, without_cp=without_cp,
                                        without_fix=without_fix)
            record["not_offered"] = dict(result.unsupported)
            record["not_searched"] = dict(result.not_searched)
        echo_json(record)
        return
    cap = cluster.gpu.memory_gib
    # a model whose samples are not token sequences (an MLP, a CNN): a sample counts as one token
    sequences = bool(plans[0].seq_len)
    headers = ["#", "nodes", "dp", "tp", "pp", "ep", "cp", "mbs", "zero", "recompute", "schedule", "step s",
               "tokens/s" if sequences else "samples/s", "MFU", "mem GiB", "$/1M tok" if sequences else "$/1M samples"]
    rows = [
        [i + 1, p.nodes, p.dp, p.tp, p.pp, p.ep, p.cp, p.micro_batch, p.zero, _recompute(p), _schedule(p), p.predicted.step_time_s,
         p.predicted.tokens_per_s, mfu_percent_text(p.predicted.mfu), f"{p.predicted.peak_memory_text}/{cap:g}",
         _usd_per_million(p)]
        for i, p in enumerate(plans)
    ]
    # --hw-set gpus_per_node=2 makes another node than the profile's name says: name its GPUs too
    per_node = f" with {cluster.gpus_per_node} GPUs each" if any(
        parse_override(kv)[0] == "gpus_per_node" for kv in hw_set) else ""
    where = (f"{nodes or 1}..{max_nodes} nodes of {cluster.name}{per_node}" if max_nodes
             else f"{cluster.num_gpus} GPUs ({cluster.nodes}x {cluster.name}{per_node})")
    gc = f", grad_compress {plans[0].grad_compress}" if plans[0].grad_compress != "none" else ""
    gc += f", {plans[0].fp8_scaling}-scaled (MFU of the fp8 peak)" if plans[0].dtype == "fp8" else ""
    click.echo(f"{model} on {where}, global batch {plans[0].global_batch}"
               f"{sequence_phrase(plans[0].seq_len, plans[0].global_batch)}, {plans[0].dtype}{gc}, objective {objective}, "
               f"stack {stack or DEFAULT_STACK}")
    click.echo(format_table(headers, rows))
    tried = len(alternates) if simulated else 0
    runner_ups = f" with {tried} runner-up schedule{'s' if tried != 1 else ''} of theirs" if tried else ""
    ranked = (f"the best {len(result.plans)}{runner_ups} simulated and ranked" if simulated
              else "ranked by the closed form")
    click.echo(f"searched {result.candidates} candidates, {result.solved} partition ILPs, {result.seconds:.2f} s; "
               f"{ranked}")
    for note in notes:
        click.echo(note)
    if show_explain:
        for line in explain(plans, result.rejected, objective=objective, without_cp=without_cp, without_fix=without_fix):
            click.echo(f"  {line}")
        for dim, why in result.unsupported.items():
            click.echo(f"  {dim} not offered: {why}")
        for dim, why in result.not_searched.items():
            click.echo(f"  {dim} not searched: {why}")
    if output:
        click.echo(f"wrote {output}")


def _notes(best, result, cluster, stack, model, model_args, seq_len) -> list[str]:
    """The one-line notes on the best plan, as the text prints them and --json lists them."""
    stack_name = load_stack(stack or DEFAULT_STACK).name
    notes = (capped_context_note(model, best.seq_len, model_args_from(model_args), seq_len),
             host_wait_note(best.predicted, cluster.efficiency, moe=result.num_experts > 1,
                            on_cpu=cluster.gpu.name == PROBED_CPU_NAME, stack=stack),
             causal_mfu_note(best.predicted, cluster, best.dtype),
             batch_divisors_note(best.global_batch, best.world_size),
             sac_stack_note(best, stack_name),
             a2a_overlap_note(best, cluster, stack_name),
             not_offered_note(result.unsupported, result.num_experts, best.seq_len, model))
    return [note for note in notes if note]


def _recompute(p) -> str:
    n, total = p.recomputed_blocks
    return "none" if n == 0 else f"{p.recompute} {n}/{total}"


def _schedule(p) -> str:
    return p.schedule + (f" v={p.virtual_stages}" if p.virtual_stages > 1 else "")


def _usd_per_million(p) -> float:
    tokens = p.predicted.tokens_per_s * p.predicted.step_time_s
    return p.predicted.usd_per_step / tokens * 1e6 if tokens else 0.0


def _plan_json(p) -> dict:
    out = {
        "dp": p.dp, "tp": p.tp, "pp": p.pp, "ep": p.ep, "cp": p.cp, "micro_batch": p.micro_batch, "global_batch": p.global_batch,
        "schedule": p.schedule, "virtual_stages": p.virtual_stages, "zero": p.zero, "recompute": p.recompute,
        "sequence_parallel": p.sequence_parallel, "overlap_dp": p.overlap_dp, "dtype": p.dtype,
        "capacity_factor": p.capacity_factor, "grad_compress": p.grad_compress, "fp8_scaling": p.fp8_scaling,
        "stage_blocks": [[s.first_block, s.last_block] for s in p.stages],
        "recompute_blocks": [s.num_recomputed for s in p.stages],
        "usd_per_million_tokens": _usd_per_million(p),
    }
    out.update(p.predicted.to_dict())
    out["plan"] = p.to_dict()
    return out
