"""Where a model's repeated blocks are, and the non-repeated parts around them.

The blocks are the run of structurally identical children of one nn.ModuleList /
nn.Sequential that holds the most parameters (ties: the longer run), so a MoE whose first
layers are dense, or a ViT whose encoder layers are named "encoder_layer_N", is read the
same way by the profiler (`find_blocks`, `siblings`) and the executor (`Layout`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import nn


def _signature(module: nn.Module) -> tuple:
    return (
        tuple((n, type(m).__module__, type(m).__qualname__) for n, m in module.named_modules()),
        tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()),
        tuple((n, tuple(b.shape), b.dtype) for n, b in module.named_buffers()),
    )


def find_blocks(model: nn.Module) -> tuple[nn.Module | None, list[str]]:
    """(container, child names) of the run of identical modules holding the most parameters."""
    best, best_score = (None, []), (0, 0)
    for _, container in model.named_modules():
        if not isinstance(container, nn.ModuleList | nn.Sequential):
            continue
        run, last = [], None
        for name, child in list(container.named_children()) + [(None, None)]:
            # a block is called; a plain ModuleList / ModuleDict has no forward (its caller iterates
            # it), so a list of lists holds its blocks one level down; a subclass with one is a block
            callable_block = child is not None and not (isinstance(child, nn.ModuleList | nn.ModuleDict)
                                                        and type(child).forward is nn.Module.forward)
            sig = _signature(child) if callable_block else None
            if sig is not None and sig == last:
                run.append(name)
                continue
            if run:
                per_block = sum(p.numel() for p in container.get_submodule(run[0]).parameters())
                score = (per_block * len(run), len(run))
                if score > best_score:
                    best, best_score = (container, list(run)), score
            run, last = ([name], sig) if callable_block else ([], None)
    return best


def qualname(model: nn.Module, target: nn.Module | None) -> str:
    for name, m in model.named_modules():
        if m is target:
            return name
    return ""


def siblings(model: nn.Module, container: nn.Module | None, run: list[str]) -> dict[str, nn.Module]:
    """The modules next to the path root -> container, and the container's other children."""
    if container is None:
        return dict(model.named_children())
    path = qualname(model, container)
    out: dict[str, nn.Module] = {}
    prefix, module = "", model
    for step in (path.split(".") if path else []) + [None]:
        for name, child in module.named_children():
            if step is None and name in run or name == step:
                continue
            out[f"{prefix}{name}"] = child
        if step is None:
            break
        prefix, module = f"{prefix}{step}.", getattr(module, step)
    return out


def _parts_of(module: nn.Module) -> tuple[dict, dict, dict]:
    """A block's parameters, submodules and buffers by name, as `_signature` compares them."""
    return ({n: (tuple(p.shape), p.dtype) for n, p in module.named_parameters()},
            {n: type(m).__qualname__ for n, m in module.named_modules() if n},
            {n: (tuple(b.shape), b.dtype) for n, b in module.named_buffers()})


def _shown(value) -> str:
    return str(value) if isinstance(value, str) else str(value[0])


def _difference(a: str, block_a: nn.Module, b: str, block_b: nn.Module) -> str:
    """The first way `block_b` (named `b`) is not alike `block_a`: a parameter's shape first (the
    usual cause: a pyramid of widths), then a submodule's class (a shortcut that is a Conv2d in one
    block, an Identity in the next), then a parameter, submodule or buffer only one has, or a dtype."""
    (pa, ma, ba), (pb, mb, bb) = _parts_of(block_a), _parts_of(block_b)
    for name, (shape, _) in pa.items():
        if name in pb and pb[name][0] != shape:
            return f"{b}.{name} is {pb[name][0]}, {a}.{name} {shape}"
    for mine, theirs in ((ma, mb), (pa, pb), (ba, bb)):
        for name in [*mine, *(n for n in theirs if n not in mine)]:
            va, vb = mine.get(name), theirs.get(name)
            if va == vb:
                continue
            if va is None or vb is None:
                has, lacks = (b, a) if va is None else (a, b)
                return f"{has}.{name} is {_shown(vb if va is None else va)}, {lacks} has none"
            if isinstance(va, str):
                return f"{b}.{name} is {vb}, {a}.{name} {va}"
            return f"{b}.{name} is {vb[0]} {vb[1]}, {a}.{name} {va[0]} {va[1]}"  # a buffer's shape, or a dtype
    return "alike"  # not reached: the signatures differ


