"""Deterministic micro-batches: the global batch of a step is the same under every plan.

Sample k of micro-batch i of dp-rank r at step t is global sample g = (r * m + i) * mbs + k
(m micro-batches per replica), made by the model file's batch(1, seed) seeded from (seed, t, g)
and stacked along dim 0: every layout of the same global batch, whatever its dp and mbs,
trains on the same samples (a single-process run, dp=1, m = gbs/mbs, sees the same g's). A
batch() whose samples do not stack (a 0-dim leaf, leaves that differ from sample to sample)
is called once per micro-batch, seeded from (seed, t, g of its first sample).
A model file's `data(rank, world)` hook, when present, replaces the synthetic batches: it
returns an iterator of (inputs, targets) micro-batches for dp-rank `rank` of `world`.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten


def microbatch_seed(seed: int, step: int, index: int) -> int:
    return (seed * 1_000_003 + step) * 1_048_576 + index


class BatchSource:
    def __init__(self, model_file, reference_model, micro_batch: int, n_micro: int, dp_rank: int,
                 dp: int, seed: int):
        self.batch_fn = model_file.hook("batch")
        self.reference = reference_model
        self.micro_batch, self.n_micro = micro_batch, n_micro
        self.dp_rank, self.seed = dp_rank, seed
        data_fn = model_file.hook("data")
        self.stream = iter(data_fn(dp_rank, dp)) if data_fn else None

    def skip(self, steps: int) -> None:
        """Resume: a data stream is advanced past the steps already trained."""
        if self.stream is not None:
            for _ in range(steps * self.n_micro):
                next(self.stream)

    def microbatches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self.stream is not None:
            return [next(self.stream) for _ in range(self.n_micro)]
        first = self.dp_rank * self.n_micro * self.micro_batch
        return [self._microbatch(step, first + i * self.micro_batch) for i in range(self.n_micro)]

    def _microbatch(self, step: int, first_sample: int):
        seeds = [microbatch_seed(self.seed, step, first_sample + k) for k in range(self.micro_batch)]
        if self.micro_batch > 1:
            stacked = stack_samples([self.batch_fn(1, model=self.reference, seed=s) for s in seeds])
            if stacked is not None:
                return stacked
        return self.batch_fn(self.micro_batch, model=self.reference, seed=seeds[0])


def stack_samples(samples: list):
    """One batch of the one-sample batches `samples` (pytrees of the same structure), their
    tensors concatenated along dim 0; None where they do not stack: another structure, a 0-dim
    tensor, tensors of other trailing shapes, or other non-tensor leaves."""
    flat, specs = zip(*(tree_flatten(sample) for sample in samples), strict=True)
    if any(spec != specs[0] for spec in specs[1:]):
        return None
    leaves = []
    for column in zip(*flat, strict=True):
        first = column[0]
        if isinstance(first, torch.Tensor):
            if first.dim() == 0 or any(not isinstance(t, torch.Tensor) or t.shape[1:] != first.shape[1:]
                                       for t in column):
                return None
            leaves.append(torch.cat(column))
        elif all(leaf == first for leaf in column[1:]):
            leaves.append(first)
        else:
            return None
    return tree_unflatten(leaves, specs[0])
