"""A MoE whose expert bank (integer num_experts and top_k, as the profiler counts banks) holds
its experts as a ModuleList of nn.Linear: no parameter has the experts in dim 0, so expert
parallelism cannot shard it (smplan.model.capabilities.expert_bank_problem)."""

import torch
from torch import nn


class Bank(nn.Module):
    def __init__(self):
        super().__init__()
        self.num_experts, self.top_k = 2, 1
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        return torch.stack([e(x[i]) for i, e in enumerate(self.experts)])


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(8, 2)
        self.bank = Bank()

    def forward(self, h):  # every token through both experts, weighted by the router
        w = self.router(h).softmax(-1)
        out = self.bank(h.reshape(1, -1, 8).expand(2, -1, -1))
        return h + (out * w.reshape(-1, 2).T.unsqueeze(-1)).sum(0).view_as(h)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(8, 16)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def model():
    return Net()


def batch(micro_batch_size, model=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, 16, (micro_batch_size, 5), generator=g)
    return t[:, :-1], t[:, 1:]


def loss(out, y):
    return torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())
