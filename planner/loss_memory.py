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


def loss_peak_bytes(loss_fn: Callable, outputs, targets) -> tuple[float, float] | None:
    """(bytes per sample, fixed bytes) of the peak while `loss_fn(outputs, targets)` and its
    backward to the outputs run: measured on one sample and on two (the first one twice), since a
    chunked loss's temporaries (examples/gpt.py's loss="chunked") do not grow with the batch; None
    where that cannot run (a loss that returns no tensor, outputs pytree cannot copy or slice)."""
    try:
        one = _peak(loss_fn, *_samples((outputs, targets), 1))
        two = _peak(loss_fn, *_samples((outputs, targets), 2))
    except (RuntimeError, TypeError, ValueError, NotImplementedError, IndexError):  # the profile goes on without it
        return None
    if one is None or two is None:
        return None
    per_sample = max(two - one, 0.0)
    return per_sample, max(one - per_sample, 0.0)


def _samples(batch, n: int):
    """`batch` cut to its first sample, repeated `n` times (dim 0 of every tensor that has one),
    with the attributes a model sets on its output for its loss (examples/gpt.py's `smplan_loss`)."""
    def cut(t):
        if not isinstance(t, torch.Tensor) or not t.dim():
            return t
        out = torch.cat([t[:1]] * n)
        out.__dict__.update(t.__dict__)
        return out

    return tree_map(cut, batch)


def _peak(loss_fn: Callable, outputs, targets) -> float | None:
    """Peak bytes while the loss and its backward to `outputs` run, on meta copies of them: the
    outputs included until the loss has read them (a training loop passes the logits straight to
    the loss, as torchtitan and `smplan execute` do, so nothing holds them after) or, where the
    loss saves them for its backward (a chunked or fused cross-entropy), throughout; their
    gradients once made."""
    copies = tree_map(lambda t: _copy(t) if isinstance(t, torch.Tensor) else t, outputs)
    leaves = [t for t in tree_leaves(copies) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not leaves:
        return None
    own = {_key(t) for t in leaves}
    saves_logits = []

    def pack(t):
        if _key(t) in own:
            saves_logits.append(True)
        return t

    with torch.enable_grad(), LiveBytes() as live, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(copies, targets)
        forward_peak = live.peak
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            return None
        torch.autograd.grad(loss, leaves, allow_unused=True)
    logits = sum(t.untyped_storage().nbytes() for t in leaves)
    return float(max(logits + forward_peak, live.peak + (logits if saves_logits else 0)))
