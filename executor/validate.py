"""Plan-vs-model checks that run before any process starts; each failure is one line
naming the value, the limit and the nearest fix."""

from __future__ import annotations

import fnmatch
import inspect
import math
import re
from dataclasses import dataclass

import torch
from smplan.planner.feasibility import (
    context_parallel_problem,
    expert_parallel_problem,
    pipeline_fill_problem,
)
from smplan.planner.model_file import ModelFileError, first_line
from smplan.planner.plan import Plan, no_blocks_reason
from torch import nn
from torch.utils._pytree import tree_map

from smplan.model import (
    CP_HOOK,
    DEFAULT_LOSS,
    call_model,
    context_parallel_support_problem,
    default_loss,
    expert_bank_problem,
    expert_banks,
    first_tensor,
    hf_config_fix,
    inputs_kind,
    is_one_tensor,
    loss_value_problem,
    pipeline_problem,
    tensor_parallel_problem,
    tokens_per_sample,
)
from smplan.model.structure import Layout, find_layout, owned_blocks, unlike_blocks

from . import check_cache
from .float8 import Float8Unavailable, fp8_plan_problem, torchao_float8
from .parallelize import call_tp_plan


class PlanMismatchError(ValueError):
    """The plan does not fit the model file or the processes asked for."""


@dataclass(frozen=True)
class Checked:
    layout: Layout
    tokens_per_sample: int
    param_bytes: int = 0  # the model's parameters, in bytes of the dtype they are built in (an hf: config's bf16 too)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _config_value(model: nn.Module, name: str):
    cfg = getattr(model, "config", None)
    if isinstance(cfg, dict):
        return cfg.get(name)
    return getattr(cfg, name, None)


# Exceptions of a forward on meta that real data meets too (a tuple fed to a block, a signature
# batch() does not fit, a missing attribute): refused before launch. Others (RuntimeError from
# .item() or a data-dependent shape, NotImplementedError from a custom kernel with no meta
# implementation, an assert on the device) may be the meta device's alone: the run decides.
CODE_ERRORS = ("TypeError", "AttributeError", "NameError", "KeyError", "IndexError", "ValueError")


def meta_profile(plan: Plan, model_file):
    """The planner's profile of the model (cached; `smplan profile`'s), or None where it has no
    example batch (data() only) or its forward fails on the meta device for a reason that may be
    the meta device's; a failure real data meets too raises ModelFileError, profile's one line.
    Built with the builder's own sequence length: a plan file's may be another model's (--model)."""
    if model_file.hook("batch") is None:
        return None
    from smplan.planner import profile_model

    try:
        return profile_model(model_file.absolute_ref, plan.model_args, dtype=plan.dtype)
    except ModelFileError as err:
        raised = re.search(r" raised (\w+): ", str(err))
        if raised and raised.group(1) in CODE_ERRORS:
            raise
        return None


def validate_plan(plan: Plan, model_file, world_size: int | None = None) -> Checked:
    """Raise PlanMismatchError unless `plan` can run `model_file` on `world_size` processes."""
    from smplan.planner.hf_model import meta_forward

    with meta_forward(model_file):  # transformers' forwards on meta, as the profiler runs them
        return _validate_plan(plan, model_file, world_size)


