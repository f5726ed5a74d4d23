"""`smplan export RUN_DIR OUT_DIR`: a run's checkpoint as a Hugging Face folder."""

from __future__ import annotations

import click

from .checks import FiniteFloat, check_can_write
from .options import echo_json, json_option, non_empty_path


@click.command()
@click.argument("run_dir", metavar="RUN_DIR")
@click.argument("out_dir", metavar="OUT_DIR", callback=non_empty_path)
@click.option("--step", type=click.IntRange(min=1), default=None,
              help="Export the checkpoint of this step (default: the latest complete one).")
@click.option("--max-shard-gib", type=FiniteFloat(), default=None,
              help="Largest safetensors file; more weights are split into model-0000K-of-0000N files "
                   "with model.safetensors.index.json (default 4.66: the 5 GB of transformers 4's save_pretrained).")
@click.option("--force", is_flag=True, help="Write into a non-empty OUT_DIR (its old safetensors files are removed); never into a run folder.")
@json_option
def export(run_dir, out_dir, step, max_shard_gib, force, as_json):
    """Write RUN_DIR's checkpoint as safetensors + config.json, which
    transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR) loads.

    \b
      smplan export runs/demo hf-out
      smplan export runs/demo hf-out --step 200 --force
      smplan execute plan.json --init-from hf-out     # train on from these weights

    RUN_DIR is a run of smplan execute with --checkpoint-every, of an hf:DIR model or a model
    file returning a transformers PreTrainedModel.
    """
    from smplan.executor.export import DEFAULT_MAX_SHARD_GIB, export_run

    check_can_write(out_dir, "OUT_DIR", folder=True)
    result = export_run(run_dir, out_dir, step=step, force=force,
                        max_shard_gib=DEFAULT_MAX_SHARD_GIB if max_shard_gib is None else max_shard_gib,
                        progress=lambda line: click.echo(f"note: {line}", err=True))
    if as_json:
        echo_json(result.to_dict())
        return
    gib = result.total_size_bytes / 2**30
    click.echo(f"exported step {result.step} of {result.run_dir}: {result.tensors} tensors, {gib:.3g} GiB, "
               f"{result.model_class}")
    click.echo(f"  {result.out_dir}: {', '.join(result.files)}")
