"""Deterministic micro-batches: the global batch of a step is the same under every plan of
the same micro-batch size.

Micro-batch i of dp-rank r at step t is global micro-batch j = r * m + i (m per replica),
seeded from (seed, t, j); a single-process run (dp=1, m = gbs/mbs) sees the same j's. A plan
of another micro-batch size draws other samples from batch() (its seeds number micro-batches,
not samples): compare such plans' losses on `--data`, whose global batch is the same under
every plan. Building each micro-batch from one-sample batches would cost mbs calls of
batch() inside the timed step and cannot stack leaves that are not batch-first (a shared
[s, s] mask, a position index).
A model file's `data(rank, world)` hook, when present, replaces the synthetic batches: it
returns an iterator of (inputs, targets) micro-batches for dp-rank `rank` of `world`.
"""

from __future__ import annotations

import torch


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
        first = self.dp_rank * self.n_micro
        return [
            self.batch_fn(self.micro_batch, model=self.reference, seed=microbatch_seed(self.seed, step, first + i))
            for i in range(self.n_micro)
        ]
