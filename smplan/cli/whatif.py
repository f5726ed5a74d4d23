"""`smplan whatif`: sweep planner and cluster inputs; charts and an HTML report."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

from smplan.display import days_text, memory_gib_text, mfu_percent_text
from smplan.hwprofiles import load_stack
from smplan.report.points import picked_word, unit_of

from .checks import FiniteFloat, check_can_write
from .main import UserError
from .notes import a2a_overlap_note, mfu_counts_masked_half, sac_stack_note
from .options import (
    GLOBAL_BATCH,
    INLINE_PLAN_KEYS,
    SEQ_LEN,
    dtype_option,
    echo_json,
    given_on_command_line,
    hw_options,
    json_option,
    model_args_from,
    model_args_option,
    non_empty_path,
    warn_about_profiles,
)
from .table import format_table


@click.command()
@click.argument("model", metavar="MODEL")
@hw_options(required=False, default="a100x8")
@click.option("--vary", "varies", multiple=True, metavar="KEY=V1,V2,...",
              help="Sweep KEY over values: nodes (of each hw profile: a GB200 NVL72 node holds 4 GPUs, an "
                   "h100x8 node 8), hw, stack (software stacks: smplan stack list), global_batch, "
                   "seq_len, checkpoint_interval_min, a plan "
                   "key (tp, pp, mbs, recompute...), a hardware key (inter_node.bandwidth_gbps...), or "
                   "arg.NAME. Reliability questions are hardware keys too, with --tokens or --days: "
                   "reliability.gpu_mtbf_hours, reliability.restart_minutes, storage.checkpoint_write_gbps; "
                   "a price is one: cost.usd_per_gpu_hour. "
                   "Repeatable: the points are every combination.")
@click.option("--tokens", type=FiniteFloat(max_value=1e15, limit_note="64x the tokens of Llama 3"), default=None,
              help="Train this many tokens (e.g. 1e12; samples for a model without sequences): time, cost, goodput.")
@click.option("--days", type=FiniteFloat(max_value=3650, limit_note="10 years"), default=None,
              help="Train for this many wall-clock days (failures, restarts and checkpoints included): tokens, "
                   "cost, goodput. Not `smplan reliability --days`, which is failure-free days.")
@model_args_option
@click.option("--plan", "plan", default=None, metavar="INLINE",
              help='Use this plan at every point instead of re-planning, as inline keys (not a plan file), e.g. "tp=8,pp=4,recompute=full" (stages=B:R/... fixes the split; see smplan simulate --help). Keys: ' + INLINE_PLAN_KEYS + '.')
@dtype_option
@click.option("--global-batch", type=GLOBAL_BATCH, default=None, help="Global batch in samples, the same at every point (default: one sequence per GPU of the largest point).")
@click.option("--seq-len", type=SEQ_LEN, default=None, help="Sequence length (tokens per sample).")
@click.option("--checkpoint-interval-min", type=FiniteFloat(), default=None,
              help="Checkpoint interval in minutes (default per point: the best of a failure-simulation sweep "
                   "around the Young/Daly optimum, or Daly's when the seeds draw under 20 failures, as `smplan "
                   "reliability` picks it; more --seeds steady it).")
@click.option("--seeds", type=click.IntRange(min=1), default=30, show_default=True,
              help="Failure-simulation seeds per point.")
@click.option("--delta", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.2, show_default=True,
              help="The sensitivity chart's ±fraction on each hardware figure.")
@click.option("-o", "--output", "out_dir", default="whatif-report", callback=non_empty_path, show_default=True, metavar="REPORT_DIR",
              help="Directory for index.html, points.json and the charts.")
@click.option("--force", is_flag=True, help="Overwrite a non-empty REPORT_DIR.")
@click.option("--format", "fmt", type=click.Choice(["png", "svg"]), default="png", show_default=True,
              help="Chart image format.")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Parallel processes (default: CPU count).")
@json_option
def whatif(model, hw, stack, nodes, hw_set, varies, tokens, days, model_args, plan, dtype, global_batch, seq_len,
           checkpoint_interval_min, seeds, delta, out_dir, force, fmt, jobs, as_json):
    """What if the cluster, the model or the plan changed? Sweep, simulate, chart.

    MODEL is a model file, path/to/model.py[:builder] (README: The model file), or hf:DIR, a folder
    holding a Hugging Face config.json (built from it: no weights, no download).

    \b
    Every --vary combination is re-planned (or uses --plan), simulated and, with --tokens
    or --days, run through the failure simulation. Points that do not fit are kept and
    marked infeasible with the reason. Examples:
      smplan whatif examples/gpt.py:llama3_70b --hw a100x8 --vary nodes=4,8,16,32 \\
          --vary hw=a100x8,h100x8 --tokens 1e12 -o out/
      # a slower or faster network between the nodes (each point re-planned)
      smplan whatif examples/gpt.py:llama3_70b --hw a100x8 --nodes 8 \\
          --vary inter_node.bandwidth_gbps=12.5,25,50 --tokens 1e11 -o net/
      # less reliable GPUs, one plan kept at every point
      smplan whatif examples/gpt.py:llama3_8b --hw h100x8 --nodes 4 --plan tp=2,mbs=1,recompute=full \\
          --vary reliability.gpu_mtbf_hours=5000,20000,50000 --tokens 1e12 -o mtbf/

    \b
    Recommended: the cheapest point among those within 1.25x of the best (time to train
    with --tokens, tokens trained with --days, else throughput); a sweep of conditions
    only (reliability.*) has a best case instead. -o DIR gets index.html, points.json
    (the figures of every point, for scripts) and the charts that apply (time vs cost,
    scaling, versus one varied setting, memory and time breakdowns; for the recommended
    point its simulated step, goodput against the checkpoint interval, sensitivity).
    """
    from smplan.hwprofiles.loader import parse_override
    from smplan.planner.model_file import ModelFileError, load_model_file
    from smplan.planner.plan import is_plan_file_name
    from smplan.report import write_report
    from smplan.report.render import check_report_dir
    from smplan.whatif import Question, parse_vary, run_whatif

    if is_plan_file_name(model) and Path(model).is_file():
        _refuse_plan_file(model)
    if plan and (is_plan_file_name(plan) or Path(plan).is_file()):
        _refuse_plan_file_in_plan(plan)

    def accepts(name: str) -> bool:  # only loads (imports) the model file for an unknown --vary key
        return load_model_file(model).accepts(name)

    q = Question(
        model=model, hw=hw, hw_given=given_on_command_line("hw"), nodes=nodes, hw_overrides=dict(parse_override(s) for s in hw_set), stack=stack,
        model_args=model_args_from(model_args), varies=tuple(parse_vary(v, accepts) for v in varies),
        tokens=tokens, days=days, plan=plan, dtype=dtype, global_batch=global_batch, seq_len=seq_len,
        checkpoint_interval_min=checkpoint_interval_min, seeds=seeds, sensitivity_delta=delta,
        command=shlex.join(["smplan", *sys.argv[1:]]) if sys.argv and "whatif" in sys.argv else None,
    )
    for v in q.varies:  # a swept model argument of the wrong type is the user's typo, not an infeasible point
        if v.kind == "arg" and hasattr(load_model_file(model), "check_args"):
            for value in v.values:
                try:
                    load_model_file(model).check_args({**q.model_args, v.target: value})
                except ModelFileError as err:
                    raise UserError(f"--vary {v.key}: {err}") from None
    # after the question's own typos (a user fixing one should not have to pick a new folder first)
    check_report_dir(out_dir, force)
    check_can_write(out_dir, "-o/--output", folder=True)
    warned = warn_about_profiles(  # for --json's notes, with those under the table
        hw, *(value for v in q.varies if v.kind == "hw" for value in v.values), stack=stack,
        overrides=q.hw_overrides, varied={v.target: v.values for v in q.varies if v.kind == "cluster"},
        stacks=tuple(value for v in q.varies if v.kind == "stack" for value in v.values))

    record = run_whatif(q, jobs=jobs, progress=ProgressBar(), note=lambda text: click.echo(text, err=True))
    record["notes"] = table_notes(record, q)  # under the table, on the page and in points.json
    click.echo(f"writing the report and its charts to {os.path.join(out_dir, '')} ...", err=True)
    index = write_report(record, out_dir, fmt=fmt, force=True)
    if as_json:  # the warnings said on stderr, then the notes under the table; where the page is, as the text's last line says
        echo_json({**record, "notes": warned + record["notes"], "report": str(index)})
    else:
        click.echo(record["question"]["text"])  # what every point shares (the global batch among it)
        click.echo(points_table(record))
        cut = [p for p in record["points"] if not p["feasible"] and _short(p["reason"] or "") != (p["reason"] or "")]
        for p in cut:  # the table shortens a long reason; here it is whole
            click.echo(f"  #{p['id']} {p['label']}: {p['reason']}")
        for line in record["notes"]:
            click.echo(line)
        if record["recommended"] is not None:
            rec = record["points"][record["recommended"]]
            click.echo(f"\n{picked_word(record)}: #{rec['id']} {rec['label']}: {rec['plan_label']}")
            click.echo(f"  {record['recommendation']}")
    click.echo(f"report: {index}", err=as_json)
    if record["recommended"] is None:  # the report says why each point failed; a script must see it failed
        raise UserError(f"no feasible point: {record['recommendation']}; the report {index} says why each one failed")


def table_notes(record: dict, q) -> list[str]:
    """The lines under the table: what its figures mean where the points differ in kind. `q`: the
    whatif Question, whose points' clusters (`point_cluster`) some notes price again."""
    from smplan.whatif import grid
    from smplan.whatif.point import point_cluster

    specs = {spec.id: spec for spec in grid(list(q.varies))}
    clusters: dict = {}

    def cluster_of(point: dict):
        """The cluster a point was priced on: the question's --hw (a file of one's own too) as its spec varies it."""
        if point["id"] not in clusters:
            clusters[point["id"]] = point_cluster(q, specs[point["id"]])
        return clusters[point["id"]]

    notes = [moe_host_time_note(record), network_price_note(record), fp8_mfu_note(record), gpu_count_note(record),
             causal_mfu_points_note(record, cluster_of), *sac_notes(record), *a2a_notes(record, cluster_of)]
    return [note for note in notes if note]


