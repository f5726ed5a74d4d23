"""`smplan hw ...`: list, show (and, with its issue, probe) hardware profiles."""

from __future__ import annotations

import click

from hwprofiles import bundled_profiles, load_cluster

from .options import echo_json, hw_options, json_option
from .table import format_table


@click.group()
def hw() -> None:
    """Hardware profiles: list the bundled ones, show one."""


@hw.command("list")
@json_option
def list_profiles(as_json: bool) -> None:
    """Table of the bundled profiles (name, GPU, memory, bf16 TFLOP/s, bandwidths, $/GPU-h)."""
    clusters = [load_cluster(name) for name in bundled_profiles()]
    if as_json:
        echo_json({"profiles": [c.to_dict() for c in clusters]})
        return
    rows = [
        [
            c.name,
            f"{c.gpus_per_node}x {c.gpu.name}",
            c.gpu.memory_gib,
            c.gpu.peak_tflops.bf16,
            c.intra_node.bandwidth_gbps,
            c.inter_node.bandwidth_gbps,
            c.cost.usd_per_gpu_hour,
        ]
        for c in clusters
    ]
    headers = ["name", "node", "memory GiB", "bf16 TFLOP/s", "intra GB/s", "inter GB/s", "$/GPU-h"]
    click.echo(format_table(headers, rows))
    click.echo("\nBandwidths are GB/s per GPU per direction. Details: smplan hw show NAME")


@hw.command("show")
@click.argument("name", metavar="NAME|PATH")
@hw_options(required=False)
@json_option
def show(name: str, hw: str | None, nodes: int | None, hw_set: tuple[str, ...], as_json: bool) -> None:
    """Every value of one profile (with --nodes / --hw-set applied)."""
    cluster = load_cluster(hw or name, nodes=nodes, overrides=list(hw_set))
    data = cluster.to_dict()
    if as_json:
        data["num_gpus"] = cluster.num_gpus
        echo_json(data)
        return
    click.echo(f"{cluster.name}: {cluster.description}")
    click.echo(f"  {cluster.nodes} node(s) x {cluster.gpus_per_node} GPUs = {cluster.num_gpus} GPUs")
    for section, values in data.items():
        if isinstance(values, dict):
            click.echo(f"[{section}]")
            for key, value in _flatten(values):
                click.echo(f"  {key} = {value}")


def _flatten(values: dict, prefix: str = ""):
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _flatten(value, prefix + key + ".")
        else:
            yield prefix + key, value
