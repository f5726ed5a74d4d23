"""Model files as a user writes them (no `config`): one decoder shell, and the block each test varies."""

from __future__ import annotations

# The shell every file shares: token embedding, two blocks, head; batch() of 8-token sequences.
_SHELL = '''
import torch
import torch.nn.functional as F
from torch import nn

{block}

class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 32)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.out = nn.Linear(32, 64)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def model():
    return LM()


def batch(micro_batch_size, model=None, seed=0):
    t = torch.randint(0, 64, (micro_batch_size, 9), generator=torch.Generator().manual_seed(seed))
    return t[:, :-1], t[:, 1:]


def tp_plan(block):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    return {tp_plan}
'''

# Its own attention through SDPA, 4 heads, no config: tp must take the heads from the SDPA call.
OWN_MODEL = _SHELL.format(block='''
class Block(nn.Module):
    def __init__(self, d=32, h=4):
        super().__init__()
        self.hd = d // h
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (f(x).view(b, s, -1, self.hd).transpose(1, 2) for f in (self.q, self.k, self.v))
        return x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))
''', tp_plan='{"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel()}')

# nn.MultiheadAttention reads out_proj.weight itself: a tp_plan sharding out_proj cannot run.
MHA_MODEL = _SHELL.format(block='''
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.fc = nn.Linear(32, 32)

    def forward(self, x):
        return x + self.fc(self.attn(x, x, x, need_weights=False)[0])
''', tp_plan='{"attn.out_proj": RowwiseParallel(), "fc": ColwiseParallel()}')

# OWN_MODEL with its views sized by every head (the whole width): it runs unsharded and fails on
# tp's local shards, where q/k/v give d / tp columns.
WHOLE_WIDTH_MODEL = OWN_MODEL.replace("f(x).view(b, s, -1, self.hd)", "f(x).view(b, s, 4, self.hd)")

# Grouped-query attention with Llama's repeat_kv: 4 query heads, 2 key/value heads repeated up to 4
# before SDPA, which then sees 4. tp=2 runs; tp=4 leaves k and v a fraction of a head each.
REPEAT_KV_MODEL = _SHELL.format(block='''
class Block(nn.Module):
    def __init__(self, d=32, h=4, kv=2):
        super().__init__()
        self.hd = d // h
        self.q, self.o = nn.Linear(d, d), nn.Linear(d, d)
        self.k, self.v = nn.Linear(d, kv * self.hd), nn.Linear(d, kv * self.hd)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, -1, self.hd).transpose(1, 2)
        k, v = (f(x).view(b, s, -1, self.hd).transpose(1, 2) for f in (self.k, self.v))
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        return x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))
''', tp_plan='{"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel()}')
