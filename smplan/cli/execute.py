"""`smplan execute PLAN`: run a plan for real under torchrun (or write an sbatch script)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import sys

import click

# The executor's modules that run a plan (and smplan.monitor.rundir, which reads the executor's file
# names) import torch, 2.2 s on 2 cores: this module imports them inside the functions that run a
# plan, so that `smplan --help` and `smplan execute --help` show without it.
from smplan.hwprofiles import bundled_profiles
from smplan.planner import Plan
from smplan.simulator.prediction import model_changed, repriced

from .checks import check_can_write
from .main import Interrupted, RunFailed, UserError
from .options import (
    INLINE_PLAN_KEYS,
    FaultHookOption,
    LazyConstantOption,
    OneSpelling,
    echo_json,
    given_on_command_line,
    json_option,
    model_args_from,
    model_args_option,
    non_empty_path,
)


@click.command()
@click.argument("plan_arg", metavar="PLAN")
@click.option("--model", default=None, metavar="FILE.py[:builder]|hf:DIR",
              help="Model file, or hf:DIR (a Hugging Face config.json's folder); required for an inline "
                   "PLAN, overrides the plan file's model.")
@model_args_option
@click.option("--steps", type=click.IntRange(min=1), default=10, show_default=True, help="Optimizer steps.")
@click.option("--nproc-per-node", type=click.IntRange(min=1), default=None,
              help="Processes per node (default: the plan's world size, dp*tp*pp*cp, / nnodes).")
@click.option("--nnodes", type=click.IntRange(min=1), default=None,
              help="Nodes the run spans (torchrun --nnodes). Default: 1 with --launcher local (this machine; more "
                   "needs --rdzv-endpoint), the plan file's nodes with --launcher slurm.")
@click.option("--rdzv-endpoint", default=None, metavar="HOST:PORT", help="c10d rendezvous for multi-node runs.")
@click.option("--checkpoint-dir", default=None, type=click.Path(file_okay=False), callback=non_empty_path,
              help="Where step-N checkpoints go (default RUN_DIR/checkpoints when --checkpoint-every is set); "
                   "a folder holding another run's is only resumed from, never saved into.")
@click.option("--checkpoint-every", type=click.IntRange(min=0), default=None,
              help="Save every S steps (and at the end); 0: never. Default: 0, or on a run that resumes "
                   "from RUN_DIR the interval it was started with.")
@click.option("--keep-checkpoints", type=click.IntRange(min=0), default=None, metavar="K",
              help="After each save, remove all but the newest K of this run's step-N checkpoints (those of its "
                   "plan, up to the step saved), as torchtitan's keep_latest_k; 0 keeps every one. Default: 0, or "
                   "on a run that resumes from RUN_DIR the K it was started with.")
@click.option("--force-resume", is_flag=True, help="Resume from a checkpoint of another plan of the same model (DCP reshards it).")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True,
              help="Restarts torchrun's agent allows after a worker fails.")
@click.option("--launcher", type=click.Choice(["local", "slurm"]), default="local", show_default=True,
              help="local: start torchrun here; slurm: write an sbatch script into the run directory instead.")
@click.option("--time-limit", default=None, metavar="TIME",
              help="--launcher slurm: the job's --time (90, 4:00:00, 2-00:00:00). Default: 1.5x the plan's "
                   "predicted step time x the steps to run (after a resume's checkpoint), plus 10 minutes of "
                   "start-up per attempt; 1 hour when the plan predicts nothing (an inline plan).")
@click.option("-o", "--output", "--out", "out", cls=OneSpelling, old_names=("--out",), default=None, type=click.Path(file_okay=False), callback=non_empty_path,
              help="Run directory: metrics.jsonl, ranks/, summary.json, tensorboard/ (default runs/execute-...); "
                   "an existing one is only continued from its checkpoint.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the initial weights and the synthetic data: the same seed and micro-batch size give the "
                   "same run under any dp/tp/pp/cp/ep layout (the synthetic batches are drawn per micro-batch; "
                   "--data reads the same tokens whatever the micro-batch).")
@click.option("--lr", type=float, default=1e-3, show_default=True,
              help="AdamW peak learning rate (after warmup; the whole run's with --lr-schedule constant).")
@click.option("--reference-batch", type=click.IntRange(min=1), default=None, metavar="N",
              help="The global batch --lr (and --min-lr) was tuned at; when the plan's differs, both are scaled "
                   "by --lr-scaling and the rule is printed.")
@click.option("--lr-scaling", type=click.Choice(["linear", "sqrt"]), default="sqrt", show_default=True,
              help="With --reference-batch: sqrt (Adam, Malladi et al. 2022) or linear (SGD, Goyal et al. 2017) "
                   "in the batch ratio.")
@click.option("--lr-schedule", type=click.Choice(["constant", "cosine", "wsd"]), default="constant", show_default=True,
              help="constant; cosine: to --min-lr at the last step; wsd: warmup-stable-decay, linear to "
                   "--min-lr over the last --decay-fraction of the steps.")
@click.option("--warmup-steps", type=click.IntRange(min=0), default=0, show_default=True,
              help="Linear warmup: the lr reaches --lr at this step.")
@click.option("--min-lr", type=float, default=0.0, show_default=True, help="Final lr of cosine and wsd.")
@click.option("--decay-fraction", cls=LazyConstantOption, type=float,
              default_from="smplan.executor.recipe:DEFAULT_DECAY_FRACTION", show_default=True,
              help="wsd: the share of the steps the lr decays over, at the end.")
@click.option("--weight-decay", type=float, default=0.01, show_default=True,
              help="AdamW weight decay of weight matrices (norms, biases and 1-D parameters get none).")
@click.option("--grad-clip", type=float, default=1.0, show_default=True,
              help="Clip the global gradient norm to this; 0: off (the norm is still recorded).")
@click.option("--adam-betas", default="0.9,0.999", show_default=True, metavar="B1,B2", help="AdamW betas.")
@click.option("--data", default=None, metavar="PATH",
              help="Train on token ids from disk: a flat .bin (nanoGPT/Megatron), a .npy, or a folder of them "
                   "(sorted, read as one stream); replaces the model file's batch()/data().")
@click.option("--data-dtype", type=click.Choice(["uint16", "uint32"]), default="uint16", show_default=True,
              help="Token dtype of .bin files (a .npy carries its own).")
@click.option("--val-data", default=None, metavar="PATH", help="Validation tokens (same formats as --data).")
@click.option("--eval-every", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Record val_loss every N steps and at the last step (needs --val-data); 0: never.")
@click.option("--eval-batches", type=click.IntRange(min=1), default=4, show_default=True,
              help="Global batches of --val-data averaged into val_loss (always the same ones).")
@click.option("--init-from", default=None, metavar="PATH",
              help="Start from these weights: a safetensors folder (smplan export, save_pretrained) or a DCP "
                   "checkpoint (step-N folder or run directory); each rank reads only its shards.")
@click.option("--tensorboard", is_flag=True,
              help="Also write TensorBoard event files to RUN_DIR/tensorboard (needs smplan[monitor]).")
@click.option("--grad-norms-every", type=click.IntRange(min=0), default=10, show_default=True, metavar="K",
              help="Record every block's gradient norm at step 1 and every K steps; 0: never.")
@click.option("--fail-at-step", cls=FaultHookOption, type=click.IntRange(min=1), default=None,
              envvar_from="smplan.executor.config:FAIL_ENV", hidden=True,
              help="Test hook: SIGKILL the last rank at the start of this step (first attempt only).")
@click.option("--slow-rank", cls=FaultHookOption, default=None, envvar_from="smplan.executor.config:SLOW_ENV",
              hidden=True, metavar="RANK:SECONDS",
              help="Test hook: that rank sleeps SECONDS every step (a straggler for smplan monitor).")
@json_option(help="Print one JSON object instead of the text output (for scripts): status (finished, failed or "
                  "interrupted), run_dir and summary; a run that does not finish also gives its reason and exit_code "
                  "(the command's, as without --json).")
def execute(plan_arg, model, model_args, steps, nproc_per_node, nnodes, rdzv_endpoint, checkpoint_dir,
            checkpoint_every, keep_checkpoints, force_resume, max_restarts, launcher, time_limit, out, seed, lr, reference_batch, lr_scaling,
            lr_schedule, warmup_steps, min_lr,
            decay_fraction, weight_decay, grad_clip, adam_betas, data, data_dtype, val_data, eval_every, eval_batches,
            init_from, tensorboard, grad_norms_every, fail_at_step, slow_rank, as_json):
    """Run PLAN (a plan.json, or inline keys such as "tp=2,pp=2,dp=1,mbs=1,gbs=4" with --model).

    Inline keys: {inline_keys}. The model's sequence length is its builder's: --arg seq_len=N.

    \b
      smplan execute plan.json --steps 20
      smplan execute "dp=2,mbs=2,gbs=8" --model examples/gpt.py:tiny --checkpoint-every 5
      smplan execute plan.json --launcher slurm   # an sbatch script for the plan's nodes
      smplan execute plan.json --tensorboard      # then: smplan monitor RUN_DIR --follow
      smplan execute plan.json --steps 1000 --data train.bin --val-data val.bin --eval-every 50 \\
          --lr 3e-4 --lr-schedule cosine --warmup-steps 100 --min-lr 3e-5

    \b
    RUN_DIR gets metrics.jsonl (one line per step), ranks/rank-00000.jsonl ... (every rank's step
    time, wait, phases and memory), summary.json, run_config.json (what was launched),
    elastic/ (each attempt's stderr of every rank and stdout of the ranks the console does not
    show: the first place to look after a failure, whose message names the log) and, with
    --tensorboard, tensorboard/.
    """
    from smplan.executor import ExecuteOptions, LaunchError, resolve_plan
    from smplan.executor import execute as run_plan
    from smplan.executor.checkpoint import latest as latest_checkpoint
    from smplan.executor.launch import LaunchInterrupted
    from smplan.executor.nodes import slurm_nnodes
    from smplan.executor.recipe import parse_betas
    from smplan.executor.run import check_options

    given_nnodes, nnodes = nnodes, nnodes or 1
    opts = ExecuteOptions(steps=steps, nproc_per_node=nproc_per_node, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint,
                          checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                          keep_checkpoints=keep_checkpoints,
                          max_restarts=max_restarts, launcher=launcher, out=out, fail_at_step=fail_at_step,
                          force_resume=force_resume, seed=seed, lr=lr, tensorboard=tensorboard,
                          grad_norms_every=grad_norms_every, slow_rank=slow_rank, clip=grad_clip,
                          lr_schedule=lr_schedule, warmup_steps=warmup_steps, min_lr=min_lr,
                          decay_fraction=decay_fraction, weight_decay=weight_decay,
                          adam_betas=parse_betas(adam_betas), data=data, data_dtype=data_dtype,
                          val_data=val_data, eval_every=eval_every, eval_batches=eval_batches,
                          init_from=init_from, reference_batch=reference_batch, lr_scaling=lr_scaling,
                          time_limit=time_limit)
    check_options(opts)  # before the model file is even loaded
    if given_on_command_line("lr_scaling") and not reference_batch:
        raise UserError(f"--lr-scaling {lr_scaling} scales --lr from the global batch it was tuned at: add "
                        "--reference-batch B, or drop --lr-scaling")
    if warmup_steps and warmup_steps >= steps:
        click.echo(f"note: --warmup-steps {warmup_steps} is not shorter than --steps {steps}: the lr never "
                   f"reaches --lr {lr:g}", err=True)
    check_can_write(out, "-o/--output", folder=True)
    check_can_write(checkpoint_dir, "--checkpoint-dir", folder=True)
    args = model_args_from(model_args)
    plan, model_file = resolve_plan(plan_arg, model=model, model_args=args, nproc_per_node=nproc_per_node,
                                    nnodes=nnodes)
    plan = _own_prediction(plan_arg, plan, model, args, model_file)
    if launcher == "slurm":  # the job spans the nodes it was planned for, or those its processes fill
        opts = dataclasses.replace(opts, nnodes=slurm_nnodes(plan_arg, plan, given_nnodes, nproc_per_node))
    elif given_nnodes is None and plan.nodes > 1 and not nproc_per_node:
        click.echo(f"note: the plan is for {plan.nodes} nodes; all {plan.world_size} of its processes start on this "
                   "machine (--launcher slurm spans its nodes; --nnodes N --rdzv-endpoint HOST:PORT on each node "
                   "splits it by hand)", err=True)
    resume_root = checkpoint_dir or (os.path.join(out, "checkpoints") if out else None)
    resumes = latest_checkpoint(resume_root) if resume_root else None
    if init_from and resumes:
        click.echo(f"note: --init-from {init_from} is not used: the run resumes from its own checkpoint "
                   f"{resumes[1]}", err=True)
    if checkpoint_dir and not checkpoint_every and not latest_checkpoint(checkpoint_dir):
        click.echo(f"note: --checkpoint-dir {checkpoint_dir} holds no checkpoint to resume from, and without "
                   "--checkpoint-every N this run writes none there", err=True)
    if getattr(plan, "capacity_factor", 1.0) != 1.0 and "capacity_factor" not in (plan.model_args or {}):
        # the plan's cf prices the busiest expert; what the run drops is the model's own setting
        click.echo(f"note: cf={plan.capacity_factor:g} is the cost model's allowance for the busiest expert; "
                   "the run routes as the model file does (--arg capacity_factor=X sets its capacity)", err=True)
    try:
        # --json: stdout carries the one JSON object, so the ranks' per-step lines go to stderr
        with _stdout_to_stderr() if as_json else contextlib.nullcontext():
            result = run_plan(plan, model_file, opts, progress=lambda line: click.echo(line, err=True))
    except LaunchError as err:
        if as_json:
            echo_json(_stopped_json(err.run_dir, str(err), err.exit_code))
        raise RunFailed(str(err), exit_code=err.exit_code) from None
    except LaunchInterrupted as err:
        if as_json:
            echo_json(_stopped_json(err.run_dir, str(err), Interrupted.exit_code))
        raise
    if result.sbatch is not None:
        if as_json:
            echo_json({"sbatch": str(result.sbatch), "run_dir": str(result.run_dir),
                       "time_limit": result.time_limit})
            return
        per_node = opts.nproc_per_node or -(-plan.world_size // opts.nnodes)
        count = (f"{per_node} GPU{'s' if per_node != 1 else ''}" if result.gpus_per_node else
                 f"{per_node} process{'es' if per_node != 1 else ''} (no GPU: the plan's hardware is a CPU profile)")
        click.echo(f"wrote {result.sbatch}: {opts.nnodes} node{'s' if opts.nnodes != 1 else ''} x {count} "
                   "(--nnodes / --nproc-per-node set them)")
        click.echo(f"its --time is {result.time_limit}: {result.time_limit_reason}")
        click.echo(f"submit it with:  sbatch {shlex.quote(str(result.sbatch))}")
        return
    if as_json:
        echo_json({"status": "finished", "run_dir": str(result.run_dir), "summary": result.summary})
        return
    click.echo(f"run directory: {result.run_dir} (metrics.jsonl, summary.json)")
    if result.summary:
        _echo_summary(result.summary, plan)


# the inline keys, listed once (cli/options.py) for every command that takes an inline plan
execute.help = execute.help.replace("{inline_keys}", INLINE_PLAN_KEYS)


def _stopped_json(run_dir, message: str, exit_code: int) -> dict:
    """--json's object for a run that started and did not finish: what its stopped.json records
    (as `smplan monitor` reads it), else the launcher's first line."""
    from smplan.monitor.rundir import read_stopped

    stopped = read_stopped(run_dir) if run_dir else None
    return {"status": stopped["reason"] if stopped else "failed", "run_dir": str(run_dir) if run_dir else None,
            "reason": stopped.get("detail") if stopped else message.splitlines()[0], "exit_code": exit_code,
            "summary": None}


