"""`smplan hw ...`: list, show (and, with its issue, probe) hardware profiles."""

from __future__ import annotations

import sys

import click

from smplan.hwprofiles import (
    a100_figures_taken,
    bundled_profiles,
    checked_on_its_gpu,
    implausible_values,
    load_cluster,
    parse_override,
)
from smplan.hwprofiles.stack import implausible_stack_values

from .checks import check_can_write
from .main import UserError
from .options import OneSpelling, echo_json, hw_options, json_option, non_empty_path
from .table import format_table


@click.group()
def hw() -> None:
    """Hardware profiles: list the bundled ones, show one."""


@hw.command("list")
@json_option
def list_profiles(as_json: bool) -> None:
    """Table of the bundled profiles (name, GPU, memory, bf16 TFLOP/s, bandwidths, $/GPU-h, and checked:
    whether published runs on that GPU are among the validation data)."""
    clusters = [load_cluster(name) for name in bundled_profiles()]
    if as_json:
        echo_json({"profiles": [c.to_dict() for c in clusters]})
        return
    rows = [
        [
            c.name,
            f"{c.gpus_per_node}x {c.gpu.name}",
            c.gpu.memory_gib,
            c.gpu.peak_tflops.bf16 or "-",  # V100 has no bf16 units
            c.intra_node.bandwidth_gbps,
            c.inter_node.bandwidth_gbps,
            c.cost.usd_per_gpu_hour,
            "yes" if checked_on_its_gpu(name) else "no",
        ]
        for name, c in zip(bundled_profiles(), clusters, strict=True)
    ]
    headers = ["name", "node", "memory GiB", "bf16 TFLOP/s", "intra GB/s", "inter GB/s", "$/GPU-h", "checked"]
    click.echo(format_table(headers, rows))
    click.echo("\nBandwidths are GB/s (gigabytes) per GPU per direction. checked: published runs on that GPU are among "
               "the validation sources; the others' predictions rest on factors fitted elsewhere and warn so. "
               "Every key: docs/HARDWARE.md. Details: smplan hw show NAME")


# What a 0 means for keys where it is not a value.
ZERO_MEANS = {"gpu.sm_count": "not stated", "gpu.matmul_ceiling.fp8": "not measured: bf16's figure",
              "efficiency.gemm_tile": "off"}


@hw.command("show")
@click.argument("name", metavar="[NAME|PATH]", required=False)
@hw_options(required=False)
@json_option
def show(name: str | None, hw: str | None, stack: str | None, nodes: int | None, hw_set: tuple[str, ...],
         as_json: bool) -> None:
    """Every value of one profile, NAME|PATH or --hw (with --stack / --nodes / --hw-set applied)."""
    if hw is not None and name is not None and hw != name:
        raise UserError(f"hw show got two profiles, {name} and --hw {hw}; give one: smplan hw show {hw}")
    name = name or hw
    if name is None:
        raise UserError("hw show needs a profile: smplan hw show NAME|PATH (smplan hw list names the bundled ones)")
    cluster = load_cluster(name, nodes=nodes, overrides=list(hw_set), stack=stack)
    overridden = {parse_override(kv)[0] for kv in hw_set}
    warnings = [*implausible_values(name, dict(parse_override(kv) for kv in hw_set)),
                *(implausible_stack_values(stack) if stack else [])]  # as plan and simulate say
    for line in warnings:
        click.echo(line, err=True)
    data = cluster.to_dict()
    if as_json:
        data["num_gpus"] = cluster.num_gpus
        data["notes"] = warnings  # as plan's, simulate's and whatif's --json list theirs
        echo_json(data)
        return
    click.echo(f"{cluster.name}: {cluster.description}")
    click.echo(f"  {cluster.nodes} node(s) x {cluster.gpus_per_node} GPUs = {cluster.num_gpus} GPUs")
    if cluster.fast_domain_gpus > cluster.gpus_per_node:
        click.echo(f"  NVLink domain: {cluster.fast_domain_gpus} GPUs "
                   f"({cluster.fast_domain_gpus // cluster.gpus_per_node} nodes); intra_node links span it")
    if not checked_on_its_gpu(name):
        click.echo("  efficiency factors: never fitted on this GPU (A100's defaults; smplan calibrate fits them)")
    borrowed = set(a100_figures_taken(name))
    for section, values in data.items():
        if isinstance(values, dict):
            click.echo(f"[{section}]")
            for key, value in _flatten(values):
                meaning = ZERO_MEANS.get(f"{section}.{key}") if not value else None
                if f"{section}.{key}" == "gpu.matmul_ceiling.fp8" and not value:
                    value = cluster.gpu.matmul_ceiling.for_dtype("fp8")  # the figure an fp8 GEMM is priced at
                if f"{section}.{key}" in borrowed and f"{section}.{key}" not in overridden:
                    meaning = "not in this profile: A100's measured figure"
                if f"{section}.{key}" in ("intra_node.bandwidth_gbps", "inter_node.bandwidth_gbps") and value:
                    meaning = bandwidth_meaning(value, cluster.gpus_per_node)
                if f"{section}.{key}" == "efficiency.tp_comm_overlap" and value and cluster.intra_node.fabric == "pcie":
                    meaning = "unused here: TE's userbuffers need NVLink, not PCIe"  # planner.pass_model
                click.echo(f"  {key} = {value}" + (f" ({meaning})" if meaning else ""))