def _validate_plan(plan: Plan, model_file, world_size: int | None) -> Checked:
    ref = ("hf:" if getattr(model_file, "is_hf_config", False) else "") + model_file.path.name
    _check_executable(plan)
    meta = model_file.build(plan.model_args, device="meta")
    layout = find_layout(meta)
    n = layout.num_blocks
    if n == 0:  # no layout at all runs it (even_stages refuses pp=1 too): the line plan refuses it with
        raise PlanMismatchError(no_blocks_reason(ref))
    chunks = plan.num_model_chunks
    if plan.stages:
        end = plan.stages[-1].last_block
        if end != n:
            raise PlanMismatchError(
                f"the plan's stages cover blocks [0, {end}) but {ref} has {n} blocks; "
                "regenerate the plan for this model (smplan plan) or fix the stage ranges"
            )
    elif chunks > n:
        unlike = unlike_blocks(meta, layout)  # a pyramid of one class: say why its run of blocks is short
        raise PlanMismatchError(
            f"pp*v={chunks} pipeline stages need at least {chunks} blocks but {ref} has {n}"
            f"{f': {unlike}' if unlike else ''}; use pp*v <= {n}"
        )
    if world_size is not None and world_size != plan.world_size:
        degrees = (f"dp*tp*pp={plan.dp}*{plan.tp}*{plan.pp}" if plan.cp == 1
                   else f"dp*tp*pp*cp={plan.dp}*{plan.tp}*{plan.pp}*{plan.cp}")
        raise PlanMismatchError(
            f"the plan needs {degrees}={plan.world_size} processes but "
            f"{world_size} were asked for; give --nproc-per-node and --nnodes whose product is {plan.world_size}"
        )
    fill = pipeline_fill_problem(plan.pp, plan.schedule, plan.num_microbatches, plan.dp, plan.micro_batch)
    if fill:  # the planner's rule too (smplan.planner.feasibility), so it never offers such a plan
        raise PlanMismatchError(fill)
    if plan.tp > 1:
        _check_tp(plan, model_file, meta, layout, ref)
    batch = model_file.hook("batch")
    if batch is None and model_file.hook("data") is None:
        raise PlanMismatchError(f"{ref} defines neither batch(micro_batch_size, model, seed) nor data(rank, world); add one")
    tokens = 1
    if batch is not None:
        inputs, targets = batch(plan.micro_batch, model=meta, seed=0)
        tokens = tokens_per_sample(inputs)
        if not is_one_tensor(inputs) and plan.cp > 1:  # pp: pipeline_problem says so, as the planner does
            raise PlanMismatchError(f"{ref}'s batch() gives its inputs as {inputs_kind(inputs)}; context "
                                    "parallelism splits one token tensor; use cp=1, or have batch() return the "
                                    "token tensor alone")
        first = first_tensor(inputs)  # the token ids' length; else (features) the first tensor's dim 1
        seq = tokens if tokens > 1 else (first.shape[1] if first is not None and first.dim() > 1 else 1)
        if plan.sequence_parallel and plan.tp > 1 and (seq == 1 or seq % plan.tp):
            raise PlanMismatchError(
                f"sequence parallelism splits the sequence ({seq}) "
                f"over tp={plan.tp}, which does not divide it; use sp=0 or a tp in {{{_divisors(seq)}}}"
            )
        local = seq // plan.cp if seq > 1 and seq % (2 * plan.cp) == 0 else 0
        if plan.sequence_parallel and plan.tp > 1 and plan.cp > 1 and local % plan.tp:
            raise PlanMismatchError(  # under cp, SP splits each cp rank's share of the sequence
                f"sequence parallelism splits each cp rank's {local} tokens (seq_len / cp) over tp={plan.tp}, "
                f"which does not divide them; use sp=0 or a tp in {{{_divisors(local)}}}"
            )
    seen = ("pipeline", model_file, plan.model_args, plan.micro_batch)  # pipeline_problem: any pp
    if plan.pp > 1 and batch is not None and not check_cache.passed_before(*seen):  # the planner's rule too
        problem = pipeline_problem(meta, layout, _to_meta(inputs), call_model,
                                   **_library_fix(model_file, "pp"))
        if problem:
            raise PlanMismatchError(f"pp={plan.pp}: {problem}; use pp=1")
        check_cache.record_pass(*seen)
    if plan.ep > 1:
        _check_ep(plan, meta, _to_meta(inputs) if batch is not None else None, _library_fix(model_file, "ep"),
                  ("experts", model_file, plan.model_args, plan.micro_batch))
    if plan.seq_len and tokens == 1 and not model_file.accepts("seq_len"):  # planner profiler_run's rule too
        raise PlanMismatchError(f"the plan says seq_len={plan.seq_len} but {ref} takes no seq_len argument and its "
                                "batches have no token sequences: the plan was made for another model; plan this "
                                "one (smplan plan), or run it inline")
    if plan.seq_len and plan.seq_len != tokens and tokens != 1:
        raise PlanMismatchError(f"the plan says seq_len={plan.seq_len} but {ref}'s batches have {tokens}; plan again "
                                f"with --seq-len {tokens}, or build the model with {plan.seq_len} tokens "
                                f"(--arg seq_len={plan.seq_len}, where its builder takes it)")
    if plan.cp > 1:
        _check_cp(plan, model_file, ref, plan.seq_len or (tokens if batch is not None and tokens > 1 else 0))
    if batch is not None and not model_file.is_hf_config:
        own = model_file.defines("loss")
        seen = ("own loss" if own else "default loss", model_file, plan.model_args, plan.micro_batch)
        if not check_cache.passed_before(*seen):  # a forward on meta: seconds in a fresh process
            if own:
                _check_own_loss(meta, _to_meta(inputs), _to_meta(targets), ref, model_file.hook("loss"))
            else:
                _check_default_loss(meta, _to_meta(inputs), _to_meta(targets), ref,
                                    model_file.hook("loss") or default_loss)
            check_cache.record_pass(*seen)
    return Checked(layout=layout, tokens_per_sample=tokens,
                   param_bytes=sum(p.numel() * p.element_size() for p in meta.parameters()))