def _own_prediction(plan_arg: str, plan, model: str | None, model_args: dict, model_file):
    """The plan with predicted figures of its own: none when --model / --arg build another model
    than the file's, the simulated ones when the file's are stale (prediction.repriced)."""
    if plan.predicted is None:  # an inline plan, or a file without figures
        return plan
    defaults = {k: p.default for k, p in model_file.builder_parameters().items() if p.default is not p.empty}
    written = Plan.load(plan_arg)
    if model_changed(written, model, model_args, defaults):
        # resolve_plan drops the seq_len of another model file's plan: say so, as it changes the run
        length = (f"; it trains at the sequence length of the model it builds, not the plan's seq_len={written.seq_len}"
                  if written.seq_len and plan.seq_len is None else "")
        click.echo(f"note: --model/--arg build another model than {plan_arg} was priced for; this run is not "
                   f"compared with its predicted figures{length}", err=True)
        return plan.replace(predicted=None)
    checked, note, priced = repriced(plan_arg, plan)
    if not priced:
        # the figures could not be checked (a profile moved away, or a plan the cost model refuses):
        # a plan the run refuses too is that one error, not a note that reads as if the run starts
        from smplan.executor.validate import validate_plan

        validate_plan(plan, model_file)
    if note:
        click.echo(note, err=True)
    return checked


