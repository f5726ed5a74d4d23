"""Finding the repeated blocks of a model and the non-repeated parts around them."""

from __future__ import annotations

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
            sig = _signature(child) if child is not None else None
            if sig is not None and sig == last:
                run.append(name)
                continue
            if run:
                per_block = sum(p.numel() for p in container.get_submodule(run[0]).parameters())
                score = (per_block * len(run), len(run))
                if score > best_score:
                    best, best_score = (container, list(run)), score
            run, last = ([name], sig) if child is not None else ([], None)
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