def bandwidth_meaning(gb_per_s: float, gpus_per_node: int) -> str:
    """A link figure (GB/s per GPU per direction) in the units a datasheet or a NIC's name states
    it, so a figure typed in Gb/s shows as eight times too fast: 50.0 -> '400 Gb/s per GPU, 3200 Gb/s per
    node of 8, each direction'."""
    return (f"GB/s per GPU per direction = {gb_per_s * 8:g} Gb/s per GPU, {gb_per_s * 8 * gpus_per_node:g} Gb/s "
            f"per node of {gpus_per_node}")


def _flatten(values: dict, prefix: str = ""):
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _flatten(value, prefix + key + ".")
        else:
            yield prefix + key, value


def _profile_name(ctx, param, value: str) -> str:
    """A profile's name names it in plans and reports: one non-empty line."""
    if not value.strip() or value != value.strip() or not value.isprintable():
        raise click.BadParameter(f"{value!r} is not a profile name; give a non-empty name without "
                                 "surrounding spaces or control characters, e.g. --name mycluster")
    return value


@hw.command("probe")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, callback=non_empty_path, help="Write the profile TOML here.")
@click.option("--nproc-per-node", "--nproc", "nproc", cls=OneSpelling, old_names=("--nproc",), type=click.IntRange(min=1, max=64), default=2, show_default=True,
              help="Local processes for the collective measurements (gloo on CPU, nccl on GPU).")
@click.option("--name", default="local", show_default=True, callback=_profile_name,
              help="Profile name written into the file.")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@json_option
def probe_cmd(output: str | None, nproc: int, name: str, force: bool, as_json: bool) -> None:
    """Measure this machine and write a hardware profile (TOML) that --hw PATH loads.

    Measures GEMM FLOP/s by dtype over square sizes 64..1024 (fitted to the efficiency
    curve P*d/(d+h)), memory bandwidth (a large copy), and all-reduce / all-gather /
    send-recv time over message sizes across --nproc-per-node local processes (gloo on CPU, nccl
    on GPU), fitted to ring alpha-beta costs. On CPU each process is one "GPU" with
    OMP_NUM_THREADS threads (default 1), as in `smplan execute`. Takes ~20 s on 2 idle cores.

    \b
    Example:
      smplan hw probe -o myhw.toml --nproc-per-node 2
      smplan calibrate examples/gpt.py --hw myhw.toml -o calibrated.toml
      smplan plan examples/gpt.py:tiny --hw calibrated.toml
    """
    import dataclasses

    from smplan.hwprofiles.probe import check_nproc, probe, progress_steps, to_toml
    from smplan.hwprofiles.profile_file import check_writable, write_profile

    if output:
        check_writable(output, force)  # before ~20 s of measuring
        check_can_write(output, "-o/--output")
    check_nproc(nproc)
    steps = progress_steps(nproc=nproc)
    with click.progressbar(length=steps, label="probing", file=sys.stderr) as bar:
        result = probe(nproc=nproc, progress=lambda: bar.update(1))
    text = to_toml(result, name=name)
    if output:
        write_profile(text, output, force)  # validated before it replaces anything
    if as_json:
        data = dataclasses.asdict(result)
        data["output"] = output
        echo_json(data)
        return
    click.echo(f"device {result.device}, {nproc} processes")
    for dtype, points in result.matmul_tflops.items():
        curve = ", ".join(f"{d}: {tf * 1e3:.1f}" for d, tf in points.items())
        click.echo(f"  matmul {dtype} GFLOP/s by size  {curve}")
    click.echo(f"  fitted peak {', '.join(f'{k} {v * 1e3:.1f} GFLOP/s' for k, v in result.peak_tflops.items())}, "
               f"half-size {result.matmul_half_dim:.0f}")
    click.echo(f"  memory bandwidth {result.memory_bandwidth_gbps:.1f} GB/s")
    for kind, (gbps, us) in result.collective_fits.items():
        click.echo(f"  {kind} fit: {gbps:.2f} GB/s, {us:.1f} us latency")
    if not result.collective_fits:  # one process exchanges nothing
        click.echo(f"  link not measured (one process): the profile states the memory bandwidth, "
                   f"{result.link_bandwidth_gbps:.2f} GB/s; probe with --nproc-per-node 2 or more to measure it")
    if output:
        click.echo(f"wrote {output} (loads with --hw {output})")
    else:
        click.echo(text)