# Past this factor either way a measured step is worth calibrating for: the bundled factors'
# worst per-source MAPE on published runs is 18% (Megatron-Bridge, benchmarks/validate_published.py),
# so x1.5 is not the model's usual error but a machine it was not fitted on.
CALIBRATE_HINT_RATIO = 1.5


def _figure(value: float) -> str:
    """Four significant digits, with thousands separators rather than an exponent (11,770, not 1.177e+04)."""
    return f"{value:,.0f}" if abs(value) >= 1e3 else f"{value:.4g}"


def _echo_summary(summary: dict, plan) -> None:
    measured, predicted = summary["measured"], summary.get("predicted")
    ratio = summary.get("ratio_measured_over_predicted") or {}
    steps = summary.get("steps") or 0
    warm = summary.get("warm_up_steps") or [1]  # the first step after each start (executor.metrics.steady)
    other = summary.get("other_layout_steps") or []  # resumed under another layout: another plan's steps
    if other:
        left, n = summary.get("warm_up_steps") or [], steps - len(other)
        span = f"{other[0]}-{other[-1]}" if other[-1] - other[0] == len(other) - 1 else ", ".join(map(str, other))
        skip = (f"; medians leave out step{'s' if len(left) > 1 else ''} {', '.join(map(str, left))}, which warm"
                f"{'s' if len(left) == 1 else ''} up" if left else "")
        click.echo(f"  over the {n} step{'s' if n != 1 else ''} run with this plan (steps {span} ran another layout, "
                   f"recompute or dtype before it resumed them{skip})")
    elif steps > 1:  # a resumed run's summary covers the steps of every invocation
        which = f"step {warm[0]}, which warms" if len(warm) == 1 else f"steps {', '.join(map(str, warm))}, which warm"
        click.echo(f"  over the run's {steps} steps (medians leave out {which} up)")
    elif steps == 1:
        click.echo("  over the run's 1 step, which warms up (allocations, first kernels): the steps after it are faster")
    # the throughput in the plan's unit (samples/s for a model without sequences); older summaries: tokens
    for key in ("step_time_s", summary.get("throughput_key", "tokens_per_s"), "peak_memory_gib"):
        line = f"  {key:16s} measured {_figure(measured.get(key, float('nan')))}"
        if predicted and predicted.get(key) is not None:
            r = ratio.get(key)
            line += f"  predicted {_figure(predicted[key])}" + (f"  ratio {r:.2f}" if r is not None else "")
        elif predicted and key == "peak_memory_gib":
            line += "  (process RSS on CPU: not compared with the prediction)"
        click.echo(line)
    gpu_plan_on_cpu = summary.get("device") == "cpu" and plan.hw in bundled_profiles()  # every bundled one is a GPU
    if predicted and gpu_plan_on_cpu:
        click.echo(f"  (predicted for {plan.world_size} GPU{'s' if plan.world_size != 1 else ''} of {plan.hw}; this "
                   "run is on CPU, so the ratios do not test the prediction)")
    planned = summary.get("plan", {}).get("dtype")
    if summary.get("compute_dtype") and planned and planned != summary["compute_dtype"]:
        # bf16 / fp16 autocast is for a GPU; fp8 runs on CPU too, so a CPU run outside it converted no linear
        on_gpu_only = summary.get("device") == "cpu" and planned != "fp8"
        where = "the plan's {} applies on a GPU" if on_gpu_only else "not the plan's {}"
        click.echo(f"  (ran in {summary['compute_dtype']}: {where.format(planned)})")
    if not predicted:
        click.echo(f"  ({summary.get('note', 'no prediction in the plan')})")
    off = ratio.get("step_time_s")
    loads = plan.hw in bundled_profiles() or os.path.isfile(plan.hw)  # a hand-edited hw would not
    if (off is not None and loads and not gpu_plan_on_cpu
            and not 1 / CALIBRATE_HINT_RATIO <= off <= CALIBRATE_HINT_RATIO):
        args = "".join(f" --arg {k}={v}" for k, v in (plan.model_args or {}).items())
        args += "".join(f" --hw-set {k}={v}" for k, v in (plan.hw_overrides or {}).items())
        out = _unused_name("cal", ".toml")  # calibrate refuses to overwrite: suggest a command that runs
        click.echo(f"  note: the step took {off:.2f}x its prediction on this machine; `smplan calibrate {plan.model}"
                   f"{args} --hw {plan.hw} -o {out}` runs a few plans of its own here and fits the profile's efficiency "
                   f"and host-time factors to them, and `smplan plan --hw {out}` then predicts with them")
    click.echo(f"  final loss {measured.get('final_loss', float('nan')):.6f}")
    if "final_val_loss" in measured:
        click.echo(f"  final val loss {measured['final_val_loss']:.6f}")


def _unused_name(stem: str, suffix: str) -> str:
    """STEM.SUFFIX, or STEM-2.SUFFIX, ... : the first that does not exist here."""
    k = 1
    while os.path.exists(name := stem + (f"-{k}" if k > 1 else "") + suffix):
        k += 1
    return name


@contextlib.contextmanager
def _stdout_to_stderr():
    """Point file descriptor 1 at stderr: the worker processes inherit it from the agent."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
