"""What the profiler reads of a model file's TP plans: which modules tp_plan / tp_plan_outer
shard and how, the Megatron f/g collectives their hooks record, and why tp or sp cannot run."""

from __future__ import annotations

import fnmatch
import inspect

import torch
from torch import nn

from smplan.model.structure import qualname
from smplan.model.tp_forward import keeps_whole_width

from .hf_model import TPUnsupported
from .model_file import ModelFile, ModelFileError
from .model_profile import TPCollective
from .profiler_trace import Tracer, tensor_bytes
from .profiler_user import user_call


def tp_hooks(name: str, module: nn.Module, style: str, tracer: Tracer) -> list:
    """Megatron f/g: all-reduce a row-parallel output (forward), a column-parallel input grad (backward)."""

    def pre(mod, args, kwargs):
        tracer.tp_stack.append(style)
        tracer.tp_called.add(name)
        if style == "col":
            tracer.column_input((args, kwargs))

    def post(mod, args, kwargs, output):
        tracer.tp_stack.pop()
        part = tracer.part
        if style == "col":
            tracer.tag(output)
            if part is not None:
                part.collectives.append(TPCollective("all_reduce", "backward", tensor_bytes(args[:1]), name))
        else:
            tracer.tag(output, sharded=False)
            if part is not None:
                part.collectives.append(TPCollective("all_reduce", "forward", tensor_bytes(output), name))

    return [module.register_forward_pre_hook(pre, with_kwargs=True), module.register_forward_hook(post, with_kwargs=True)]


def uncalled_tp_module(tp_modules: dict, outer_modules: dict, called: set[str]) -> str | None:
    """Why tp cannot run when the TP plans shard a module the forward never calls as a module: its
    weight, sharded, would meet whole tensors in the code that uses it (nn.MultiheadAttention
    reads out_proj.weight directly; the executor failed in every rank with 'mixed torch.Tensor
    and DTensor')."""
    for hook, modules in (("tp_plan", tp_modules), ("tp_plan_outer", outer_modules)):
        for name in modules:
            if name not in called:
                return (f"{hook}() shards {name}, which the forward never calls as a module (code that reads "
                        f"its weight directly, as nn.MultiheadAttention does with out_proj, would mix sharded and "
                        f"whole tensors); shard only modules the forward calls, and leave unused ones out")
    return None


def tp_modules_of(mf: ModelFile, block: nn.Module, whole: set | None = None) -> dict[str, tuple[nn.Module, str]]:
    """{name in block: (module, "col" | "row")} from the file's tp_plan(block); `whole` gets the
    names whose style hands the block whole-width tensors (tp_forward.keeps_whole_width)."""
    fn = mf.hook("tp_plan")
    if fn is None:
        return {}
    try:
        import torch.distributed.tensor.parallel  # noqa: F401
    except ImportError:  # a torch built without distributed: profile without TP
        return {}
    plan = user_call(mf, "tp_plan", fn, block)
    if not isinstance(plan, dict):
        raise ModelFileError(f"{mf.path}: tp_plan() returned {type(plan).__name__}; return a dict "
                             "{submodule name: ColwiseParallel() | RowwiseParallel() | ...}")
    named = {n: m for n, m in block.named_modules() if n}
    return _styled(mf, "tp_plan", plan, named, "submodule of the block", whole)


def _styled(mf: ModelFile, hook: str, plan: dict, named: dict, what: str,
            whole: set | None = None) -> dict[str, tuple[nn.Module, str]]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    out = {}
    for pattern, style in plan.items():
        kind = "col" if isinstance(style, ColwiseParallel) else "row" if isinstance(style, RowwiseParallel) else None
        matches = [n for n in named if fnmatch.fnmatchcase(n, pattern)]
        if not matches:
            raise ModelFileError(f"{mf.path}: {hook}() names {pattern!r}, which is no {what}; "
                                 f"use one of {', '.join(named)}")
        if kind is not None:
            out.update({n: (named[n], kind) for n in matches})
            if whole is not None and keeps_whole_width(style):
                whole.update(matches)
    return out


def sharded_params(modules: dict[str, tuple[nn.Module, str]]) -> set[int]:
    """ids of the parameters TP splits: the weight of every column- or row-parallel module,
    the bias of column-parallel ones (a row-parallel bias is added after the all-reduce)."""
    out: set[int] = set()
    for module, kind in modules.values():
        for name in ("weight", "bias") if kind == "col" else ("weight",):
            p = getattr(module, name, None)
            if isinstance(p, torch.Tensor):
                out.add(id(p))
    return out


def hook_takes_sp(mf: ModelFile, hook: str) -> bool:
    fn = mf.hook(hook)
    try:
        return fn is not None and "sequence_parallel" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def sequence_parallel_problem(mf: ModelFile, model: nn.Module, block: nn.Module) -> str | None:
    """Why the file's TP hooks do not map sequence parallelism for this model, or None: they may
    refuse a layer they cannot split by sequence (TPUnsupported; hf_model: Gemma2's sandwich
    norms) or fail under sequence_parallel=True (a user's hook: ModelFileError), and then the
    planner must not offer sp, which `execute` would fail on; the rest of the profile stands."""
    try:
        user_call(mf, "tp_plan", mf.hook("tp_plan"), block, sequence_parallel=True)
        user_call(mf, "tp_plan_outer", mf.hook("tp_plan_outer"), model, sequence_parallel=True)
    except (TPUnsupported, ModelFileError) as err:
        return str(err)
    return None


def tp_outer_modules_of(mf: ModelFile, model: nn.Module, container, run) -> dict[str, tuple[nn.Module, str]]:
    """{path from the root: (module, "col" | "row")} of the parts around the blocks, from the
    file's tp_plan_outer(model) (the same plan the executor applies; absent: replicated)."""
    fn = mf.hook("tp_plan_outer")
    if fn is None:
        return {}
    plan = user_call(mf, "tp_plan_outer", fn, model)
    if not isinstance(plan, dict):
        raise ModelFileError(f"{mf.path}: tp_plan_outer() returned {type(plan).__name__}; return a dict "
                             "{module path from the root: ColwiseParallel() | RowwiseParallel() | ...}")
    prefix = qualname(model, container)
    in_blocks = tuple(f"{prefix}.{n}" if prefix else n for n in run)
    named = {n: m for n, m in model.named_modules()
             if n and not any(n == b or n.startswith(b + ".") for b in in_blocks)}
    return _styled(mf, "tp_plan_outer", plan, named, "module of the model outside the blocks")
