"""Whether a block's forward runs on the local shards tensor parallelism gives it.

Under torch's ColwiseParallel / RowwiseParallel (use_local_output, the default) a block's code
sees plain local tensors: a column-parallel linear returns out_features / tp columns, a
row-parallel one takes in_features / tp. Code that sizes a view by the model's whole width
(`view(b, s, self.heads, -1)` with every head) fails there, after launch. Running the block
once on the meta device with its tp_plan's linears narrowed so finds it before any plan offers tp.
"""

from __future__ import annotations

import copy
import traceback
from pathlib import Path

import torch
from torch import nn
from torch.utils._pytree import tree_map

# The degree tried: the smallest split shows a view sized by the whole width as well as any.
TRIAL_TP = 2
TP_FORWARD_FIX = ("size views by the local width (-1, or heads // tp from the weight's shape), as examples/gpt.py "
                  "does, to allow tp")


class InputSpec:
    """A block's call as shapes: `record` is its forward pre-hook (with_kwargs) during the
    profiler's trace, which must not see new tensors nor keep the inputs alive (it counts live
    storage); `rebuilt` gives (args, kwargs) again as fresh meta tensors, after the trace."""

    def __init__(self):
        self.recorded = False
        self._spec = None

    def record(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not self.recorded:
            self._spec = tree_map(lambda t: _TensorSpec(t) if isinstance(t, torch.Tensor) else t, (args, kwargs))
            self.recorded = True

    def rebuilt(self) -> tuple[tuple, dict]:
        return tree_map(lambda s: s.build() if isinstance(s, _TensorSpec) else s, self._spec)


class _TensorSpec:
    def __init__(self, t: torch.Tensor):
        self.shape, self.dtype = tuple(t.shape), t.dtype

    def build(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device="meta")


def _narrowed(linear: nn.Linear, kind: str, tp: int) -> nn.Linear | None:
    """`linear` as one of `tp` ranks holds it (meta), or None where tp does not divide it."""
    out_f, in_f = linear.out_features, linear.in_features
    if kind == "col":
        if out_f % tp:
            return None
        out_f //= tp
    else:
        if in_f % tp:
            return None
        in_f //= tp
    return nn.Linear(in_f, out_f, bias=linear.bias is not None, device="meta", dtype=linear.weight.dtype)


def tp_forward_problem(block: nn.Module, args: tuple, kwargs: dict, styled: dict[str, tuple[nn.Module, str]],
                       fix: str = TP_FORWARD_FIX) -> str | None:
    """Why `block` (meta) cannot run `forward(*args, **kwargs)` with the linears of `styled`
    (name in block -> (module, "col" | "row")) narrowed to one of TRIAL_TP ranks, or None.
    Modules other than nn.Linear, and dimensions tp does not divide, are left to the other checks."""
    local = copy.deepcopy(block)
    narrowed = 0
    for name, (module, kind) in styled.items():
        if not isinstance(module, nn.Linear) or kind not in ("col", "row"):
            continue
        replacement = _narrowed(module, kind, TRIAL_TP)
        if replacement is None:
            return None
        parent_name, _, attr = name.rpartition(".")
        setattr(local.get_submodule(parent_name) if parent_name else local, attr, replacement)
        narrowed += 1
    if not narrowed:
        return None
    try:
        with torch.no_grad():
            local(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - the user's forward: any error is the reason
        return f"the block's forward fails on tp={TRIAL_TP}'s local shards ({type(err).__name__}: " \
               f"{str(err).splitlines()[0] if str(err) else ''}{_where(block, err)}); {fix}"
    return None


def _where(block: nn.Module, err: BaseException) -> str:
    """", line 23 of vit.py": the last line of the block's own file the error passed through."""
    code = getattr(type(block).forward, "__code__", None)
    lines = [line for frame, line in traceback.walk_tb(err.__traceback__)
             if code is not None and frame.f_code.co_filename == code.co_filename]
    return f", line {lines[-1]} of {Path(code.co_filename).name}" if lines else ""
