"""`smplan stack ...`: list and show software-stack profiles (hwprofiles/stack.py)."""

from __future__ import annotations

import dataclasses

import click

from smplan.hwprofiles import DEFAULT_STACK, bundled_stacks, load_stack
from smplan.hwprofiles.stack import implausible_stack_values, read_stack, stack_path

from .checks import UserError
from .options import echo_json, json_option
from .table import format_table


@click.group()
def stack() -> None:
    """Software stacks: what the training framework, not the GPU, decides.

    \b
    The keys of a stack file (docs/HARDWARE.md; required: the first three):
      host_overhead_us_per_layer      CPU launch time per layer pass, microseconds
      elementwise_fusion              share of element-wise traffic fused kernels keep on chip, 0..1
      overlap_grad_reduce             DP gradient reduce overlaps backward (the plan's overlap_dp default)
      host_overhead_us_per_moe_layer  extra CPU time of a MoE layer pass, microseconds
      attention_kernel                flash1, flash2 (torch SDPA / flash-attn 2) or cudnn (Transformer
                                      Engine), timed at the GPU's published rate for it
      zero3_max_live_params           ZeRO-3 parameters gathered at once, at most (0: no cap; DeepSpeed)
      single_nic_network              share of one NIC that per_nic sharded-DP collectives reach, 0..1
      zero_collectives                per_nic (one NIC's share each, DeepSpeed) or ring (all rails, FSDP)
      zero_granularity                one ZeRO-1/2 step collective per bucket (Megatron, DeepSpeed) or
                                      per block (FSDP and smplan execute)
      tp_comm_overlap                 share of the sequence-parallel TP collectives hidden under the
                                      GEMMs (Transformer Engine userbuffers, torchtitan async TP), 0..1
      ep_a2a_overlap                  share of the MoE all-to-alls hidden behind the paired micro-batch
      ep_dispatcher                   all_to_all (NCCL) or node_dedup (DeepEP / HybridEP, once per node)
      cp_comm                         all_gather (NCCL all-gather of K/V: torchtitan, smplan execute)
                                      or p2p (Transformer Engine's ring under attention: megatron-core)
      grad_reduce_dtype               weights (bf16 / fp16) or fp32: the dtype gradients cross DP in
                                      (fp32: held in an fp32 buffer below ZeRO-3 too)
      pp_send                         full (each tp rank sends its whole activation to the next
                                      stage without sp) or tp_slice (1/tp: 2021 Megatron-LM)
      sp_saved_input                  shard (sp keeps 1/tp of a column-parallel linear's input and
                                      gathers it again in backward: Megatron) or gathered (the whole
                                      gathered input: DTensor, torchtitan and smplan execute)
      cross_entropy                   in_place (Megatron's vocab-parallel loss: one fp32 copy of the
                                      logits, 3x their bytes at the peak) or traced (the model
                                      file's loss as it runs, its peak measured: torchtitan, execute)

    plan, simulate, whatif (also --vary stack=A,B), reliability, calibrate and hw show take --stack
    NAME|PATH; the default is megatron-core, and a plan file records its stack. --hw-set
    efficiency.KEY=VALUE still wins over the stack.
    """


@stack.command("list")
@json_option
def list_stacks(as_json: bool) -> None:
    """Table of the bundled stacks."""
    stacks = [load_stack(name) for name in bundled_stacks()]
    if as_json:
        echo_json({"default": DEFAULT_STACK, "stacks": [_public(s) for s in stacks]})
        return
    rows = [[s.name + (" (default)" if s.name == DEFAULT_STACK else ""), s.host_overhead_us_per_layer,
             s.host_overhead_us_per_moe_layer, s.elementwise_fusion, s.attention_kernel, s.zero_collectives,
             s.single_nic_network, s.zero_granularity,
             f"{s.zero3_max_live_params:.3g}" if s.zero3_max_live_params else "-", s.tp_comm_overlap, s.ep_a2a_overlap,
             s.ep_dispatcher, s.cp_comm, "yes" if s.overlap_grad_reduce else "no", s.grad_reduce_dtype, s.pp_send,
             s.sp_saved_input, s.cross_entropy, s.description]
            for s in stacks]
    click.echo(format_table(["name", "host us/layer", "+ per MoE layer", "fusion", "attention", "ZeRO colls",
                             "NIC share", "ZeRO steps by", "zero3 live params", "TP overlap", "a2a overlap",
                             "dispatch", "CP K/V", "overlap grad reduce", "grad reduce", "pp send", "sp keeps",
                             "loss", "description"], rows, align="lrrrllrlrrrllllllll"))
    click.echo("\nDetails and sources: smplan stack show NAME; use one with --stack NAME or --stack PATH.toml")


@stack.command("show")
@click.argument("name", metavar="NAME|PATH")
@json_option
def show(name: str, as_json: bool) -> None:
    """Every value of one stack; the TOML's comments cite where each value comes from."""
    if not name.strip():  # load_stack reads "" as the default stack; show names one
        raise UserError("give a stack name or a path to a .toml file (smplan stack list)")
    s = load_stack(name)
    for line in implausible_stack_values(name):  # as plan and simulate say
        click.echo(line, err=True)
    if as_json:
        echo_json(_public(s))
        return
    click.echo(f"{s.name}: {s.description}")
    # a file's source already names its path; a bundled stack's says where it lies
    click.echo(f"  from {s.source}" + (f": {stack_path(name)}" if s.source.startswith("bundled") else ""))
    stated = read_stack(name)  # a key the file leaves out takes the hardware-side default: say which
    for key, value in _public(s).items():
        if key not in ("name", "description", "source"):
            shown = int(value) if key == "zero3_max_live_params" and float(value).is_integer() else value  # a count
            click.echo(f"  {key} = {shown}" + ("" if key in stated else "  (not in the file: the default)"))


def _public(s) -> dict:
    return dataclasses.asdict(s)
