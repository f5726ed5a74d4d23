"""`smplan stack ...`: list and show software-stack profiles (hwprofiles/stack.py)."""

from __future__ import annotations

import dataclasses

import click

from smplan.hwprofiles import DEFAULT_STACK, bundled_stacks, load_stack
from smplan.hwprofiles.stack import read_stack, stack_path

from .checks import UserError
from .options import echo_json, json_option
from .table import format_table


@click.group()
def stack() -> None:
    """Software stacks: what the training framework, not the GPU, decides.

    A stack sets the host (CPU) launch time per layer pass (and what a MoE layer adds to
    it), the share of element-wise traffic its fused kernels keep on chip, its fused
    attention kernel (flash1, flash2 = torch SDPA / flash-attn 2, cudnn = Transformer
    Engine; timed at the GPU's published rate for it), ZeRO-3's gathered-parameter cap
    (DeepSpeed), how its sharded-DP collectives cross nodes (per_nic: one NIC's share each,
    DeepSpeed; ring: all rails, FSDP) and the NIC share per_nic reaches, what one ZeRO-1/2
    step collective covers (bucket: many blocks, Megatron, DeepSpeed; block: one per block,
    FSDP and smplan execute, where plain DDP is searched too), the share of the
    MoE expert all-to-alls it hides behind the paired micro-batch's compute (EP A2A
    overlap), how its MoE dispatch crosses nodes (all_to_all: NCCL; node_dedup: DeepEP /
    HybridEP, once per node), and whether the DP gradient reduce overlaps backward (the
    plan's overlap_dp default). plan, simulate, whatif (also --vary stack=A,B),
    reliability and calibrate take --stack NAME|PATH; the default is megatron-core, and a
    plan file records its stack. --hw-set efficiency.KEY=VALUE still wins over the stack.
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
             s.ep_dispatcher, "yes" if s.overlap_grad_reduce else "no", s.grad_reduce_dtype, s.description]
            for s in stacks]
    click.echo(format_table(["name", "host us/layer", "+ per MoE layer", "fusion", "attention", "ZeRO colls",
                             "NIC share", "ZeRO steps by", "zero3 live params", "TP overlap", "a2a overlap",
                             "dispatch", "overlap grad reduce", "grad reduce", "description"], rows,
                             align="lrrrllrlrrrllll"))
    click.echo("\nDetails and sources: smplan stack show NAME; use one with --stack NAME or --stack PATH.toml")


@stack.command("show")
@click.argument("name", metavar="NAME|PATH")
@json_option
def show(name: str, as_json: bool) -> None:
    """Every value of one stack; the TOML's comments cite where each value comes from."""
    if not name.strip():  # load_stack reads "" as the default stack; show names one
        raise UserError("give a stack name or a path to a .toml file (smplan stack list)")
    s = load_stack(name)
    if as_json:
        echo_json(_public(s))
        return
    click.echo(f"{s.name}: {s.description}")
    click.echo(f"  from {s.source}: {stack_path(name)}")
    stated = read_stack(name)  # a key the file leaves out takes the hardware-side default: say which
    for key, value in _public(s).items():
        if key not in ("name", "description", "source"):
            click.echo(f"  {key} = {value}" + ("" if key in stated else "  (not in the file: the default)"))


def _public(s) -> dict:
    return dataclasses.asdict(s)
