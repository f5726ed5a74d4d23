"""The loss of a model file that defines no loss(outputs, targets): one definition for the
profiler (what it keeps for backward is part of the memory model) and the executor."""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEFAULT_LOSS = ("cross-entropy of the outputs' last dim against the targets (fp32 scores; (batch, seq, vocab) "
                "logits against (batch, seq) token ids)")


def default_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """F.cross_entropy on fp32 scores. Scores with the classes last beside targets of their
    leading shape, (batch, seq, vocab) against (batch, seq) as a language model gives them,
    are flattened to rows first (F.cross_entropy wants the classes in dim 1)."""
    if outputs.dim() >= 3 and outputs.dim() == targets.dim() + 1 and outputs.shape[:-1] == targets.shape:
        outputs, targets = outputs.flatten(0, -2), targets.flatten()
    return F.cross_entropy(outputs.float(), targets)


def loss_value_problem(value) -> str | None:
    """Why what a loss(outputs, targets) returned cannot be trained on (backward needs one
    number: a 0-d or one-element tensor), or None."""
    if not isinstance(value, torch.Tensor):
        return f"loss() returned {type(value).__name__}, not a tensor; return the loss as a tensor (no .item())"
    if value.numel() != 1:
        return (f"loss() returned a tensor of shape {tuple(value.shape)}, not one number; reduce it "
                "(e.g. .mean() of the per-token losses)")
    return None
