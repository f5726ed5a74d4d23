"""Small decoders for the input-convention tests: the same weights taking a plain tensor (the
reference), a (tokens, mask) tuple or a dict of keyword arguments; one that ties its
embedding and head; one returning a pair the default loss cannot take. No loss(): they train
with the default cross-entropy."""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ, WIDTH = 64, 16, 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Decoder(nn.Module):
    def __init__(self, inputs: str = "tensor", tie: bool = False):
        super().__init__()
        self.inputs = inputs  # what batch() gives: "tensor", "tuple" or "dict"
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        if tie:
            self.head.weight = self.emb.weight

    def forward(self, tokens, mask=None):
        x = self.emb(tokens) if self.emb is not None else tokens
        for block in self.blocks:
            if block is not None:
                x = block(x)
        if mask is not None:
            x = x * mask.unsqueeze(-1)
        return self.head(x) if self.head is not None else x


class KeywordDecoder(Decoder):
    def forward(self, input_ids, attention_mask):
        return super().forward(input_ids, attention_mask)


class PairOut(Decoder):
    def forward(self, tokens):
        return super().forward(tokens), tokens.shape[1]


def model():
    return Decoder()


def tuple_inputs():
    return Decoder("tuple")


def dict_inputs():
    return KeywordDecoder("dict")


def tied():
    return Decoder(tie=True)


def pair_out():
    return PairOut()


def batch(micro_batch_size, model=None, seed=0):
    t = torch.randint(0, VOCAB, (micro_batch_size, SEQ + 1), generator=torch.Generator().manual_seed(seed))
    tokens, targets = t[:, :-1].contiguous(), t[:, 1:].contiguous()
    ones = torch.ones(micro_batch_size, SEQ)
    kind = getattr(model, "inputs", "tensor")
    if kind == "dict":
        return {"input_ids": tokens, "attention_mask": ones}, targets
    return ((tokens, ones) if kind == "tuple" else tokens), targets
