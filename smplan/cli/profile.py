"""`smplan profile MODEL`: what one sample costs, part by part (smplan.planner.profile_model)."""

from __future__ import annotations

import click

from smplan.planner import blocks_problem, profile_model
from smplan.planner.profiler import DTYPES

from .options import SEQ_LEN, echo_json, json_option, model_args_from, model_args_option
from .table import format_table, human_count

MIB = 2**20


@click.command()
@click.argument("model", metavar="MODEL")
@model_args_option
@click.option("--seq-len", type=SEQ_LEN, default=None, help="Sequence length (passed to the builder as seq_len).")
@click.option("--dtype", type=click.Choice(list(DTYPES)), default="bf16", show_default=True,
              help="Parameter and activation dtype the model is built in.")
@click.option("--no-cache", is_flag=True, help="Profile again even if a cached profile exists.")
@json_option
def profile(model: str, model_args: tuple[str, ...], seq_len: int | None, dtype: str, no_cache: bool,
            as_json: bool) -> None:
    """Profile MODEL on the meta device: no weights allocated.

    MODEL is a model file, path/to/model.py[:builder] (README: The model file), or hf:DIR, a folder
    holding a Hugging Face config.json (built from it: no weights, no download).

    Per part (embedding, one row for the repeated blocks, head, loss): parameters,
    forward GFLOPs, bytes saved for backward and output bytes per sample, and the
    collectives a block issues under the file's tp_plan. Profiles are cached on disk
    ($SMPLAN_CACHE_DIR or ~/.cache/smplan) by file hash and arguments.

    \b
    Examples:
      smplan profile examples/gpt.py:gpt3_175b
      smplan profile examples/gpt.py --arg layers=4 --arg hidden=256 --arg heads=4
      smplan profile examples/gpt.py:llama3_8b --seq-len 4096 --json
      smplan profile examples/mlp.py --dtype fp32
    """
    result = profile_model(model, model_args_from(model_args), seq_len=seq_len, dtype=dtype, cache=not no_cache)
    notes = _warnings(result)
    if as_json:
        data = result.to_dict()
        data["train_flops_per_token"] = result.train_flops_per_sample / result.tokens_per_sample
        data["notes"] = notes  # every warning the text prints on stderr, as plan's --json notes
        echo_json(data)
        return
    rows = [_row(p.name, 1, p) for p in result.pre]
    if result.blocks:
        first, last = result.blocks[0].name, result.blocks[-1].name
        name = first if len(result.blocks) == 1 else f"{first} .. {last.rsplit('.', 1)[-1]}"
        rows.append(_row(name, len(result.blocks), result.blocks[0]))
    rows += [_row(p.name, 1, p) for p in result.post]
    headers = ["part", "count", "params", "fwd GFLOPs/sample", "saved MiB/sample", "output MiB/sample", "TP collectives"]
    seq = result.seq_len or "none (a sample is not a token sequence)"
    click.echo(f"{result.model}  seq_len={seq}  dtype={result.dtype}  "
               f"(per part; a block row is one block)")
    click.echo(format_table(headers, rows, align="lrrrrrl"))
    per_token = result.train_flops_per_sample / result.tokens_per_sample
    click.echo("")
    click.echo(f"params:                    {result.params:,} ({human_count(result.params)})")
    if result.params_active != result.params:
        click.echo(f"params active per token:   {result.params_active:,} ({human_count(result.params_active)}; "
                   "routed experts count top_k / num_experts; the input embedding counts, which some model "
                   "cards leave out)")
    moe = [(p, n) for p, n in [(b, 1) for b in result.pre + result.post]
           + ([(result.blocks[0], len(result.blocks))] if result.blocks else []) if p.num_experts]
    ep_offered = "ep" not in result.unsupported  # else the reason is printed below, and no ep splits anything
    for part, count in moe[:1]:
        ep_rule = f"ep must divide {part.num_experts}" if ep_offered else "ep not offered, see below"
        click.echo(f"experts per MoE block:     {part.num_experts} routed, top_k={part.top_k} "
                   f"({count} MoE block{'s' if count != 1 else ''}; {ep_rule})")
        click.echo(f"expert params per block:   {part.params_expert:,} ({human_count(part.params_expert)}"
                   f"{'; split over ep ranks' if ep_offered else ''})")
        share = part.expert_flops_per_sample / part.forward_flops_per_sample if part.forward_flops_per_sample else 0
        click.echo(f"expert GFLOPs/sample:      {part.expert_flops_per_sample / 1e9:.4g} per block "
                   f"({share:.0%} of the block's forward; each token runs top_k experts)")
        click.echo(f"router GFLOPs/sample:      {part.router_flops_per_sample / 1e9:.4g} per block")
        if ep_offered:  # the all-to-alls exist only under ep > 1
            click.echo(f"all-to-all MiB/sample:     {part.all_to_all_bytes_per_sample / MIB:.4g} dispatch + "
                       f"{part.all_to_all_bytes_per_sample / MIB:.4g} combine per block (tokens x hidden x top_k, "
                       "under ep > 1)")
    click.echo(f"train FLOPs per sample:    {result.train_flops_per_sample:.4g} (3x forward, no recompute)")
    if result.seq_len:
        click.echo(f"train FLOPs per token:     {per_token:.4g}")
    for note in notes:
        click.echo(note, err=True)
    for dim, why in result.unsupported.items():
        click.echo(f"{dim} will not be offered: {why}")
    if "tp" in result.unsupported:
        return  # the reason above says it
    if not result.has_tp_plan:
        click.echo("no tp_plan in the model file: tensor parallelism will not be offered")
    elif result.num_heads:
        click.echo(f"tp (tensor parallelism) must divide {result.num_heads}, a block's key/value heads")


def _warnings(result) -> list[str]:
    """What `plan` and `execute` will make of the model beyond the profile: a model they refuse
    (no repeated blocks) profiles fine, so say it here, with the line they refuse it with."""
    refusal = blocks_problem(result)
    return [f"warning: plan and execute will refuse this model: {refusal}"] if refusal else []


def _row(name: str, count: int, p) -> list:
    return [
        name,
        count,
        f"{p.params:,}",
        p.forward_flops_per_sample / 1e9,
        p.saved_bytes_per_sample / MIB,
        p.output_bytes_per_sample / MIB,
        _collectives(p),
    ]


def _collectives(p) -> str:
    if not p.tp_collectives:
        return "-"
    parts = []
    for phase, short in (("forward", "fwd"), ("backward", "bwd")):
        mine = [c for c in p.tp_collectives if c.phase == phase]
        if mine:
            total = sum(c.bytes_per_sample for c in mine) / MIB
            kinds = sorted({c.kind for c in mine})
            parts.append(f"{short} {len(mine)}x {'/'.join(kinds)} ({total:.3g} MiB)")
    return ", ".join(parts)
