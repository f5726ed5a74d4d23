"""Model files as a user writes them (no `config`): one decoder shell, and the block each test varies."""

from __future__ import annotations


def token_lm_file(block: str, vocab: int, width: int, seq: int = 16) -> str:
    """A model file of `block` (the source of a class Block taking its width as d) twice, between a
    token embedding and a head, with batch() of `seq`-token sequences: a block to profile alone."""
    return ("import torch\nfrom torch import nn\nimport torch.nn.functional as F\n\n" + block.strip("\n")
            + f"""


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.out = nn.Embedding({vocab}, {width}), nn.Linear({width}, {vocab})
        self.blocks = nn.ModuleList([Block() for _ in range(2)])

    def forward(self, t):
        x = self.emb(t)
        for blk in self.blocks:
            x = blk(x)
        return self.out(x)


def model():
    return Net()


def batch(micro_batch_size, model=None, seed=0):
    x = torch.randint(0, {vocab}, (micro_batch_size, {seq + 1}), generator=torch.Generator().manual_seed(seed))
    return x[:, :-1], x[:, 1:]
""")


def _own(block: str, tp_plan: str) -> str:
    """The file every model here shares (token_lm_file: 64-token vocabulary, width 32, 8-token
    sequences) with `block` and a tp_plan returning `tp_plan`."""
    return token_lm_file(block, vocab=64, width=32, seq=8) + f"""

def tp_plan(block):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    return {tp_plan}
"""


# Its own attention through SDPA, 4 heads, no config: tp must take the heads from the SDPA call.
OWN_MODEL = _own(block='''
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
MHA_MODEL = _own(block='''
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
REPEAT_KV_MODEL = _own(block='''
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


# nanoGPT's fused q/k/v split by position: it runs on tp's local shards (views sized by -1) but
# each rank's "q" is the first third of its slice of the fused columns, not its q heads.
FUSED_QKV_MODEL = _own(block='''
class Block(nn.Module):
    def __init__(self, d=32, h=4):
        super().__init__()
        self.hd = d // h
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, self.hd).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        return x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))
''', tp_plan='{"qkv": ColwiseParallel(), "o": RowwiseParallel()}')

# The same fused weight laid out per head ([q_h, k_h, v_h] for each head h, as Megatron-LM and
# examples/gpt.py do): a view by heads before the split keeps each rank's heads whole.
PER_HEAD_QKV_MODEL = FUSED_QKV_MODEL.replace(
    "for t in self.qkv(x).chunk(3, dim=-1))",
    "for t in self.qkv(x).view(b, s, -1, 3 * self.hd).chunk(3, dim=-1))").replace(
    "t.view(b, s, -1, self.hd).transpose(1, 2)", "t.transpose(1, 2)")