def _to_meta(tree):
    return tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, tree)


def _check_default_loss(meta: nn.Module, inputs, targets, ref: str, loss_fn) -> None:
    """A file without loss() trains with the default cross-entropy (a transformers model: its
    causal-LM loss, hf_model.loss): refused here, in one line, when what the model returns is
    not scores it can take, rather than in every worker. A forward that cannot run on the
    meta device (data-dependent code) is not judged."""
    try:
        with torch.no_grad():
            outputs = call_model(meta, inputs)
    except Exception:  # noqa: BLE001 - the meta device, not the loss: the run decides
        return
    try:
        with torch.no_grad():
            loss_fn(outputs, targets)
    except Exception as err:  # noqa: BLE001 - any failure of the default loss is the file's to fix
        line = first_line(err)[:120]
        what = DEFAULT_LOSS if loss_fn is default_loss else "a causal LM's cross-entropy of the logits"
        raise PlanMismatchError(
            f"{ref} defines no loss(outputs, targets) and the default loss ({what}) cannot take what its "
            f"forward returns ({type(outputs).__name__}: {type(err).__name__}: {line}); define loss(outputs, "
            f"targets) in {ref}") from None


def _check_own_loss(meta: nn.Module, inputs, targets, ref: str, loss_fn) -> None:
    """The file's loss(outputs, targets) must return one number for backward: refused here, in
    one line, rather than by every worker's backward. What cannot run on meta is not judged."""
    try:
        with torch.no_grad():
            value = loss_fn(call_model(meta, inputs), targets)
    except Exception:  # noqa: BLE001 - the meta device, not the loss: the run decides
        return
    problem = loss_value_problem(value)
    if problem:
        raise PlanMismatchError(f"{ref}: {problem}")


def _check_executable(plan: Plan) -> None:
    """What the planner and simulator price but the executor does not run yet:
    refused in one line rather than run as something else."""
    if plan.grad_compress.startswith("powersgd") and plan.dp > 1 and (plan.tp > 1 or plan.pp > 1 or plan.zero):
        raise PlanMismatchError(f"grad_compress={plan.grad_compress} runs as torch's DDP hook, which this executor uses "
                                "only for zero=0 without tp or pp (FSDP2 replicate/shard has no PowerSGD); "
                                "use tp=1,pp=1,zero=0 or grad_compress=bf16")
    if plan.dtype == "fp8":
        problem = fp8_plan_problem(plan.fp8_scaling)
        if problem:
            raise PlanMismatchError(problem)
        try:
            torchao_float8()
        except Float8Unavailable as err:
            raise PlanMismatchError(str(err)) from None