def unlike_blocks(model: nn.Module, layout: Layout) -> str | None:
    """Why the container of the blocks holds more modules of the blocks' class than the run:
    a run is structurally identical modules (`_signature`: one class, the same submodules and
    parameter shapes), so same-class blocks of other widths (a pyramid) are runs of their own
    and only the one with the most parameters counts. None when every such module is in the run."""
    if layout.container is None:
        return None
    container = model.get_submodule(layout.container)  # "" is the model itself
    kind = type(container.get_submodule(layout.block_names[0]))
    if sum(type(m) is kind for m in container.children()) <= layout.num_blocks:
        return None
    prefix = f"{layout.container}." if layout.container else ""
    runs, first_gap, previous = [], None, None  # runs of alike neighbours, as find_blocks reads them
    for name, module in container.named_children():
        if type(module) is not kind:  # another class between two blocks ends a run (find_blocks' rule)
            previous = None
            continue
        if previous is not None and _signature(previous[1]) == _signature(module):
            runs[-1].append(name)
        else:
            if previous is not None:
                first_gap = first_gap or _difference(prefix + previous[0], previous[1], prefix + name, module)
            runs.append([name])
        previous = (name, module)
    if first_gap is None:  # alike, only not side by side: another class sits between them
        return None
    alike = " | ".join(prefix + (r[0] if len(r) == 1 else f"{r[0]}..{r[-1]}") for r in runs)
    return (f"the {kind.__name__} modules {alike} are not all alike: repeated blocks sit side by side and share "
            f"their submodules and parameter shapes, e.g. {first_gap}")


@dataclass(frozen=True)
class Layout:
    """The model's repeated blocks and the parts around them, as module names.

    `container` is the fqn of the nn.ModuleList / nn.Sequential holding the blocks ("" when
    the model itself is that stack), None when the model has no repeated blocks (its layers
    plain attributes): plan and execute refuse it (planner.plan.no_blocks_reason). `block_names` are the
    container's children that are the blocks, in order; they need not be integers
    (torchvision's "encoder_layer_0"). `before` / `after` are the fqns of the parts that
    run before the blocks (the first pipeline stage holds them) and after them (the last).
    """

    container: str | None
    block_names: tuple[str, ...]
    before: tuple[str, ...]
    after: tuple[str, ...]

    @property
    def num_blocks(self) -> int:
        return len(self.block_names)

    def block_fqn(self, index: int) -> str:
        name = self.block_names[index]
        return f"{self.container}.{name}" if self.container else name


def find_layout(model: nn.Module) -> Layout:
    """The one rule the profiler and the executor share (`find_blocks`), as names."""
    container, run = find_blocks(model)
    if container is None:
        return Layout(None, (), (), ())
    path = qualname(model, container)
    before, after_by_level = [], []
    prefix, module = "", model
    for step in (path.split(".") if path else []):
        names = [n for n, _ in module.named_children()]
        i = names.index(step)
        before += [f"{prefix}{n}" for n in names[:i]]
        after_by_level.append([f"{prefix}{n}" for n in names[i + 1:]])
        prefix, module = f"{prefix}{step}.", getattr(module, step)
    names = [n for n, _ in container.named_children()]
    first, last = names.index(run[0]), names.index(run[-1])
    before += [f"{prefix}{n}" for n in names[:first]]
    after_by_level.append([f"{prefix}{n}" for n in names[last + 1:]])
    after = [fqn for level in reversed(after_by_level) for fqn in level]  # innermost runs first
    return Layout(path, tuple(run), tuple(before), tuple(after))