def fp8_mfu_note(record: dict) -> str | None:
    """One line when a point trains in fp8: its MFU is of the GPU's fp8 peak, as `smplan plan` gives it,
    so it reads lower than a bf16 point's at the same speed."""
    ids = [f"#{p['id']}" for p in record["points"] if p["feasible"] and p["plan"]["dtype"] == "fp8"]
    if not ids:
        return None
    return (f"note: the MFU of fp8 point{'s' if len(ids) > 1 else ''} {', '.join(ids)} is of the GPU's fp8 peak "
            "(as `smplan plan` gives it), a higher peak than bf16's: beside a bf16 point, compare step s or "
            f"{unit_of(record)}s/s")


def gpu_count_note(record: dict) -> str | None:
    """One line when a sweep over hw profiles runs points that differ only in hw on different GPU
    counts: nodes are each profile's (a GB200 NVL72 tray holds 4 GPUs, an h100x8 node 8)."""
    if "hw" not in record["question"]["vary"]:
        return None
    counts: dict[str, set] = {}  # the other settings -> the GPU counts of their hw points
    for p in record["points"]:
        if p["num_gpus"]:
            rest = " ".join(f"{k}={v}" for k, v in p["settings"].items() if k != "hw")
            counts.setdefault(rest, set()).add(p["num_gpus"])
    if all(len(c) < 2 for c in counts.values()):
        return None
    per_node = {p["hw"]: p["num_gpus"] // p["nodes"] for p in record["points"] if p["num_gpus"] and p["nodes"]}
    nodes = ", ".join(f"{hw} {n}" for hw, n in per_node.items())
    return (f"note: nodes are each profile's own (GPUs per node: {nodes}), so the hw points run on different "
            "GPU counts (the GPUs column) and their time and cost compare clusters of different sizes; "
            "--vary nodes as well to compare equal GPU counts")


def sac_notes(record: dict) -> list[str]:
    """`smplan plan`'s note on a plan that recomputes with sac under a stack without that policy, once
    per stack, naming the points."""
    # plan's --fix is whatif's --vary (or --plan)
    return [f"{note} (here: --vary recompute=full,selective)"
            for note in _per_point_notes(record, lambda p, plan: sac_stack_note(plan, load_stack(plan.stack).name))]


def a2a_notes(record: dict, cluster_of) -> list[str]:
    """`smplan plan`'s note on a plan whose expert all-to-alls across nodes are priced hidden (an
    overlap Megatron-Core runs only when asked), once, naming the points: an ep sweep compares them."""
    return _per_point_notes(record, lambda p, plan: a2a_overlap_note(plan, cluster_of(p), load_stack(plan.stack).name))


def causal_mfu_points_note(record: dict, cluster_of) -> str | None:
    """`smplan plan`'s note on an MFU above what the GPU's largest GEMMs reach (notes.mfu_counts_masked_half:
    long sequences count causal attention's masked half as work), once, naming the points."""
    from smplan.whatif.point import plan_from_record

    ids = []
    for p in record["points"]:
        if p["feasible"]:
            plan = plan_from_record(p)
            if mfu_counts_masked_half(p["figures"]["mfu"], cluster_of(p), plan.dtype):
                ids.append(f"#{p['id']}")
    if not ids:
        return None
    return (f"note ({', '.join(ids)}): MFU counts causal attention's masked half as work (PaLM's convention), above what "
            "the GPU's GEMMs reach; hardware_tflops_per_gpu in points.json is what the GPUs execute")


def _per_point_notes(record: dict, note_of) -> list[str]:
    """"note (#3, #5): ...": each note `note_of(point, plan)` gives the feasible points, once, with their ids."""
    from smplan.whatif.point import plan_from_record

    said: dict[str, list[str]] = {}
    for p in record["points"]:
        if p["feasible"]:
            note = note_of(p, plan_from_record(p))
            if note:
                said.setdefault(note, []).append(f"#{p['id']}")
    return [f"note ({', '.join(ids)}): {note.removeprefix('note: ')}" for note, ids in said.items()]


def moe_host_time_note(record: dict) -> str | None:
    """One line when a sweep over stacks compares an MoE model and the stacks' host time per MoE
    layer differs with one of them 0, which a stack file gives where nothing measured it: the
    comparison then rests on that figure (hwprofiles/stacks/*.toml). Every routed-expert layer pays
    it, whatever the ep (planner pass_model): a review's hf: MoE model, never offered ep, got no note."""
    names = record["question"]["vary"].get("stack") or []
    moe = any(p.get("moe") for p in record["points"])
    if len(names) < 2 or not moe:
        return None
    per_layer = {name: load_stack(name).host_overhead_us_per_moe_layer for name in names}
    if len(set(per_layer.values())) < 2 or min(per_layer.values()) > 0:
        return None
    figures = ", ".join(f"{name} {us:g} us" + (" (not measured)" if not us else "") for name, us in per_layer.items())
    return (f"note: the stacks' host time per MoE layer differs ({figures}; `smplan stack show NAME`): "
            "on this MoE model their comparison rests on it")


def network_price_note(record: dict) -> str | None:
    """One line when the sweep varies a link (--vary inter_node.bandwidth_gbps=...) but not the price:
    every point is billed the profile's price per GPU-hour, so a faster network looks free."""
    varied = record["question"]["vary"]
    links = [key for key in varied if key.startswith(("inter_node.", "intra_node."))]
    if not links or "cost.usd_per_gpu_hour" in varied:
        return None
    return (f"note: every point is billed the profile's price per GPU-hour as {links[0]} varies, so a faster "
            "network costs nothing here; a sweep per network with its own --hw-set cost.usd_per_gpu_hour=... "
            "prices it")


def points_table(record: dict) -> str:
    timed = any(p.get("run") for p in record["points"])
    days_given = bool(record["question"].get("days"))  # every point trains that long: show what it trains
    unit = unit_of(record)  # samples for a model without sequences, as plan counts them
    headers = ["#", "point", "GPUs", "plan", "step s", f"{unit}s/s", "MFU", "mem GiB"]
    if timed:
        headers += [f"{unit}s" if days_given else "days", "cost $", "goodput", "ckpt min"]
    rows = []
    trained = [p["run"]["tokens"] for p in record["points"] if p["feasible"] and p.get("run")]
    digits = distinct_digits(trained)
    for p in record["points"]:
        f = p.get("figures") or {}
        if not p["feasible"]:
            row = [p["id"], p["label"], p["num_gpus"], "infeasible: " + _short(p["reason"] or ""), "", "", "", ""]
            rows.append(row + (["", "", "", ""] if timed else []))
            continue
        row = [p["id"], p["label"], p["num_gpus"], p["plan_label"], f["step_time_s"], round(f["tokens_per_s"]),
               mfu_percent_text(f["mfu"]), memory_gib_text(f["peak_memory_gib"])]
        if timed:  # the checkpoint interval the run was simulated at: the failure simulation's best, or the given
            r = p["run"]
            row += [f"{r['tokens']:.{digits}g}" if days_given else days_text(r["days"]), round(r["usd"]),
                    f"{r['goodput']:.1%}", _minutes(r["checkpoint_interval_min"])]
        rows.append(row)
    return format_table(headers, rows, align="llrlrrrr" + ("rrrr" if timed else ""))


def distinct_digits(values: list[float], least: int = 3, most: int = 6) -> int:
    """Significant digits (least..most) that print values that differ differently: a batch sweep
    whose points train 0.1% apart read "2.46e+12" thrice (a review's finding)."""
    for digits in range(least, most + 1):
        if len({f"{v:.{digits}g}" for v in values}) == len(set(values)):
            return digits
    return most


def _minutes(minutes: float) -> str:
    return f"{minutes:.1f}" if minutes >= 1 else f"{minutes:.2g}"


def _short(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


class ProgressBar:
    """`[#####.....] 5/10 points 3.2 s nodes=8 hw=h100x8` on stderr, redrawn in place on a terminal."""

    def __init__(self, width: int = 30):
        self.width = width
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, total: int, label: str, elapsed: float) -> None:
        fill = round(self.width * done / total)
        line = f"[{'#' * fill}{'.' * (self.width - fill)}] {done}/{total} points {elapsed:5.1f} s  {label}"
        if self.tty:
            click.echo("\r" + line[:120].ljust(120), err=True, nl=done == total)
        else:
            click.echo(line, err=True)


def _refuse_plan_file_in_plan(text: str) -> None:
    """--plan takes a plan's keys inline; a plan file's are printed for it when it reads as one."""
    from smplan.planner import Plan
    from smplan.whatif.point import plan_inline

    try:
        how = f"for the plan in {text} give --plan {plan_inline(Plan.load(text))} (without dp= to --vary nodes)"
    except ValueError:  # PlanError: not a readable plan file
        how = (f"{text} is not a readable plan file either; `smplan whatif PLAN.json` prints a plan file's "
               "keys as --plan")
    raise UserError(f"--plan takes plan keys inline (e.g. --plan tp=8,pp=4,recompute=full), not a file; {how}")


def _refuse_plan_file(path: str) -> None:
    """whatif re-plans and simulates a model; a plan file's own settings go in --plan."""
    from smplan.hwprofiles import DEFAULT_STACK
    from smplan.planner import Plan, PlanError
    from smplan.whatif.point import plan_inline

    try:
        plan = Plan.load(path)
    except PlanError:  # not a readable plan: the model loader says what is wrong
        return
    words = ["smplan", "whatif", plan.model, "--hw", plan.hw, "--nodes", str(plan.nodes)]
    for key, value in plan.model_args.items():  # the shape the plan was made for, as it was given
        words += ["--arg", f"{key}={value}"]
    if plan.seq_len and "seq_len" not in plan.model_args:
        words += ["--seq-len", str(plan.seq_len)]
    for key, value in plan.hw_overrides.items():
        words += ["--hw-set", f"{key}={value}"]
    if plan.stack != DEFAULT_STACK:
        words += ["--stack", plan.stack]
    words += ["--plan", plan_inline(plan), "--vary", "KEY=V1,V2"]
    raise UserError(f"{path} is a plan file; whatif takes its model: {shlex.join(words)} (to --vary nodes, drop "
                    "--nodes and dp= from --plan: dp then fills each point's GPUs)")
