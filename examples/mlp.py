"""A tiny residual MLP: the fastest model that exercises plan, simulate and execute.

    smplan profile examples/mlp.py --arg layers=8 --arg width=64
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """x + fc2(gelu(fc1(norm(x)))): one repeated, tensor-parallel-friendly block."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, layers: int, width: int, inputs: int, classes: int):
        super().__init__()
        self.config = dict(layers=layers, width=width, inputs=inputs, classes=classes)
        self.embed = nn.Linear(inputs, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            if block is not None:
                x = block(x)
        return self.head(x) if self.head is not None else x


def model(layers: int = 4, width: int = 32, inputs: int = 16, classes: int = 8) -> MLP:
    return MLP(layers, width, inputs, classes)


def batch(micro_batch_size: int, model: MLP | None = None, seed: int = 0):
    cfg = model.config if model is not None else dict(inputs=16, classes=8)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(micro_batch_size, cfg["inputs"], generator=gen)
    y = torch.randint(0, cfg["classes"], (micro_batch_size,), generator=gen)
    return x, y


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs.float(), targets)


def tp_plan(block: Block, sequence_parallel: bool = False) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
