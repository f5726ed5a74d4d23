"""`smplan simulate`: one training step of a plan as a discrete-event simulation."""

from __future__ import annotations

from pathlib import Path

import click

from smplan.display import mfu_percent_text
from smplan.hwprofiles import DEFAULT_STACK, PROBED_CPU_NAME, load_stack
from smplan.planner.feasibility import fsdp_zero1_problem, zero_with_pp_problem
from smplan.planner.model_file import split_ref
from smplan.planner.plan import is_plan_file_name
from smplan.simulator import DP_PATTERNS, simulate_plan
from smplan.simulator.figures import shown_breakdown
from smplan.simulator.gantt import write_gantt
from smplan.simulator.inputs import resolve_target
from smplan.simulator.prediction import stale_prediction_note
from smplan.simulator.trace import write_trace

from .checks import check_output_file, image_suffixes
from .main import UserError
from .notes import (
    a2a_overlap_note,
    capped_context_note,
    causal_mfu_note,
    gemm_tile_note,
    host_wait_note,
    out_of_memory_warning,
)
from .options import (
    INLINE_PLAN_KEYS,
    SEQ_LEN,
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
@click.argument("target", metavar="PLAN.json|MODEL")
@hw_options(required=False, plan_files=True)
@click.option("--plan", "plan_text", default=None, metavar="KEYS", help='Inline plan for a MODEL: "tp=8,pp=2,dp=4,mbs=1,gbs=512"; stages=5:2/3:0 sets each model chunk\'s blocks:recomputed (default: an even split, every block recomputed with recompute=full|selective|sac, none without it; zero=0). Keys: ' + INLINE_PLAN_KEYS + '.')
@model_args_option
@click.option("--seq-len", type=SEQ_LEN, default=None, help="Sequence length (model builder's seq_len).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, callback=non_empty_path, help="Write a Chrome/Perfetto trace-event JSON of the step.")
@click.option("--gantt", "gantt_path", type=click.Path(dir_okay=False), default=None, callback=non_empty_path,
              help="Write a Gantt chart of the step; the suffix picks the format (.png, .svg, .pdf, ...).")
@click.option("--force", is_flag=True, help="Overwrite an existing --trace or --gantt file.")
@click.option("--no-contention", is_flag=True,
              help="Every transfer takes its cost-model time on unshared links. The step then equals the closed form at "
                   "pp=1 and for pipelines of identical stages without send time (interleaved ones too, where the "
                   "cool-down runs without idle); elsewhere the closed form approximates the schedule.")
@click.option("--dp-pattern", type=click.Choice(DP_PATTERNS), default="allreduce", show_default=True, help="What-if: parameter servers (ps) instead of all-reduce.")
@click.option("--ps-servers", type=click.IntRange(min=1), default=None, help="Parameter-server nodes for --dp-pattern ps (default: one per node).")
@json_option
def simulate(target, hw, stack, nodes, hw_set, plan_text, model_args, seq_len, trace_path, gantt_path, force, no_contention, dp_pattern, ps_servers, as_json):
    """Simulate one step of PLAN.json, or of MODEL with --hw and --plan. A whole run's
    failures, restarts, checkpoint interval and goodput: smplan reliability PLAN.json.

    MODEL is a model file, path/to/model.py[:builder] (README: The model file), or hf:DIR, a folder
    holding a Hugging Face config.json (built from it: no weights, no download).

    \b
      smplan simulate plan.json --gantt step.png --trace step.json
      smplan simulate examples/gpt.py:gpt3_175b --hw a100x8 --nodes 128 \\
          --plan "tp=8,pp=16,dp=8,mbs=1,gbs=768,recompute=full"
    """
    check_output_file(trace_path, "--trace", force)
    check_output_file(gantt_path, "--gantt", force, suffixes=image_suffixes() if gantt_path else None)
    if trace_path and gantt_path and Path(trace_path).resolve() == Path(gantt_path).resolve():
        raise UserError("--trace and --gantt name the same file; give two paths")
    source = Path(target) if is_plan_file_name(target) else split_ref(target)[0]  # plan or model file
    for flag, out in (("--trace", trace_path), ("--gantt", gantt_path)):
        if out and source.is_file() and Path(out).resolve() == source.resolve():
            raise UserError(f"{flag} names the input {source} itself (even --force does not replace it); give "
                            "another path")
    if ps_servers is not None and dp_pattern != "ps":
        raise UserError(f"--ps-servers applies to --dp-pattern ps only (this run uses {dp_pattern}); "
                        "add --dp-pattern ps or drop --ps-servers")
    plan, profile, cluster = resolve_target(
        target, hw=hw, nodes=nodes, hw_set=hw_set, plan_text=plan_text, model_args=model_args_from(model_args), seq_len=seq_len,
        stack=stack,
    )
    # every note and warning the text prints, for --json too
    notes = warn_about_profiles(hw or plan.hw, stack=stack or plan.stack, overrides=plan.hw_overrides)
    overrides = plan.hw_overrides  # the plan file's and --hw-set's, as resolve_target applied them
    if hw and overrides and hw != plan.hw:
        notes.append(f"note: hardware overrides ({_fmt_overrides(overrides)}) apply on --hw {hw} as on {plan.hw}; "
                     "--hw-set KEY=VALUE replaces one")
        click.echo(notes[-1], err=True)
    if gemm_tile_note(cluster):
        notes.append(gemm_tile_note(cluster))
        click.echo(notes[-1], err=True)
    result = simulate_plan(plan, profile, cluster, not no_contention, dp_pattern=dp_pattern, ps_servers=ps_servers)
    as_planned = not (hw or stack or nodes or hw_set or no_contention) and dp_pattern == "allreduce"
    stale = (stale_prediction_note(target, plan, result.step_time_s, result.closed_form_step_time_s)
             if as_planned else None)
    if stale:
        notes.append(stale)
        click.echo(stale, err=True)
    # a plan file states its seq_len; a MODEL with --plan takes the model's default
    capped = None if is_plan_file_name(target) else capped_context_note(
        plan.model, profile.seq_len, model_args_from(model_args), seq_len)
    host = host_wait_note(result.figures, cluster.efficiency, moe=profile.num_experts > 1,
                          on_cpu=cluster.gpu.name == PROBED_CPU_NAME, stack=plan.stack)
    oom = None if result.fits_memory else out_of_memory_warning(
        result.figures.peak_memory_gib, result.memory_capacity_gib, cluster.gpu.name, plan)
    # what `plan` says of the same plan: the masked half of causal attention in MFU, the hidden all-to-alls
    causal = causal_mfu_note(result.figures, cluster, plan.dtype)
    a2a = a2a_overlap_note(plan, cluster, load_stack(stack or plan.stack or DEFAULT_STACK).name)
    # a plan `plan` would not offer under this stack is simulated as written, and says so
    fsdp = fsdp_zero1_problem(plan.zero, plan.pp, plan.dp * plan.cp, cluster.efficiency.zero_granularity)
    fsdp = f"note: {fsdp}; this simulates ZeRO-1 as written, which `smplan plan` does not offer here" if fsdp else None
    zero_pp = zero_with_pp_problem(plan.zero, plan.pp)
    zero_pp = f"note: {zero_pp}; it is simulated so (smplan plan offers ZeRO-2/3 at pp=1 only)" if zero_pp else None
    notes += [note for note in (capped, host, causal, a2a, fsdp, zero_pp, oom) if note]
    nodes_of = [row["node"] for row in result.stage_utilisation]
    if trace_path:
        write_trace(trace_path, result.events, nodes_of, {"plan": plan.to_dict(), "step_time_s": result.step_time_s})
    if gantt_path:
        m = plan.num_microbatches
        title = f"{plan.model}  {plan.degrees} {plan.schedule}, {m} micro-batch{'es' if m != 1 else ''}"
        write_gantt(gantt_path, result.events, result.step_time_s, title)
    if as_json:
        out = result.to_dict()
        # what was simulated, at the top level for scripts (the plan below holds the rest)
        out.update(model=plan.model, hw=cluster.name, nodes=cluster.nodes, num_gpus=plan.world_size, stack=plan.stack,
                   hw_overrides=overrides,
                   unit="token" if profile.seq_len else "sample")  # what tokens_per_s counts, as whatif says it
        out["plan"] = plan.to_dict()
        out["notes"] = notes
        if trace_path:
            out["trace"] = str(trace_path)
        if gantt_path:
            out["gantt"] = str(gantt_path)
        echo_json(out)
        return
    f = result.figures
    # zero, sp and the recomputed blocks too: a hand-edited plan file shows what it now says
    # (a stage's recompute kind counts only for its recompute_blocks)
    click.echo(f"{plan.model}: {plan.degrees} on {plan.world_size} GPUs ({cluster.name}), "
               f"{plan.schedule}, {plan.num_microbatches} micro-batch{'es' if plan.num_microbatches != 1 else ''} of {plan.micro_batch}"
               f"{sequence_phrase(profile.seq_len, plan.global_batch)}, {plan.dtype}"
               f"{' (block-scaled)' if plan.fp8_scaling == 'block' else ''}, zero={plan.zero}"
               f"{', sp' if plan.sequence_parallel and plan.tp > 1 else ''}, {plan.recompute_label}, "
               f"contention {'off' if no_contention else 'on'}, {_dp_collectives(dp_pattern, plan)}, stack {plan.stack}"
               + (f", hardware overrides {_fmt_overrides(overrides)}" if overrides else ""))
    rows = [
        ["step time (s)", f.step_time_s],
        ["tokens/s", f.tokens_per_s],
        ["samples/s", f.samples_per_s],
        ["model TFLOP/s per GPU", f.model_tflops_per_gpu],
        ["hardware TFLOP/s per GPU", f.hardware_tflops_per_gpu],
        ["MFU" + (" (of the fp8 peak)" if plan.dtype == "fp8" else ""), mfu_percent_text(f.mfu)],
        ["peak memory (GiB)", f.peak_memory_text],
        ["bubble", f"{f.bubble_fraction:.1%}"],
        ["$ per step", f.usd_per_step],
    ]
    if result.closed_form_step_time_s:
        rows.append(["closed-form step time (s)", result.closed_form_step_time_s])
    click.echo(format_table(["figure", "value"], rows))
    click.echo("\nbreakdown (critical stage)")
    click.echo(format_table(["kind", "seconds", "share"],
                            [[k, v, f"{v / f.step_time_s:.1%}"] for k, v in shown_breakdown(f.breakdown, plan).items()]))
    for note in (capped, host, causal, a2a, fsdp, zero_pp):
        if note:
            click.echo(note)
    click.echo("\nper-stage time, % of the step: compute + comm wait + optimizer + idle = 100%\n"
               "(compute includes recompute, host wait and TP collectives; comm wait: the GPU idle inside its passes\n"
               "for ZeRO/FSDP, expert and CP collectives; idle: between passes); send and DP busy are the links' own\n"
               "streams, overlapping the compute")
    click.echo(format_table(
        ["stage", "node", "compute", "(recompute)", "comm wait", "optimizer", "idle", "send busy", "DP busy"],
        [[r["stage"], r["node"]] + [f"{100 * r[k]:.1f}%" for k in ("compute", "recompute", "comm_wait", "optimizer",
                                                                   "idle", "send", "dp_comm")]
         for r in result.stage_utilisation]))
    if oom:
        click.echo("\n" + oom)
    for path, what in ((trace_path, "trace"), (gantt_path, "Gantt chart")):
        if path:
            click.echo(f"\nwrote {what}: {path}")


def _fmt_overrides(overrides: dict) -> str:
    return ", ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
                     for key, value in overrides.items())


def _dp_collectives(dp_pattern: str, plan) -> str:
    """How the data-parallel ranks exchange gradients: the header said "DP allreduce" for ZeRO
    plans too, whose gradients are reduce-scattered and parameters all-gathered."""
    if dp_pattern != "allreduce" or plan.dp * plan.cp == 1:
        return f"DP {dp_pattern}" if plan.dp * plan.cp > 1 else "no DP"
    return "DP all-reduce" if plan.zero == 0 else "DP reduce-scatter + all-gather (ZeRO)"
