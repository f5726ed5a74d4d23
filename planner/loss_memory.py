"""The memory peak of a model file's loss: its forward and backward run on the meta device
while every storage they allocate is counted live until it is freed.

The loss runs last, after the whole forward, beside every block's saved activations, so its
peak adds to theirs. What it allocates depends on how it is written, not only on what it saves:
`F.cross_entropy(logits.float(), targets)` (torchtitan's loss, transformers' ForCausalLMLoss,
examples/gpt.py's default) keeps an fp32 log-softmax (4 B a logit) between forward and backward,
but its backward holds three fp32 tensors at once (the saved log-softmax, nll_loss's gradient,
log_softmax's gradient: 12 B a logit) before the bf16 gradient of the logits comes out. The
profile records that peak (`BlockProfile.loss_peak_bytes_per_sample`); the memory model adds it
on the last stage where the stack runs the file's loss as written (`efficiency.cross_entropy`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages the ops under it allocate, live now and at the peak. A storage is
    live while any tensor of it is (views count once); inputs made before it are not counted."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._tensors: dict[int, int] = {}  # storage -> tensors of it alive

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        known = {_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            key = _key(t)
            if key in known and key not in self._tensors:  # an input's storage (in place, or a view of it)
                continue
            if key not in self._tensors:
                self._tensors[key] = 0
                self.live += t.untyped_storage().nbytes()
                self.peak = max(self.peak, self.live)
            self._tensors[key] += 1
            weakref.finalize(t, self._release, key, t.untyped_storage().nbytes())
        return out

    def _release(self, key: int, nbytes: int) -> None:
        self._tensors[key] -= 1
        if not self._tensors[key]:
            del self._tensors[key]
            self.live -= nbytes


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A leaf of `t`'s storage for the loss to differentiate to, with the attributes a model sets
    on its output for its loss (examples/gpt.py's `smplan_loss`)."""
    leaf = t.detach().requires_grad_(t.is_floating_point())
    leaf.__dict__.update(t.__dict__)
    return leaf


def _key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return id(t)


def loss_peak_bytes(loss_fn: Callable, outputs, targets) -> float | None:
    """Peak bytes while `loss_fn(outputs, targets)` and its backward to the outputs run, the
    outputs included until the loss has read them (a training loop passes the logits straight to
    the loss, as torchtitan and `smplan execute` do, so nothing holds them after; their gradients
    count once made), on meta copies of `outputs`; None where that cannot run (a loss that
    returns no tensor, outputs of a kind pytree cannot copy)."""
    try:
        copies = tree_map(lambda t: _copy(t) if isinstance(t, torch.Tensor) else t, outputs)
        leaves = [t for t in tree_leaves(copies) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not leaves:
            return None
        with torch.enable_grad(), LiveBytes() as live:
            loss = loss_fn(copies, targets)
            forward_peak = live.peak
            if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
                return None
            torch.autograd.grad(loss, leaves, allow_unused=True)
        logits = sum(t.untyped_storage().nbytes() for t in leaves)
        return float(max(logits + forward_peak, live.peak))
    except (RuntimeError, TypeError, ValueError, NotImplementedError):  # the profile goes on without it
        return None
