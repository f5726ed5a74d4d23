"""Where a model's repeated blocks and its non-repeated parts are.

Model file contract (DESIGN.md): the repeated blocks are the longest `nn.ModuleList` /
`nn.Sequential` of structurally identical modules. Children of the root registered before
that container (the embedding) belong to the first pipeline stage, those after it (the
head) to the last one.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Layout:
    blocks_fqn: str  # e.g. "blocks"
    num_blocks: int
    before: tuple[str, ...]  # root children that run before the blocks
    after: tuple[str, ...]  # root children that run after them


def _signature(module: nn.Module) -> tuple:
    return (type(module).__name__, tuple((n, tuple(p.shape)) for n, p in module.named_parameters()))


def find_layout(model: nn.Module) -> Layout:
    best_name, best_len = None, 0
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList | nn.Sequential) and len(module) > best_len:
            children = [m for m in module if m is not None]
            if children and len({_signature(m) for m in children}) == 1:
                best_name, best_len = name, len(module)
    if best_name is None:
        raise ValueError(f"{type(model).__name__} has no nn.ModuleList/nn.Sequential of identical blocks")
    if best_name == "":  # the model itself is the stack of blocks (an nn.Sequential)
        return Layout("", best_len, (), ())
    top = best_name.split(".")[0]
    names = [n for n, _ in model.named_children()]
    idx = names.index(top)
    return Layout(best_name, best_len, tuple(names[:idx]), tuple(names[idx + 1:]))


def blocks_of(model: nn.Module, layout: Layout) -> nn.Module:
    return model.get_submodule(layout.blocks_fqn)


def cut_chunk(model: nn.Module, layout: Layout, first: int, last: int, is_first: bool, is_last: bool) -> nn.Module:
    """A copy of `model` holding blocks [first, last) (others None, indices kept, so
    parameter names, and with them checkpoints, are the same under any stage split)."""
    chunk = copy.deepcopy(model)
    blocks = blocks_of(chunk, layout)
    for i in range(layout.num_blocks):
        if not first <= i < last:
            blocks._modules[str(i)] = None
    if not is_first:
        for name in layout.before:
            setattr(chunk, name, None)
    if not is_last:
        for name in layout.after:
            setattr(chunk, name, None)
    return chunk


def owned_blocks(chunk: nn.Module, layout: Layout) -> list[tuple[int, nn.Module]]:
    return [(int(i), m) for i, m in blocks_of(chunk, layout)._modules.items() if m is not None]
