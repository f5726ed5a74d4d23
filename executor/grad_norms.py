"""Gradient norm of every repeated block: how the gradient is spread across the layers.

Computed before clipping, like the global `grad_norm` of metrics.jsonl, so the two agree:
the global norm squared is the sum of the blocks' squares plus the non-block parameters'.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist

from .materialize import canonical_name


def block_index(param_name: str, layout) -> int | None:
    """The block a parameter belongs to, e.g. "module.blocks.2._checkpoint_wrapped_module.w"
    -> 2 for blocks named blocks.0, blocks.1, ... in `layout` (smplan.model.Layout); None for
    parameters outside the repeated blocks (embedding, head)."""
    parts = canonical_name(param_name).split(".")
    if parts and parts[0] == "module":  # DDP's prefix
        parts = parts[1:]
    depth = len(layout.container.split(".")) if layout.container else 0
    if layout.container is None or len(parts) <= depth + 1:
        return None
    if layout.container and ".".join(parts[:depth]) != layout.container:
        return None
    try:
        return layout.block_names.index(parts[depth])
    except ValueError:
        return None


def by_layout(grads) -> dict:
    """Gradients grouped by (mesh, placements): torch's get_total_norm takes one layout at a
    time; plain tensors form the group None."""
    from torch.distributed.tensor import DTensor

    groups: dict = defaultdict(list)
    for g in grads:
        groups[(id(g.device_mesh), tuple(g.placements)) if isinstance(g, DTensor) else None].append(g)
    return groups


def squared_norm(groups: dict, device: torch.device) -> torch.Tensor:
    """Sum of squares of the FULL gradients in `groups` (sharded norms reduced to full values);
    every rank holding a shard must call it with the same groups in the same order."""
    from torch.distributed.tensor import DTensor

    total = torch.zeros((), device=device)
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        total = total + norm.float() ** 2
    return total


def block_grad_norms(chunks, layout, device: torch.device, pp_group=None) -> list[float]:
    """2-norm of each block's full gradient (same list on every rank).

    Sharded (DTensor) gradients are normed per layout group and reduced to full values, as
    in the global clip; each pipeline stage fills its own blocks and the stages add their
    squares over pp. Every rank of a stage walks the same blocks in the same order, so the
    collectives inside `full_tensor` match up.
    """
    per_block: dict[int, list] = defaultdict(list)
    for chunk in chunks:
        for name, p in chunk.named_parameters():
            index = block_index(name, layout)
            if p.grad is not None and index is not None:
                per_block[index].append(p.grad)
    squares = torch.zeros(layout.num_blocks, device=device)
    for index in sorted(per_block):
        squares[index] += squared_norm(by_layout(per_block[index]), device)
    if pp_group is not None:
        dist.all_reduce(squares, group=pp_group)
    return squares.sqrt().tolist()
