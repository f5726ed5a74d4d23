"""A GPT-2-style model whose projections are Hugging Face's Conv1D (a weight of shape
[in, out] used as x @ W + b), written here without transformers. Its tp_plan names them
the way a user would copy from a Linear model; torch's TP styles cannot shard them."""

import torch
import torch.nn.functional as F
from torch import nn


class Conv1D(nn.Module):
    def __init__(self, nx: int, nf: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return x @ self.weight + self.bias


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.c_fc = Conv1D(width, 4 * width)
        self.c_proj = Conv1D(4 * width, width)

    def forward(self, x):
        return x + self.c_proj(F.gelu(self.c_fc(self.ln(x))))


class Model(nn.Module):
    def __init__(self, width: int = 16, layers: int = 2, vocab: int = 32):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.h = nn.ModuleList(Block(width) for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(self, x):
        x = self.wte(x) if self.wte is not None else x
        for block in self.h:
            if block is not None:
                x = block(x)
        return self.head(x) if self.head is not None else x


def model(width: int = 16, layers: int = 2) -> Model:
    return Model(width, layers)


def batch(micro_batch_size: int, model=None, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 32, (micro_batch_size, 9), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def loss(outputs, targets):
    return F.cross_entropy(outputs.flatten(0, 1), targets.flatten())


def tp_plan(block):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"c_fc": ColwiseParallel(), "c_proj": RowwiseParallel()}