def _check_cp(plan: Plan, model_file, ref: str, seq_len: int) -> None:
    """Context parallelism needs the model file's hook and sequences that split into 2*cp chunks
    (the planner's rules: smplan.model.capabilities, smplan.planner.feasibility)."""
    problem = context_parallel_support_problem(model_file.hook(CP_HOOK), ref, **_library_fix(model_file, "cp"))
    if problem:
        raise PlanMismatchError(f"cp={plan.cp}: {problem}; use cp=1")
    if not seq_len:
        raise PlanMismatchError(f"cp={plan.cp} splits each sequence, but {ref}'s batches are not token sequences "
                                "[batch, seq] and the plan gives no seq_len; use cp=1 or set seq_len")
    problem = context_parallel_problem(plan.cp, seq_len)
    if problem:
        raise PlanMismatchError(problem)


def _library_fix(model_file, dim: str) -> dict:
    """The fix a reason ends with when the model is an hf: config (transformers' code, not the
    user's): the capability rules' own `fix` otherwise (smplan.model.capabilities)."""
    return {"fix": hf_config_fix(dim)} if model_file.is_hf_config else {}


def _check_ep(plan: Plan, meta: nn.Module, inputs, fix: dict, seen: tuple) -> None:
    """Expert parallelism as executor/expert_parallel.py runs it: the experts split over ep of
    a stage's dp x cp x tp ranks (the plan already checks that ep divides them), every bank's
    experts divisible by ep, and banks that can be split (the planner's rule too:
    smplan.model.capabilities). Not with sequence parallelism yet (untested: no model here has both)."""
    ep = plan.ep
    if plan.sequence_parallel and plan.tp > 1:
        raise PlanMismatchError(f"ep={ep} with sequence parallelism is not run by this executor yet; use sp=0")
    banks = expert_banks(meta)
    for experts in sorted({bank.num_experts for _, bank in banks}) or [0]:
        problem = expert_parallel_problem(ep, experts)
        if problem:
            raise PlanMismatchError(problem)
    if inputs is None or check_cache.passed_before(*seen):  # `seen`: the check's key, as for the loss's
        return
    problem = expert_bank_problem(meta, inputs, call_model, **fix)  # a forward on meta, whatever the ep
    if problem:
        raise PlanMismatchError(f"ep={ep}: {problem}")
    check_cache.record_pass(*seen)


