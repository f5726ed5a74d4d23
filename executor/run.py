"""`execute`: validate a plan against its model file, then launch it (or write sbatch).

Everything here runs before any worker process starts, so every user mistake becomes one
ValueError line (exit code 2 on the CLI).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from smplan.planner.feasibility import effective_zero, zero_with_pp_problem
from smplan.planner.model_file import load_model_file
from smplan.planner.plan import (
    Plan,
    PlanError,
    TooFewBlocksError,
    model_not_found,
    parse_inline,
    plan_from_inline,
)

from smplan.model.structure import find_layout, unlike_blocks

from . import checkpoint
from .config import (
    RunConfig,
    continued_inputs,
    fingerprint_inputs,
    hash_key,
    parse_slow_rank,
)
from .float8 import fp8_device_problem
from .host_fit import (
    available_host_bytes,
    shared_cores_note,
    state_copies,
    this_machine_problem,
)
from .launch import (
    LaunchError,
    LaunchInterrupted,
    check_slurm_time,
    launch_local,
    sbatch_path_problem,
    slurm_time_limit,
    write_sbatch,
)
from .lr_scaling import describe as describe_lr_scale
from .lr_scaling import lr_scale
from .metrics import CHECKPOINTS_DIR, SUMMARY_FILE
from .nodes import check_even_split, names_plan_file
from .precision import gpu_dtype_problem
from .recipe import DEFAULT_DECAY_FRACTION, Recipe
from .run_dir import (
    claim_run_dir,
    earlier_checkpoint_setting,
    earlier_config,
    keep_a_slurm_script,
    recorded_checkpoint_dir,
    refuse_checkpoints_not_ours,
    start_afresh,
)
from .run_lock import CHECKPOINT_LOCK_FILE, forget_abandoned_lock, holding_run_dir
from .token_data import Sequences, TokenStream, open_checked, resolve_shape, stream_digest
from .validate import PlanMismatchError, meta_profile, validate_plan


@dataclass
class ExecuteOptions:
    steps: int = 10
    nproc_per_node: int | None = None
    nnodes: int = 1
    rdzv_endpoint: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None  # None: 0, or on a resumed run the interval it ran with
    keep_checkpoints: int | None = None  # None: 0 (keep every one), or on a resumed run what it kept
    max_restarts: int = 0
    launcher: str = "local"
    out: str | None = None
    fail_at_step: int | None = None
    force_resume: bool = False
    seed: int = 0
    lr: float = 1e-3
    clip: float = 1.0
    tensorboard: bool = False
    grad_norms_every: int = 10
    slow_rank: str | None = None  # test hook "RANK:SECONDS" (config.SLOW_ENV)
    # training recipe (executor/recipe.py); clip is --grad-clip (0: off)
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    decay_fraction: float = DEFAULT_DECAY_FRACTION
    weight_decay: float = 0.01
    adam_betas: tuple[float, float] = (0.9, 0.999)
    # token data from disk (executor/token_data.py)
    data: str | None = None
    data_dtype: str = "uint16"
    val_data: str | None = None
    eval_every: int = 0
    eval_batches: int = 4
    init_from: str | None = None  # safetensors folder or DCP checkpoint (executor/init_from.py)
    # lr scaling to the plan's global batch (executor/lr_scaling.py); None: --lr as given
    reference_batch: int | None = None
    lr_scaling: str = "sqrt"
    time_limit: str | None = None  # --launcher slurm: sbatch --time; None: from the plan's prediction

    def recipe(self) -> Recipe:
        return Recipe(lr=self.lr, schedule=self.lr_schedule, total_steps=self.steps, warmup_steps=self.warmup_steps,
                      min_lr=self.min_lr, decay_fraction=self.decay_fraction, weight_decay=self.weight_decay,
                      betas=tuple(self.adam_betas), grad_clip=self.clip)


@dataclass
class ExecuteResult:
    run_dir: Path
    plan: Plan
    summary: dict | None = None
    sbatch: Path | None = None
    time_limit: str | None = None  # the sbatch script's --time
    time_limit_reason: str | None = None  # where it came from, for the CLI's line
    gpus_per_node: int | None = None  # the Slurm job's GPUs per node (0: a CPU profile's plan)


def resolve_plan(plan_arg: str, model: str | None = None, model_args: dict | None = None,
                 nproc_per_node: int | None = None, nnodes: int = 1) -> tuple[Plan, object]:
    """PLAN is a plan.json path or inline keys ("tp=2,pp=2,dp=1,mbs=1,gbs=4") with --model."""
    if names_plan_file(plan_arg):
        plan = Plan.load(plan_arg)
        missing = not model and model_not_found(plan, plan_arg, "pass --model PATH (or fix its \"model\" key)")
        if missing:
            raise PlanMismatchError(missing)
        model_file = load_model_file(model or plan.model)
        if model and not _same_model(model_file, plan.model):  # its seq_len is the file's model's
            plan = plan.replace(seq_len=None)
        if model or model_args:
            plan = plan.replace(model=model or plan.model, model_args={**plan.model_args, **(model_args or {})})
        return plan, model_file
    if not model and "=" not in plan_arg:  # a model where the plan goes: `smplan execute examples/gpt.py:tiny`
        raise PlanMismatchError(
            f"{plan_arg!r} is not a plan: give a plan file (smplan plan {plan_arg} --hw NAME -o plan.json), or inline "
            f'plan keys with the model as --model, e.g. smplan execute "dp=2,mbs=1,gbs=8" --model {plan_arg}')
    if not model:
        raise PlanMismatchError(f"an inline plan ({plan_arg!r}) needs --model FILE.py[:builder]")
    model_file = load_model_file(model)
    meta = model_file.build(model_args or {}, device="meta")
    layout = find_layout(meta)
    keys = parse_inline(plan_arg)
    world = keys.get("dp", 1) * keys.get("tp", 1) * keys.get("pp", 1) * keys.get("cp", 1)
    per_node = nproc_per_node or -(-world // nnodes)
    try:
        plan = plan_from_inline(keys, model=model, hw="local", nodes=nnodes, gpus_per_node=per_node,
                                num_blocks=layout.num_blocks, model_args=model_args)
    except TooFewBlocksError as err:  # a pyramid of one class: say why its run of blocks is short
        unlike = unlike_blocks(meta, layout)
        raise (err.because(unlike) if unlike else err) from None
    except PlanError as err:  # execute's processes are --nproc-per-node x --nnodes, not --nodes
        raise PlanError(str(err).replace("add --nodes", "give --nproc-per-node / --nnodes for them")) from None
    return plan, model_file


def _same_model(model_file, other: str) -> bool:
    """Whether `other` (a plan file's model) names the file and builder `model_file` loaded."""
    try:
        return load_model_file(other).absolute_ref == model_file.absolute_ref
    except (ValueError, OSError):  # ModelFileError: a model that moved away is another model
        return False


def check_options(opts: ExecuteOptions) -> None:
    """What a rank would otherwise choke on after the launch, refused before it."""
    opts.recipe().check()
    lr_scale(1, opts.reference_batch, opts.lr_scaling)  # the rule and the reference batch
    _check_data_options(opts)
    if opts.init_from:
        from .init_from import resolve

        resolve(opts.init_from)  # exists and holds weights; names and shapes once the model is built
    if not 0 <= opts.seed < 2**63:  # torch.manual_seed's range (a signed 64-bit generator seed)
        raise PlanMismatchError(f"--seed must be between 0 and 2**63-1, got {opts.seed}")
    if opts.rdzv_endpoint is not None and opts.launcher == "slurm":
        raise PlanMismatchError("--rdzv-endpoint applies to --launcher local; the Slurm script rendezvouses on its "
                                "allocation's first node")
    if opts.time_limit is not None:
        if opts.launcher != "slurm":
            raise PlanMismatchError("--time-limit is the Slurm job's --time: use it with --launcher slurm")
        try:
            check_slurm_time(opts.time_limit)
        except ValueError as err:
            raise PlanMismatchError(str(err)) from None
    if opts.rdzv_endpoint is not None:
        host, _, port = opts.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise PlanMismatchError(f"--rdzv-endpoint must be HOST:PORT (port 1-65535), got {opts.rdzv_endpoint!r}")


def _check_data_options(opts: ExecuteOptions) -> None:
    """The cheap part of the data checks (files exist, sizes fit the dtype), before any model is loaded."""
    if opts.eval_every < 0 or opts.eval_batches < 1:
        raise PlanMismatchError(f"--eval-every must be >= 0 and --eval-batches >= 1, got {opts.eval_every} and {opts.eval_batches}")
    if opts.val_data and not opts.data:
        raise PlanMismatchError("--val-data needs --data (validation batches are cut the same way)")
    if opts.eval_every and not opts.val_data:
        raise PlanMismatchError("--eval-every needs --val-data PATH")
    if opts.val_data and not opts.eval_every:
        raise PlanMismatchError("--val-data needs --eval-every N (validate every N steps)")
    for label, path in (("--data", opts.data), ("--val-data", opts.val_data)):
        if path:
            TokenStream(path, opts.data_dtype, label)


def _resolve_data(plan: Plan, model_file, opts: ExecuteOptions, batch_tokens: int) -> tuple[int | None, int | None]:
    """(seq_len, vocab) of a --data run, after checking both streams against them."""
    if not opts.data:
        return None, None
    seq_len, vocab = resolve_shape(plan, model_file, batch_tokens)
    for label, path in (("--data", opts.data), ("--val-data", opts.val_data)):
        if path:
            seqs = open_checked(path, opts.data_dtype, label, seq_len, plan.global_batch, vocab)
            held = seqs.count // plan.global_batch
            if label == "--val-data" and opts.eval_batches > held:
                # past its end the stream wraps: the mean would count its first batches again
                raise PlanMismatchError(
                    f"--eval-batches {opts.eval_batches} needs that many global batches of --val-data, but "
                    f"{path} holds {held} ({seqs.count} sequences of seq_len+1={seq_len + 1} tokens, "
                    f"{plan.global_batch} a batch); "
                    + (f"use --eval-batches {held} or fewer" if held > 1 else "use --eval-batches 1, or more --val-data"))
    return seq_len, vocab


def prepare(plan: Plan, model_file, opts: ExecuteOptions) -> RunConfig:
    check_options(opts)
    nproc = opts.nproc_per_node or -(-plan.world_size // opts.nnodes)
    if opts.steps < 1:
        raise PlanMismatchError(f"--steps must be at least 1, got {opts.steps}")
    if opts.launcher not in ("local", "slurm"):
        raise PlanMismatchError(f"--launcher must be local or slurm, got {opts.launcher!r}")
    if opts.nnodes > 1 and opts.launcher == "local" and not opts.rdzv_endpoint:
        raise PlanMismatchError(f"--nnodes {opts.nnodes} needs --rdzv-endpoint host:port (the same on every node)")
    if not opts.nproc_per_node:
        check_even_split(plan.world_size, opts.nnodes)
    checked = validate_plan(plan, model_file, world_size=nproc * opts.nnodes)
    meta_profile(plan, model_file)  # a forward that fails on meta for a reason real data meets too: refused
    if opts.launcher == "local":  # Slurm's nodes are not this machine
        check_this_machine(nproc, opts.nnodes, checked.param_bytes, plan)
    seq_len, vocab = _resolve_data(plan, model_file, opts, checked.tokens_per_sample)
    init_from = _check_init_from(opts.init_from, plan, model_file)
    # the sequence length the run trains at (its batch()'s tokens a sample): an inline plan (no seq_len)
    # and the plan file `smplan plan` wrote for it (the model's seq_len) continue each other's checkpoints
    trained = seq_len or (checked.tokens_per_sample if checked.tokens_per_sample > 1 else None)
    inputs = fingerprint_inputs(plan if plan.seq_len or not trained else plan.replace(seq_len=trained), model_file.sha256)
    fp = hash_key(inputs)  # config.fingerprint: what a checkpoint must match to be resumed
    out = Path(opts.out or f"runs/execute-{time.strftime('%Y%m%d-%H%M%S')}-{fp[:6]}").resolve()
    unsafe = sbatch_path_problem(out) if opts.launcher == "slurm" else None
    if unsafe:
        raise PlanMismatchError(unsafe)
    # The run directory's own checkpoints: written with --checkpoint-every, and resumed from
    # whenever they exist, so a second `execute -o RUN_DIR` continues the run it finds there.
    own = out / CHECKPOINTS_DIR
    given = opts.checkpoint_every
    ckpt_dir = (opts.checkpoint_dir or recorded_checkpoint_dir(out)
                or (str(own) if given or checkpoint.latest(own) else None))
    if given is not None and given < 0:
        raise PlanMismatchError("--checkpoint-every must be >= 0")
    every = given if given is not None else earlier_checkpoint_setting(out, ckpt_dir)
    keep = (opts.keep_checkpoints if opts.keep_checkpoints is not None
            else earlier_checkpoint_setting(out, ckpt_dir, "keep_checkpoints"))
    if opts.grad_norms_every < 0:
        raise PlanMismatchError("--grad-norms-every must be >= 0 (0: never)")
    if opts.tensorboard:
        from .tensorboard_log import require_tensorboard

        require_tensorboard()
    parse_slow_rank(opts.slow_rank)
    found = None
    if ckpt_dir:
        ckpt_dir = str(Path(ckpt_dir).resolve())
        start = start_afresh(out, opts.checkpoint_dir)
        newest = checkpoint.latest(ckpt_dir)
        compared = inputs
        if newest:  # a run an older smplan started keeps the fingerprint it started with
            inputs, fp, compared = continued_inputs(checkpoint.read_meta(newest[1]), plan, model_file.sha256, inputs)
        if newest:  # another model's cannot be resumed: DCP would fail on every rank, in a traceback
            fix = f"{start} (--force-resume continues only a run of this same model)"
            if checkpoint.read_meta(newest[1]).get("fingerprint") == fp:  # the same file bytes, arguments, layout
                fix = ("the model changed since it was written though its file did not (a module the file imports, "
                       f"such as one beside it, did): restore that code to continue the run, or {start}")
            checkpoint.check_model(newest[1], model_file.build(plan.model_args, device="meta"), fix)
        found = checkpoint.check_resumable(  # refuse another plan's folder now
            ckpt_dir, fp, opts.force_resume, f"{start}, or --force-resume to continue it with this plan (DCP "
            "reshards its checkpoint)", inputs=compared)
        if found and found[0] >= opts.steps:
            raise PlanMismatchError(f"{found[1]} is at step {found[0]}, so --steps {opts.steps} leaves nothing to "
                                    f"run; pass --steps N with N > {found[0]} to train on")
        if every:  # it saves there: not over another run's checkpoints, nor a folder of the user's
            refuse_checkpoints_not_ours(Path(ckpt_dir), out, keep)
    if found:  # a resume loads its own checkpoint: --init-from weights are not what it continues from
        earlier = earlier_config(out)
        init_from = earlier.init_from if earlier is not None else None
    ref = model_file.absolute_ref
    factor = lr_scale(plan.global_batch, opts.reference_batch, opts.lr_scaling)
    cfg = RunConfig(
        plan=plan.replace(model=ref).to_dict(),
        model_ref=ref,
        out_dir=str(out),
        steps=opts.steps,
        seed=opts.seed,
        lr=opts.lr * factor,
        clip=opts.clip,
        checkpoint_dir=ckpt_dir,
        checkpoint_every=every,
        keep_checkpoints=keep,
        force_resume=opts.force_resume,
        fail_at_step=opts.fail_at_step,
        fingerprint=fp,
        fingerprint_inputs=inputs,
        tensorboard=opts.tensorboard,
        grad_norms_every=opts.grad_norms_every,
        slow_rank=opts.slow_rank,
        lr_schedule=opts.lr_schedule,
        warmup_steps=opts.warmup_steps,
        min_lr=opts.min_lr * factor,
        decay_fraction=opts.decay_fraction,
        weight_decay=opts.weight_decay,
        adam_betas=tuple(opts.adam_betas),
        data=str(Path(opts.data).resolve()) if opts.data else None,
        data_bytes=Path(opts.data).stat().st_size if opts.data else None,
        data_digest=stream_digest(opts.data) if opts.data else None,
        data_dtype=opts.data_dtype,
        val_data=str(Path(opts.val_data).resolve()) if opts.val_data else None,
        eval_every=opts.eval_every,
        eval_batches=opts.eval_batches,
        data_seq_len=seq_len,
        vocab=vocab,
        init_from=init_from,
        reference_batch=opts.reference_batch,
        lr_scaling=opts.lr_scaling if opts.reference_batch else None,
        lr_scale=factor,
    )
    if found and not opts.force_resume:
        _refuse_a_changed_recipe(found, cfg, out)
    keep_a_slurm_script(out, opts.launcher)
    return cfg


def slurm_gpus_per_node(plan: Plan, nproc: int) -> int:
    """The GPUs a Slurm job asks of each node: one per process, none for a plan made for a CPU
    profile of `smplan hw probe` (its gpu named PROBED_CPU_NAME, as the planner reads it)."""
    from smplan.hwprofiles import PROBED_CPU_NAME, load_cluster

    try:
        on_cpu = load_cluster(plan.hw, stack=plan.stack).gpu.name == PROBED_CPU_NAME
    except ValueError:  # an inline plan's "local", a profile moved away: GPUs, as a cluster's job wants
        on_cpu = False
    return 0 if on_cpu else nproc


def check_this_machine(nproc: int, nnodes: int, param_bytes: int, plan: Plan) -> None:
    """Raise PlanMismatchError when this machine cannot start `nproc` processes of `plan`'s run
    (executor/host_fit.py): its GPUs, or on CPU its free host memory for the copies of the
    parameters the plan's data parallelism keeps (host_fit.state_copies); on GPUs, a dtype they
    cannot train as priced (executor/precision.py); under fp8, GPUs without FP8 units
    (executor/float8.py)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else None
    copies = state_copies(plan.dp, plan.zero, plan.pp, plan.cp, plan.ep)
    problem = this_machine_problem(nproc, nnodes, param_bytes, gpus, available_host_bytes(), copies)
    if not problem and gpus:
        problem = gpu_dtype_problem(plan.dtype, torch.cuda.is_bf16_supported())
    if not problem and plan.dtype == "fp8":
        problem = fp8_device_problem(torch.cuda.get_device_capability(0) if gpus else None)
    if problem:
        raise PlanMismatchError(problem)


def _stretched_schedule_note(cfg: RunConfig) -> str | None:
    """A resume with another --steps re-spans a decaying schedule (cosine, wsd run to the last
    step): say how the lr moves where the run continues, or None."""
    found = checkpoint.latest(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    earlier = earlier_config(Path(cfg.out_dir)) if found else None
    if earlier is None or earlier.steps == cfg.steps or cfg.lr_schedule == "constant":
        return None
    from .recipe import lr_at

    step = found[0]
    was, now = lr_at(step, earlier.recipe()), lr_at(step + 1, cfg.recipe())
    return (f"note: the {cfg.lr_schedule} schedule spans --steps; continuing step {step} of {earlier.steps} to "
            f"{cfg.steps} steps stretches it: the lr goes from {was:.3g} (step {step}) to {now:.3g} (step {step + 1})")


def _data_epochs_note(cfg: RunConfig) -> str | None:
    """A --data stream shorter than the run wraps around (token_data.Sequences): say how many
    times the run reads it, or None when it reads each sequence at most once."""
    if not cfg.data or not cfg.data_seq_len:
        return None
    seqs = Sequences(TokenStream(cfg.data, cfg.data_dtype, "--data"), cfg.data_seq_len)
    needed = cfg.steps * Plan.from_dict(cfg.plan).global_batch
    if needed <= seqs.count:
        return None
    return (f"note: {cfg.data} holds {seqs.count:,} sequences of seq_len+1={cfg.data_seq_len + 1} tokens and "
            f"{cfg.steps} steps read {needed:,}: the stream wraps around, {needed / seqs.count:.2f} epochs")


def _shared_cores(nproc: int, launcher: str) -> str | None:
    """host_fit.shared_cores_note for a local launch without CUDA (Slurm's nodes are not this machine)."""
    import torch

    return None if launcher != "local" or torch.cuda.is_available() else shared_cores_note(nproc)


def _synthetic_data_note(cfg: RunConfig, model_file) -> str | None:
    """An hf: model trained without --data: its batch() draws uniform random tokens, whose
    cross-entropy cannot fall below ln(vocab) (a new user read the flat loss as a broken run)."""
    if cfg.data or not getattr(model_file, "is_hf_config", False):
        return None
    return ("note: no --data: training on uniform random tokens (an hf: model's batch()), whose loss falls to "
            "ln(vocab) and no lower; --data FILE.bin trains on real tokens")


def _keep_note(cfg: RunConfig) -> str | None:
    """--keep-checkpoints on a run that saves none (no --checkpoint-every, given or continued)."""
    if not cfg.keep_checkpoints or cfg.checkpoint_every:
        return None
    return (f"note: --keep-checkpoints {cfg.keep_checkpoints} does nothing here: this run saves no checkpoint "
            "(add --checkpoint-every N)")


def _zero_note(plan: Plan) -> str | None:
    """A ZeRO stage the pipeline turns into another (planner feasibility.effective_zero), or that
    FSDP2 has not (ZeRO-1 without pipeline stages): what runs."""
    if plan.zero == 1 and plan.pp == 1 and plan.dp * plan.cp > 1:
        return ("note: zero=1 without pipeline stages runs as FSDP2 keeping the parameters gathered from forward "
                "to backward (ZeRO-2: it shards the gradients with the optimizer states; FSDP has no ZeRO-1); the "
                "prediction is of a ZeRO-1 that reduces once a step (a plan under an FSDP stack, --stack torchtitan, "
                "prices what runs)")
    problem = zero_with_pp_problem(plan.zero, plan.pp)  # the words plan and simulate use
    if problem is None:
        return None
    return (f"note: {problem}, as torchtitan runs it; the prediction prices it so, and summary.json records "
            f"zero: {effective_zero(plan.zero, plan.pp)}")


def _refuse_a_changed_recipe(found: tuple[int, Path], cfg: RunConfig, out: Path) -> None:
    """A resumed run trains on with the recipe and seed it started with: an option left at its
    default (or given anew) would silently change the learning rate or the data order mid-run.
    --steps may change (train longer); the rest is refused unless --force-resume."""
    step, path = found
    try:
        meta = checkpoint.read_meta(path)
    except (OSError, ValueError):
        return  # checkpoint.check_resumable has read it; a newer one is not ours to judge here
    theirs = dict(meta.get("recipe") or {})
    ours = cfg.recipe().to_dict()
    changed = [f"{k}={theirs[k]!r} (now {ours[k]!r})" for k in ours
               if k != "total_steps" and k in theirs and theirs[k] != ours[k]]
    earlier = earlier_config(out)
    if earlier is None and meta.get(checkpoint.RUN_DIR):  # resumed into a new -o: the writer's own record
        earlier = earlier_config(Path(meta[checkpoint.RUN_DIR]))
    # the seed the checkpoint records (since it records one), else its run's (a later launch into that
    # folder may have rewritten the run's record with another)
    seed = meta["seed"] if "seed" in meta else earlier.seed if earlier is not None else cfg.seed
    if seed != cfg.seed:
        changed.append(f"seed={seed} (now {cfg.seed})")
    if earlier is None:  # the writer's folder is gone: the data the checkpoint itself records
        was = (meta.get("data") or {}).get("path")
        if was != cfg.data:
            changed.append(f"--data {was or 'not given'} (now {cfg.data or 'not given'})")
    else:  # the data a resume reads on: the same stream at the step's position
        for key, option in (("data", "--data"), ("val_data", "--val-data"), ("data_dtype", "--data-dtype")):
            was, now = getattr(earlier, key), getattr(cfg, key)
            if (was or now) and was != now and not (key == "data_dtype" and not (earlier.data or cfg.data)):
                changed.append(f"{option} {was or 'not given'} (now {now or 'not given'})")
        # the same path holding another file (a review overwrote its 20,000 tokens with 9,000, and a
        # same-size rewrite went unseen); a run started before the size or digest was kept has none
        was_bytes, same_path = earlier.data_bytes, earlier.data and earlier.data == cfg.data
        if same_path and was_bytes is not None and was_bytes != cfg.data_bytes:
            changed.append(f"--data {cfg.data} of {was_bytes:,} bytes (now {cfg.data_bytes:,}: another file)")
        elif same_path and earlier.data_digest and cfg.data_digest and earlier.data_digest != cfg.data_digest:
            changed.append(f"--data {cfg.data} holding other tokens (the same size, another content digest: "
                           "another file)")
    if changed:
        raise PlanMismatchError(
            f"the run in {path} (step {step}) trained with {', '.join(changed)}; pass the same options "
            "(--lr, --lr-schedule, --warmup-steps, --min-lr, --decay-fraction, --weight-decay, --adam-betas, "
            "--grad-clip, --seed, --data, --val-data, --data-dtype) to continue it, or --force-resume to change them")


def _check_init_from(path: str | None, plan: Plan, model_file) -> str | None:
    """--init-from's folder, after its names and shapes were held against the model (headers only)."""
    if not path:
        return None
    from .init_from import check_source, open_source

    source = open_source(path)
    check_source(source, model_file.build(plan.model_args, device="meta"))
    return source.path


def execute(plan: Plan, model_file, opts: ExecuteOptions, progress=None) -> ExecuteResult:
    """Validate, then launch; `progress(line)` hears what happens during the silent start-up.

    A launch holds its -o/--output folder's lock (executor/run_lock.py) from the checks to the
    end of the run (under Slurm, to the script's writing): a second launch into it is refused,
    not run beside it. Not across nodes: their launchers share the folder.
    """
    if opts.out and not (opts.launcher == "local" and opts.nnodes > 1):
        with holding_run_dir(Path(opts.out).resolve()) as locked:
            if not locked and progress:
                progress(f"note: {opts.out}'s file system offers no file locks: nothing stops a second launch "
                         "into it while this one runs")
            return _execute(plan, model_file, opts, progress)
    if opts.out:  # nodes sharing the folder take no lock: a killed launch's file would call this run abandoned
        forget_abandoned_lock(Path(opts.out).resolve())
    return _execute(plan, model_file, opts, progress)


def _execute(plan: Plan, model_file, opts: ExecuteOptions, progress=None) -> ExecuteResult:
    cfg = prepare(plan, model_file, opts)
    with contextlib.ExitStack() as held:
        if cfg.checkpoint_dir and cfg.checkpoint_every > 0 and opts.launcher == "local" and opts.nnodes == 1:
            # the folder it saves into, held as -o is: two runs saving into one (a shared --checkpoint-dir,
            # or another run's RUN_DIR/checkpoints) resumed from each other's steps and replaced them
            # (a review); a run that only resumes from it may go beside its writer
            held.enter_context(holding_run_dir(Path(cfg.checkpoint_dir).resolve(), "--checkpoint-dir",
                                               CHECKPOINT_LOCK_FILE))
        return _execute_prepared(cfg, plan, model_file, opts, progress)


def _execute_prepared(cfg: RunConfig, plan: Plan, model_file, opts: ExecuteOptions, progress=None) -> ExecuteResult:
    nproc = opts.nproc_per_node or -(-plan.world_size // opts.nnodes)
    if progress and _synthetic_data_note(cfg, model_file):
        progress(_synthetic_data_note(cfg, model_file))
    earlier = claim_run_dir(Path(cfg.out_dir), cfg.checkpoint_dir, nproc * opts.nnodes)
    try:
        return _launch(cfg, plan, opts, nproc, progress, earlier.stopped(Path(cfg.out_dir)) if earlier else None)
    except (LaunchError, LaunchInterrupted):
        # The workers ran and failed or were stopped (loading the checkpoint, too): launch_local
        # recorded how in stopped.json, and the earlier run's summary would call the folder finished.
        raise
    except BaseException:  # before any worker started (Ctrl-C too): nothing of the run changed
        if earlier is not None and not earlier.started(Path(cfg.out_dir)):
            earlier.put_back()
        raise


def _launch(cfg: RunConfig, plan: Plan, opts: ExecuteOptions, nproc: int, progress,
            earlier_stop: bytes | None = None) -> ExecuteResult:
    for note in (_stretched_schedule_note(cfg), _data_epochs_note(cfg), _zero_note(plan), _keep_note(cfg),
                 _shared_cores(nproc, opts.launcher)):
        if progress and note:
            progress(note)
    if progress and opts.reference_batch and cfg.lr_scale != 1.0:
        progress(describe_lr_scale(opts.lr, cfg.lr_scale, plan.global_batch, opts.reference_batch, opts.lr_scaling))
    if progress and opts.launcher == "local":
        progress(f"starting {nproc} process{'es' if nproc != 1 else ''} ({plan.world_size} in all) for {opts.steps} step{'s' if opts.steps != 1 else ''}; "
                 f"run directory {cfg.out_dir}; the first step comes after process start-up and model build")
    if opts.launcher == "slurm":
        if opts.time_limit:
            time_limit, why = check_slurm_time(opts.time_limit), "as --time-limit gave it"
        else:
            found = checkpoint.latest(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
            done = found[0] if found else 0  # a resume runs only the steps after its checkpoint
            predicted_s = plan.predicted.step_time_s if plan.predicted else None
            time_limit, why = slurm_time_limit(predicted_s, opts.steps - done, opts.max_restarts)
            why += (f" (the steps after {found[1].name})" if found else "") + "; --time-limit sets it"
        gpus = slurm_gpus_per_node(plan, nproc)
        script = write_sbatch(cfg, opts.nnodes, nproc, gpus_per_node=gpus,
                              max_restarts=opts.max_restarts, time_limit=time_limit)
        return ExecuteResult(run_dir=Path(cfg.out_dir), plan=plan, sbatch=script, time_limit=time_limit,
                             time_limit_reason=why, gpus_per_node=gpus)
    run_dir = launch_local(cfg, nproc, nnodes=opts.nnodes, rdzv_endpoint=opts.rdzv_endpoint,
                           max_restarts=opts.max_restarts, earlier_stop=earlier_stop)
    summary_path = run_dir / SUMMARY_FILE
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return ExecuteResult(run_dir=run_dir, plan=plan, summary=summary)
