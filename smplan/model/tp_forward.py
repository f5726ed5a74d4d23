"""Whether a block's forward runs on the local shards tensor parallelism gives it.

Under torch's ColwiseParallel / RowwiseParallel (use_local_output, the default) a block's code
sees plain local tensors: a column-parallel linear returns out_features / tp columns, a
row-parallel one takes in_features / tp. Code that sizes a view by the model's whole width
(`view(b, s, self.heads, -1)` with every head) fails there, after launch. Running the block
once on the meta device with its tp_plan's linears narrowed so, at the smallest degree a plan
could use, finds it before any plan offers tp.
"""

from __future__ import annotations

import copy
import math
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils._pytree import tree_map

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


def _narrow_(linear: nn.Linear, kind: str, tp: int) -> None:
    """`linear` (a meta copy) as one of `tp` ranks holds it under torch's styles: the same module
    (a subclass keeps its forward, `out_features` its global value, as parallelize_module leaves
    them) with a weight of the local shard's shape; tp divides the width it splits."""
    shape = list(linear.weight.shape)
    shape[0 if kind == "col" else 1] //= tp
    linear.weight = nn.Parameter(torch.empty(shape, dtype=linear.weight.dtype, device="meta"), requires_grad=False)
    if kind == "col" and linear.bias is not None:
        linear.bias = nn.Parameter(torch.empty(shape[0], dtype=linear.bias.dtype, device="meta"), requires_grad=False)


def keeps_whole_width(style) -> bool:
    """Whether a ColwiseParallel / RowwiseParallel `style` hands the block's code whole-width
    tensors at that module (a replicated or DTensor output, a replicated input the style shards
    itself: transformers' colwise_rep / rowwise_rep): the trial leaves such a linear whole."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    if isinstance(style, ColwiseParallel):
        return not (style.use_local_output and isinstance(style.output_layouts[0], Shard))
    return not isinstance(style.input_layouts[0], Shard)


def trial_degrees(styled: dict[str, tuple[nn.Module, str]], heads: int) -> list[int]:
    """The degrees > 1 a plan could run, ascending: those dividing the model's (key/value) head
    count, 0 when unknown (the planner offers only tp dividing it), and every width the linears
    of `styled` split."""
    widths = [m.out_features if kind == "col" else m.in_features
              for m, kind in styled.values() if isinstance(m, nn.Linear)]
    if not widths:
        return []
    common = math.gcd(heads, *widths) if heads else math.gcd(*widths)
    return [d for d in range(2, common + 1) if common % d == 0]


@dataclass(frozen=True)
class TPTrial:
    """What the block's forward ran on: `problem`, why it runs at no degree (None: it runs at
    the smallest); `largest`, the largest degree it ran at below the first one it failed at
    (None: it ran at every degree tried). A K/V repeated up to every head before attention (the
    repeat_kv of Llama's code) shows the query heads to SDPA: the trial finds the key/value
    heads' limit in the projections' widths."""

    problem: str | None = None
    largest: int | None = None


def tp_forward_trial(block: nn.Module, args: tuple, kwargs: dict, styled: dict[str, tuple[nn.Module, str]],
                     heads: int = 0, fix: str = TP_FORWARD_FIX) -> TPTrial:
    """Run `block` (meta) as `forward(*args, **kwargs)` with the linears of `styled` (name in
    block -> (module, "col" | "row"), those whose style hands it local shards) narrowed to one
    of tp ranks, at each of `trial_degrees` in turn until one fails. Modules other than
    nn.Linear are left whole."""
    ran = None
    for tp in trial_degrees(styled, heads):
        error = _run_narrowed(block, args, kwargs, styled, tp)
        if error is None:
            ran = tp
            continue
        if ran is not None:
            return TPTrial(largest=ran)
        return TPTrial(problem=f"the block's forward fails on tp={tp}'s local shards ({type(error).__name__}: "
                               f"{str(error).splitlines()[0] if str(error) else ''}{_where(block, error)}); {fix}")
    return TPTrial()


def _run_narrowed(block: nn.Module, args: tuple, kwargs: dict, styled: dict, tp: int) -> Exception | None:
    local = copy.deepcopy(block)
    for name, (module, kind) in styled.items():
        if isinstance(module, nn.Linear):
            _narrow_(local.get_submodule(name), kind, tp)
    try:
        with torch.no_grad():
            local(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - the user's forward: any error is the reason
        return err
    return None


def _where(block: nn.Module, err: BaseException) -> str:
    """", line 23 of vit.py": the last line of the block's own file the error passed through."""
    code = getattr(type(block).forward, "__code__", None)
    lines = [line for frame, line in traceback.walk_tb(err.__traceback__)
             if code is not None and frame.f_code.co_filename == code.co_filename]
    return f", line {lines[-1]} of {Path(code.co_filename).name}" if lines else ""
