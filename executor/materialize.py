"""Meta-device build and per-module seeded materialisation of this rank's shards.

`build_meta` builds the model with its parameters on the meta device and its buffers
real (computed on CPU by the modules' own `__init__`, as accelerate's
`init_empty_weights(include_buffers=False)` does), so no rank ever holds the full model.

`materialize` then allocates a parallelised chunk and fills it one module at a time: a
full-size CPU copy of just that module is initialised by its own `reset_parameters()`
(or the model file's `init_weights(module)` hook) under a generator seeded by
sha256(f"{seed}:{fqn}"), and each rank keeps only its shard of it. The initial weights
thus depend on the seed and the module's name only: every layout (dp, FSDP, tp, pp) and
a single process start from the same values, and the peak host memory is this rank's
shards plus the largest single module.

Parameters shared by several modules (tied embedding and head) are re-tied after
allocation; a module that defines neither `reset_parameters` nor is covered by an
`init_weights` hook keeps the values its constructor gave (built full-size on CPU).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib

import torch
from torch import nn

from smplan.model import tied_groups

INIT_HOOK = "init_weights"  # optional model-file function init_weights(module) -> None
# Wrappers that put a segment into module and parameter names without changing what they
# address: apply_recompute's checkpoint_wrapper (torch.distributed.algorithms._checkpoint.
# checkpoint_wrapper._CHECKPOINT_PREFIX; state dicts drop it), FSDP1's and torch.compile's.
WRAPPER_ATTRIBUTES = frozenset({"_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod"})


class MaterializeError(ValueError):
    """The model cannot be materialised shard by shard; the message says what to change."""


def module_seed(seed: int, fqn: str) -> int:
    """The generator seed of module `fqn` (a non-negative signed 64-bit integer)."""
    digest = hashlib.sha256(f"{seed}:{fqn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)  # torch.manual_seed's range


def canonical_name(fqn: str) -> str:
    """`fqn` without the wrappers' segments (the name in a plain model), wherever they are:
    a last one names the wrapped module itself, which holds parameters of its own when a
    block registers one directly (a layer-scale gamma, a position table)."""
    return ".".join(part for part in fqn.split(".") if part not in WRAPPER_ATTRIBUTES)


def _has_init(module: nn.Module, hook) -> bool:
    return hook is not None or callable(getattr(module, "reset_parameters", None))


@contextlib.contextmanager
def params_on_meta(hook=None):
    """While active, a parameter registered on a module that can re-initialise it
    (`reset_parameters` or the hook) is moved to the meta device; buffers and the
    parameters of other modules stay where their constructor put them."""
    original = nn.Module.register_parameter

    def register(module, name, param):
        original(module, name, param)
        param = module._parameters.get(name)
        if type(param) is nn.Parameter and not param.is_meta and _has_init(module, hook):
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def build_meta(model_file, model_args: dict, seed: int) -> nn.Module:
    """The full model: parameters on meta, buffers real on CPU. The global generator is
    seeded first, as a single-process run does, so constructor-initialised values (and
    whatever draws from the global generator later) are the same on every rank."""
    hook = model_file.hook(INIT_HOOK)
    torch.manual_seed(seed)
    with params_on_meta(hook):
        return model_file.build(model_args, device=None)


def _owner(root: nn.Module, fqn: str) -> tuple[nn.Module, str]:
    module_name, _, name = fqn.rpartition(".")
    return (root.get_submodule(module_name) if module_name else root), name


def retie(model: nn.Module, groups: list[list[str]]) -> None:
    """Make every name of each group refer to its primary's parameter again (to_empty
    gives each module its own copy). FSDP2 keeps the first module it met as the owner,
    which is the primary (both follow `named_modules` order)."""
    for names in groups:
        primary_module, primary_name = _owner(model, names[0])
        param = primary_module._parameters[primary_name]
        for fqn in names[1:]:
            module, name = _owner(model, fqn)
            module._parameters[name] = param


def _full_copy(reference: nn.Module) -> nn.Module:
    """A shallow copy of `reference` with its own full-size CPU parameters and buffers
    (children are shared and stay as they are: only the module's own tensors count)."""
    module = copy.copy(reference)
    params = {}
    for name, p in reference._parameters.items():
        if p is None:
            params[name] = None
            continue
        value = torch.empty_like(p, device="cpu") if p.is_meta else p.detach().clone()
        if p.is_meta and value.is_floating_point():
            value.fill_(float("nan"))  # so a parameter the init leaves unset is caught
        params[name] = nn.Parameter(value, requires_grad=p.requires_grad)
    module._parameters = params
    module._buffers = {n: None if b is None else b.detach().clone() for n, b in reference._buffers.items()}
    return module


def initial_module(reference: nn.Module, fqn: str, seed: int, hook=None) -> nn.Module:
    """Module `fqn`'s own tensors at initialisation: a full-size CPU copy, re-initialised
    under the generator seeded by module_seed(seed, fqn)."""
    module = _full_copy(reference)
    if not any(p is not None and p.is_meta for p in reference._parameters.values()):
        return module  # buffers only, or constructor values (no reset_parameters, no hook)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.default_generator.manual_seed(module_seed(seed, fqn))
        if hook is not None:
            hook(module)
        else:
            module.reset_parameters()
    for name, p in module._parameters.items():
        # max propagates NaN and, unlike isnan(p).any(), allocates no tensor of p's size
        if p is not None and p.is_floating_point() and p.numel() and p.max().isnan():
            raise MaterializeError(
                f"{type(reference).__name__} {fqn or '(root)'}: initialisation left parameter {name!r} unset; "
                f"set it in {type(reference).__name__}.reset_parameters() or in the model file's "
                f"{INIT_HOOK}(module)")
    return module


def _local_view(full: torch.Tensor, mesh, placements) -> torch.Tensor | None:
    """This rank's part of `full` as a view (DTensor's torch.chunk split per Shard mesh
    dimension), or None for placements it does not cover (strided or partial)."""
    from torch.distributed.tensor import Replicate, Shard

    coord = mesh.get_coordinate()
    view = full
    for i, placement in enumerate(placements):
        if isinstance(placement, Replicate):
            continue
        if type(placement) is not Shard:
            return None
        pieces = torch.chunk(view, mesh.size(i), dim=placement.dim)
        view = pieces[coord[i]] if coord[i] < len(pieces) else view.narrow(placement.dim, 0, 0)
    return view


def _fill(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's part of `full` into `target` (a DTensor shard or a plain tensor)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    full = full.to(device=target.device, dtype=target.dtype)
    if not isinstance(target, DTensor):
        target.copy_(full)
        return
    local = target.to_local()
    view = _local_view(full, target.device_mesh, target.placements)
    if view is None or view.shape != local.shape:
        # src_data_rank=None: every rank slices its own copy (no communication).
        view = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None).to_local()
    local.copy_(view)


def materialize(chunk: nn.Module, reference: nn.Module, device, seed: int, init_hook=None) -> None:
    """Allocate the meta-built, parallelised `chunk` on `device` and fill this rank's
    shards module by module from `reference` (the `build_meta` model it was cut from)."""
    ref_groups = tied_groups(reference)
    chunk_groups = tied_groups(chunk)
    chunk_names = {canonical_name(n) for n, _ in chunk.named_parameters(remove_duplicate=False)}
    primary_of = {}
    for names in ref_groups:
        present = [n for n in names if n in chunk_names]
        if present and len(present) < len(names):
            raise MaterializeError(
                f"tied parameters {', '.join(names)} land on different pipeline stages (this one has "
                f"{', '.join(present)}); untie them in the model or use pp=1")
        primary_of.update({n: names[0] for n in names[1:]})
    chunk.to_empty(device=device)
    retie(chunk, chunk_groups)
    with torch.no_grad():
        for fqn, module in chunk.named_modules():
            params = {n: p for n, p in module._parameters.items() if p is not None}
            buffers = {n: b for n, b in module._buffers.items() if b is not None}
            if not params and not buffers:
                continue
            name = canonical_name(fqn)
            ref = reference.get_submodule(name)
            full = initial_module(ref, name, seed, init_hook)
            for pname, param in params.items():
                if f"{name}.{pname}".lstrip(".") not in primary_of:  # a tie's other names get the primary's
                    _fill(param, full._parameters[pname])
            for bname, buf in buffers.items():
                _fill(buf, full._buffers[bname])
            del full