def _check_tp(plan: Plan, model_file, meta: nn.Module, layout: Layout, ref: str) -> None:
    tp = plan.tp
    if not model_file.has_tp_plan:
        what = ("'s config (and transformers' class for it) has no base_model_tp_plan"
                if getattr(model_file, "is_hf_config", False) else " defines no tp_plan(block)")
        raise PlanMismatchError(f"tp={tp} needs tensor parallelism but {ref}{what}; use tp=1")
    # examples/gpt.py's names, then transformers' (num_attention_heads, num_key_value_heads)
    counts = {}
    for name, alias in (("heads", "num_attention_heads"), ("kv_heads", "num_key_value_heads")):
        value = _config_value(meta, name)
        value = _config_value(meta, alias) if value is None else value
        if isinstance(value, int) and value > 0:
            counts[name] = value
    # the planner's view of the same file: without a config (a model of one's own), the heads its
    # blocks' attention calls run; below, what its profile rules tp out for
    profile = meta_profile(plan, model_file)
    if not counts and profile is not None and profile.num_heads:
        counts = {"kv_heads": profile.num_heads}
    for name, value in counts.items():
        if value % tp:  # the degrees offered divide every head count, not only this one
            raise PlanMismatchError(
                f"tp={tp} does not divide the model's {value} {name.replace('_', ' ')}; "
                f"use tp in {{{_divisors(math.gcd(*counts.values()))}}}"
            )
    tp_plan = model_file.hook("tp_plan")
    owned = owned_blocks(meta, layout)
    if not owned:
        raise PlanMismatchError(f"tp={tp}: {ref} has no repeated blocks for its tp_plan(block); use tp=1")
    block = owned[0][1]
    takes_sp = "sequence_parallel" in inspect.signature(tp_plan).parameters
    if plan.sequence_parallel and not takes_sp:
        raise PlanMismatchError(f"{ref}'s tp_plan(block) takes no sequence_parallel argument; use sp=0")
    try:
        styles = tp_plan(block, sequence_parallel=plan.sequence_parallel) if takes_sp else tp_plan(block)
    except ModelFileError as err:  # a transformers config's plan torch's styles cannot express (hf_model)
        raise PlanMismatchError(f"tp={tp}: {err}; use tp=1") from None
    _check_module_types(styles, block, tp, "tp_plan")
    _check_divides(styles, block, tp, f"{ref}'s blocks")
    if profile is not None and "tp" in profile.unsupported:  # e.g. a sharded module the forward never calls
        raise PlanMismatchError(f"tp={tp}: {profile.unsupported['tp']}; use tp=1")
    outer = model_file.hook("tp_plan_outer")
    if outer is None:
        if plan.sequence_parallel:
            raise PlanMismatchError(f"sequence parallelism needs {ref} to define tp_plan_outer(model, sequence_parallel) "
                                    "(the sequence split around the blocks); use sp=0")
        return
    if plan.sequence_parallel and "sequence_parallel" not in inspect.signature(outer).parameters:
        raise PlanMismatchError(f"{ref}'s tp_plan_outer(model) takes no sequence_parallel argument; use sp=0")
    outer_styles = call_tp_plan(outer, meta, plan.sequence_parallel, "tp_plan_outer")
    names = [n for n, _ in meta.named_modules() if n]
    for key in outer_styles:
        if not any(fnmatch.fnmatchcase(n, key) for n in names):
            raise PlanMismatchError(f"{ref}'s tp_plan_outer() names {key!r}, which is no module of the model; "
                                    "use a module path from the root such as 'head.out'")
    _check_module_types(outer_styles, meta, tp, "tp_plan_outer")
    _check_divides(outer_styles, meta, tp, ref)


def _check_module_types(styles: dict, root: nn.Module, tp: int, hook: str) -> None:
    """The planner's rule (smplan.model.capabilities): torch's styles shard Linear/Embedding only."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styled = {fqn: m for fqn, m in root.named_modules() if fqn and any(
        fnmatch.fnmatchcase(fqn, key) and isinstance(st, ColwiseParallel | RowwiseParallel) for key, st in styles.items())}
    problem = tensor_parallel_problem(styled, hook)
    if problem:
        raise PlanMismatchError(f"tp={tp}: {problem}; use tp=1")


def _check_divides(styles: dict, root: nn.Module, tp: int, where: str) -> None:
    """Every column-/row-parallel linear or embedding of `styles` splits evenly over tp."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    for fqn, module in root.named_modules():
        style = next((st for key, st in styles.items() if fnmatch.fnmatchcase(fqn, key)), None) if fqn else None
        if isinstance(module, nn.Linear):
            dim = module.out_features if isinstance(style, ColwiseParallel) else (
                module.in_features if isinstance(style, RowwiseParallel) else None)
        elif isinstance(module, nn.Embedding):  # rowwise: the vocabulary; colwise: the width
            dim = module.num_embeddings if isinstance(style, RowwiseParallel) else (
                module.embedding_dim if isinstance(style, ColwiseParallel) else None)
        else:
            dim = None
        if dim is not None and dim % tp:
            raise PlanMismatchError(
                f"tp={tp} does not divide {fqn} ({dim} features) of {where}; use tp in {{{_divisors(dim)}}}"
            )