def tied_groups(model: nn.Module) -> list[list[str]]:
    """Parameter names that refer to one Parameter object (a tied embedding and head), primary
    (first in named_parameters order) first."""
    groups: dict[int, list[str]] = {}
    for fqn, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(fqn)
    return [names for names in groups.values() if len(names) > 1]


def tied_aliases(model: nn.Module) -> set[str]:
    """The names of tied parameters other than each tie's primary (a state dict may omit them)."""
    return {name for group in tied_groups(model) for name in group[1:]}


def _clear(model: nn.Module, fqn: str) -> None:
    parent, _, name = fqn.rpartition(".")
    model.get_submodule(parent)._modules[name] = None


def cut_chunk(model: nn.Module, layout: Layout, first: int, last: int, is_first: bool, is_last: bool) -> nn.Module:
    """A copy of `model` holding blocks [first, last) (the others None, names kept, so
    parameter names, and with them checkpoints, are the same under any stage split), the
    parts before the blocks only if `is_first` and those after them only if `is_last`."""
    chunk = copy.deepcopy(model)
    for i in range(layout.num_blocks):
        if not first <= i < last:
            _clear(chunk, layout.block_fqn(i))
    for fqn in () if is_first else layout.before:
        _clear(chunk, fqn)
    for fqn in () if is_last else layout.after:
        _clear(chunk, fqn)
    return chunk


def blocks_of(model: nn.Module, layout: Layout) -> nn.Module | None:
    """The container of the blocks (None for a model without repeated blocks)."""
    return None if layout.container is None else model.get_submodule(layout.container)


# Modules whose forward is a matmul (or a convolution): what the profile's FLOP count sees, so
# what planner memory_model.pre_recompute's "forward FLOPs > 0" matches.
MATMUL_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def recomputable_parts_before(chunk: nn.Module, layout: Layout) -> list[tuple[nn.Module, str]]:
    """(parent, name) of what to checkpoint of the parts before the blocks that this chunk holds
    and that do matmul work (DeepSeek-V3's dense layers, a conv stem; not an embedding): what a
    device that recomputes its blocks with full or sac recomputes too (planner
    memory_model.pre_recompute). A part that only holds a list of layers gives each layer, so
    a backward re-materialises one at a time, as it does a block."""
    out = []
    for fqn in layout.before:
        parent, _, name = fqn.rpartition(".")
        try:
            container = chunk.get_submodule(parent)
        except AttributeError:  # the parent itself was cut away
            continue
        module = container._modules.get(name)
        if module is None or not any(isinstance(m, MATMUL_MODULES) for m in module.modules()):
            continue
        children = list(module.children())
        if len(children) == 1 and isinstance(children[0], nn.ModuleList | nn.Sequential) and len(children[0]) > 1:
            out += [(children[0], key) for key in children[0]._modules]
        else:
            out.append((container, name))
    return out


def present_parts(chunk: nn.Module, layout: Layout, which: str = "both") -> list[nn.Module]:
    """The parts before ("before"), after ("after") or around ("both") the blocks that this
    chunk holds (not None)."""
    out = []
    fqns = {"before": layout.before, "after": layout.after, "both": (*layout.before, *layout.after)}[which]
    for fqn in fqns:
        parent, _, name = fqn.rpartition(".")
        try:
            module = chunk.get_submodule(parent)._modules.get(name)
        except AttributeError:  # the parent itself was cut away
            module = None
        if module is not None:
            out.append(module)
    return out


def owned_blocks(chunk: nn.Module, layout: Layout) -> list[tuple[int, nn.Module]]:
    """(index, module) of the blocks this chunk holds, in order."""
    container = blocks_of(chunk, layout)
    if container is None:
        return []
    return [(i, container._modules[name]) for i, name in enumerate(layout.block_names)
            if container._modules[name] is not None]
