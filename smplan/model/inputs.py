"""How a model file's example inputs reach its model, one rule for the profiler and the
executor: batch() returns (inputs, targets), and the inputs are a tensor, a tuple/list of
arguments or a dict of keyword arguments (a Hugging Face model's input_ids, attention_mask)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._pytree import tree_leaves


def call_model(model: nn.Module, inputs):
    """forward(**inputs) for a dict, forward(*inputs) for a tuple or list, forward(inputs) else."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple | list):
        return model(*inputs)
    return model(inputs)


def is_one_tensor(inputs) -> bool:
    """Whether the inputs are a single tensor: what pipeline stages pass on, context
    parallelism splits and --data token streams feed."""
    return isinstance(inputs, torch.Tensor)


def inputs_kind(inputs) -> str:
    """How batch() gives its inputs, for a message: "a tensor", "a dict", "a tuple", "a list"."""
    return "a tensor" if isinstance(inputs, torch.Tensor) else f"a {type(inputs).__name__}"


def tokens_per_sample(inputs) -> int:
    """Tokens in one sample: the length of the first integer tensor of two or more dims
    (token ids, (batch, seq)) among the inputs; 1 for inputs without one (images, features)."""
    for t in tree_leaves(inputs):
        if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dim() >= 2:
            return t[0].numel()
    return 1


def first_tensor(inputs) -> torch.Tensor | None:
    """The first tensor among the inputs (the token ids of a Hugging Face batch), or None."""
    return next((t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)), None)
