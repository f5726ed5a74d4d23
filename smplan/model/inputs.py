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


def sequence_length(inputs) -> int:
    """The sequence a sample is: dim 1 of the token ids, a dict's "input_ids" (a Hugging Face
    batch, whichever key comes first) or else the first integer tensor of two or more dims,
    (batch, seq); 0 without one (images, features). The one rule for the profile's seq_len, which
    labels a plan's throughput tokens or samples, and for the tokens execute counts, so that
    measured and predicted rates are of the same unit."""
    ids = inputs.get("input_ids") if isinstance(inputs, dict) else None
    for t in [ids] if isinstance(ids, torch.Tensor) else tree_leaves(inputs):
        if isinstance(t, torch.Tensor) and t.dim() >= 2 and not (t.is_floating_point() or t.is_complex()):
            return int(t.shape[1])
    return 0


def tokens_per_sample(inputs) -> int:
    """Tokens in one sample: `sequence_length`, or 1 for inputs without token ids (a sample)."""
    return sequence_length(inputs) or 1


def first_tensor(inputs) -> torch.Tensor | None:
    """The first tensor among the inputs (the token ids of a Hugging Face batch), or None."""
    return next((t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)), None)


def describe_shapes(tree) -> str:
    """The shapes of the tensors in `tree`, for one line: [4, 10], or {input_ids: [4, 8]}."""
    if isinstance(tree, torch.Tensor):
        return str(list(tree.shape))
    if isinstance(tree, dict):
        return "{" + ", ".join(f"{k}: {describe_shapes(v)}" for k, v in tree.items()) + "}"
    if isinstance(tree, tuple | list):
        return "(" + ", ".join(describe_shapes(v) for v in tree) + ")"
    return type(tree).__name__
