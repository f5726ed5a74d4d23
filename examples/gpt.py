"""A Megatron-style GPT (and Llama-style variants) for smplan.

    smplan profile examples/gpt.py --arg layers=4 --arg hidden=256 --arg heads=4
    smplan plan examples/gpt.py:gpt3_175b --hw a100x8 --nodes 128

Builder `model(...)` and presets (`gpt3_175b`, `gpt3_1t`, `llama3_8b`, `llama3_70b`,
`llama3_405b`, `tiny`) return a `GPT`. The layout follows Megatron-LM: pre-norm blocks,
fused QKV projection, explicit softmax attention with dropout (Korthikanti et al. 2022
count activations for exactly this), 4h GeLU MLP. `attention="sdpa"` switches to fused
scaled-dot-product attention (flash attention on a GPU), the Llama presets' default;
`mlp="swiglu"`, `norm="rmsnorm"` and `kv_heads` give the Llama layout (rotary embeddings
are left out: they have no weights and little work).

Context parallelism: `context_parallel(model, sequence)` gives the embedding and the
attention modules the rank's share of the sequence (global positions, and an all-gather
of K/V over the cp ranks); smplan's executor calls it when a plan has cp > 1.

Tensor parallelism covers the whole model, as Megatron-LM and torchtitan's
parallelize_llama do: `tp_plan(block, sequence_parallel)` shards each block (Shoeybi et
al. 2019 section 3; Korthikanti et al. 2022 for sequence parallelism) and
`tp_plan_outer(model, sequence_parallel)` the parts around them: a vocab-parallel token
embedding, the final norm on sequence shards under SP, and a vocab-parallel head whose
logits stay sharded (a DTensor) into the loss, which the executor runs under
`loss_parallel()` so that no rank holds full-vocabulary logits. Learned position
embeddings stay replicated (s x h weights): they are added to the all-reduced token
embedding, and under SP the sum is then split along the sequence (no communication).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    seq_len: int = 32
    vocab: int = 128
    ffn: int = 0  # 0 means 4 * hidden (GPT); Llama presets give theirs
    kv_heads: int = 0  # 0 means heads (multi-head attention); fewer means grouped-query
    attention: str = "explicit"  # "explicit" (Megatron softmax + dropout) or "sdpa"
    mlp: str = "gelu"  # "gelu" or "swiglu"
    norm: str = "layernorm"  # "layernorm" or "rmsnorm"
    dropout: float = 0.1
    learned_positions: bool = True
    loss: str = "fp32"  # "fp32" (F.cross_entropy on fp32 logits) or "chunked" (see `loss`)

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq_len", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")
        self.ffn = self.ffn or 4 * self.hidden
        self.kv_heads = self.kv_heads or self.heads
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} must be divisible by heads={self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} must be divisible by kv_heads={self.kv_heads}")
        if self.attention not in ("explicit", "sdpa"):
            raise ValueError(f"attention must be 'explicit' or 'sdpa', got {self.attention!r}")
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"mlp must be 'gelu' or 'swiglu', got {self.mlp!r}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {self.norm!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _norm(cfg: GPTConfig) -> nn.Module:
    return nn.LayerNorm(cfg.hidden) if cfg.norm == "layernorm" else nn.RMSNorm(cfg.hidden)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        kv_dim = cfg.kv_heads * cfg.head_dim
        bias = cfg.norm == "layernorm"  # GPT has biases, Llama does not
        self.qkv = nn.Linear(cfg.hidden, cfg.hidden + 2 * kv_dim, bias=bias)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden, bias=bias)
        self.dropout = nn.Dropout(cfg.dropout)
        self.sequence = None  # context parallelism: set by context_parallel() below

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.cfg.head_dim
        qkv = self.qkv(x)
        # Local sizes come from the tensor, not the config, so a tensor-parallel shard
        # (heads / tp of them) runs the same code. QKV is laid out per kv-group so that
        # a column split keeps each group's q, k and v on one rank.
        group = self.cfg.heads // self.cfg.kv_heads
        qkv = qkv.view(b, s, -1, (group + 2) * d)
        q, k, v = qkv.split([group * d, d, d], dim=-1)
        q = q.reshape(b, s, -1, d).transpose(1, 2)  # b, heads, s, d
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        mask = None  # causal over the local sequence
        if self.sequence is not None:  # context parallelism: this rank's queries, the whole sequence's K/V
            k, v = self.sequence.gather(k, 2), self.sequence.gather(v, 2)
            mask = self.sequence.mask()  # by global position: True where the key comes later
        if self.cfg.attention == "sdpa":
            # grouped-query heads read their kv head in the kernel (torch's enable_gqa; flash
            # attention keeps the un-repeated k and v for backward, Dao 2023 section 3)
            p = self.cfg.dropout if self.training else 0.0
            if mask is None:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, enable_gqa=group > 1)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask, dropout_p=p, enable_gqa=group > 1)
        else:
            if group > 1:  # grouped-query: each kv head serves `group` query heads (a copy)
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            if mask is None:
                mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
            probs = self.dropout(torch.softmax(scores, dim=-1))
            out = probs @ v
        out = out.transpose(1, 2).reshape(b, s, -1)
        return self.dropout(self.proj(out))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        bias = not self.swiglu
        self.fc1 = nn.Linear(cfg.hidden, cfg.ffn, bias=bias)
        self.gate = nn.Linear(cfg.hidden, cfg.ffn, bias=False) if self.swiglu else None
        self.fc2 = nn.Linear(cfg.ffn, cfg.hidden, bias=bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            h = F.silu(self.gate(x)) * self.fc1(x)
        else:
            h = F.gelu(self.fc1(x))
        return self.dropout(self.fc2(h))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.norm1 = _norm(cfg)
        self.attn = Attention(cfg)
        self.norm2 = _norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Embedding(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.positions = nn.Embedding(cfg.seq_len, cfg.hidden) if cfg.learned_positions else None
        self.dropout = nn.Dropout(cfg.dropout)
        self.sequence = None  # context parallelism: set by context_parallel() below

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens)
        if self.positions is not None:
            if self.sequence is not None:
                where = self.sequence.positions.to(tokens.device)
            else:
                where = torch.arange(tokens.shape[1], device=tokens.device)
            x = x + self.positions(where)
        return self.dropout(x)


class Head(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.norm = _norm(cfg)
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

        self.loss = cfg.loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.out(self.norm(x))
        logits.smplan_loss = self.loss  # read by `loss` (the hook sees only outputs and targets)
        return logits


class GPT(nn.Module):
    """embed -> blocks -> head; any of them may be None on a pipeline stage that lacks it."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.embed = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.head = Head(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            if block is not None:
                x = block(x)
        return self.head(x) if self.head is not None else x


def model(
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    seq_len: int = 32,
    vocab: int = 128,
    ffn: int = 0,
    kv_heads: int = 0,
    attention: str = "explicit",
    mlp: str = "gelu",
    norm: str = "layernorm",
    dropout: float = 0.1,
    learned_positions: bool = True,
    loss: str = "fp32",
) -> GPT:
    """A GPT; the defaults are a tiny model that trains in seconds on a CPU. `loss="chunked"`
    computes the cross-entropy a chunk of tokens at a time and keeps only the low-precision
    logits and their gradient (see `loss`)."""
    return GPT(GPTConfig(layers, hidden, heads, seq_len, vocab, ffn, kv_heads, attention, mlp,
                         norm, dropout, learned_positions, loss))


def _preset(defaults: dict):
    def builder(**overrides) -> GPT:
        return model(**{**defaults, **overrides})

    # model()'s parameters with this preset's defaults, so that tools see which arguments exist
    sig = inspect.signature(model)
    builder.__signature__ = sig.replace(
        parameters=[q.replace(default=defaults.get(q.name, q.default)) for q in sig.parameters.values()])
    return builder


# Brown et al. 2020 (GPT-3), Table 2.1; vocabulary padded to 51200 as in Megatron-LM.
gpt3_175b = _preset(dict(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200))
# Narayanan et al. 2021, Table 1 (1T row).
gpt3_1t = _preset(dict(layers=128, hidden=25600, heads=160, seq_len=2048, vocab=51200))
# Llama 3 herd of models (Meta 2024), Table 3. Trained with fused flash attention (the paper's
# stack, and every 2023+ framework: Megatron-Core, torchtitan), so the presets use sdpa; pass
# --arg attention=explicit for 2021 Megatron's softmax with s x s scores.
_LLAMA = dict(mlp="swiglu", norm="rmsnorm", learned_positions=False, dropout=0.0, vocab=128256, seq_len=8192,
              attention="sdpa")
llama3_8b = _preset(dict(_LLAMA, layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336))
llama3_70b = _preset(dict(_LLAMA, layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672))
llama3_405b = _preset(dict(_LLAMA, layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248))
# A debug size for tests: plan, simulate and execute it in seconds.
tiny = _preset(dict(layers=4, hidden=32, heads=4, seq_len=16, vocab=64, dropout=0.0))


def batch(micro_batch_size: int, model: GPT | None = None, seed: int = 0):
    """Synthetic next-token data: (tokens, targets), deterministic in `seed`."""
    cfg = model.config if model is not None else GPTConfig()
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab, (micro_batch_size, cfg.seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


LOSSES = ("fp32", "chunked")
# Tokens per chunk of the chunked loss: bounds its fp32 temporaries to CHUNK_TOKENS x vocab
# (about 12 B each: fp32 logits, log-softmax, gradient), e.g. 150 MB at vocab 50k. A design
# choice, like torchtune's CEWithChunkedOutputLoss(num_output_chunks=8).
CHUNK_TOKENS = 256


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy. Default ("fp32"): `F.cross_entropy` on fp32 logits, which
    keeps an fp32 log-softmax for backward. With the model's `loss="chunked"`: `chunked_cross_entropy`,
    also on vocab-sharded logits (a DTensor, tp > 1): loss_parallel runs each chunk's
    `F.cross_entropy` on the rank's vocab / tp columns, so the chunks' temporaries are split by tp
    as the profile's measured peak is (planner/memory_model.py `loss_buffer_bytes`)."""
    if getattr(outputs, "smplan_loss", "fp32") == "chunked":
        return chunked_cross_entropy(outputs.flatten(0, 1), targets.flatten(0, 1))
    return F.cross_entropy(outputs.flatten(0, 1).float(), targets.flatten(0, 1))


def chunked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, chunk_tokens: int = CHUNK_TOKENS):
    """Mean cross-entropy of [tokens, vocab] logits that never materialises fp32 logits of more
    than `chunk_tokens` tokens: what a fused cross-entropy kernel does (flash-attn's
    losses.cross_entropy, which llm-foundry's `loss_fn: fused_crossentropy` uses; Liger-Kernel's
    LigerCrossEntropy), with torch's own op per chunk. Keeps the logits (in their dtype) for
    backward, which writes their gradient chunk by chunk into one tensor of the same dtype."""
    return _ChunkedCrossEntropy.apply(logits, targets, chunk_tokens)


def _counted(targets: torch.Tensor) -> torch.Tensor:
    """Tokens the mean is over: F.cross_entropy's default ignore_index (-100) drops the rest."""
    return (targets != -100).sum()


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, chunk_tokens):
        ctx.save_for_backward(logits, targets)
        ctx.chunk_tokens = chunk_tokens
        total = logits.new_zeros((), dtype=torch.float32)
        for x, t in zip(logits.split(chunk_tokens), targets.split(chunk_tokens), strict=True):
            total = total + F.cross_entropy(x.float(), t, reduction="sum")
        return total / _counted(targets)

    @staticmethod
    def backward(ctx, grad_out):
        logits, targets = ctx.saved_tensors
        grad = torch.empty_like(logits)
        scale = grad_out / _counted(targets)
        # Recompute each chunk's fp32 cross-entropy and take torch's own gradient of it; the
        # inner graph is transient (a no-op saved-tensor hook keeps it out of outer hooks).
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            for x, t, g in zip(logits.split(ctx.chunk_tokens), targets.split(ctx.chunk_tokens),
                               grad.split(ctx.chunk_tokens), strict=True):
                x = x.detach().requires_grad_()
                (gx,) = torch.autograd.grad(F.cross_entropy(x.float(), t, reduction="sum") * scale, x)
                g.copy_(gx)
        return grad, None, None


def context_parallel(model: GPT, sequence) -> None:
    """Context parallelism (smplan's cp): this rank holds the tokens at `sequence.positions`
    of every sequence. The position embeddings look those positions up, and attention
    gathers K and V of the whole sequence (`sequence.gather`, differentiable) and masks by
    global position (`sequence.mask()`). Called once per model chunk (a part may be None)."""
    for module in model.modules():
        if isinstance(module, Embedding | Attention):
            module.sequence = sequence


def tp_plan(block: Block, sequence_parallel: bool = False) -> dict:
    """Megatron tensor parallelism for one block (Shoeybi et al. 2019, section 3)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if not sequence_parallel:
        plan = {
            "attn.qkv": ColwiseParallel(),
            "attn.proj": RowwiseParallel(),
            "mlp.fc1": ColwiseParallel(),
            "mlp.fc2": RowwiseParallel(),
        }
        if block.mlp.gate is not None:
            plan["mlp.gate"] = ColwiseParallel()
        return plan
    # Korthikanti et al. 2022: norms and dropouts run on sequence shards; all-gather before
    # the column-parallel linears, reduce-scatter after the row-parallel ones.
    plan = {
        "norm1": SequenceParallel(),
        "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attn.qkv": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
        "norm2": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.fc1": ColwiseParallel(),
        "mlp.fc2": RowwiseParallel(output_layouts=Shard(1)),
    }
    if block.mlp.gate is not None:
        plan["mlp.gate"] = ColwiseParallel()
    return plan


def tp_plan_outer(model: GPT, sequence_parallel: bool = False) -> dict:
    """Tensor parallelism of the parts around the blocks, by module path from the root
    (torchtitan's parallelize_llama; Megatron's vocab-parallel embedding and output layer,
    Shoeybi et al. 2019 section 3). Entries under a part a pipeline stage lacks are skipped."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    sp = sequence_parallel
    positions = model.config.learned_positions
    plan = {
        # Vocab-parallel lookup: each rank holds vocab / tp rows; all-reduce (reduce-scatter
        # straight into sequence shards under SP when nothing is added to it).
        "embed.tokens": RowwiseParallel(input_layouts=Replicate(),
                                        output_layouts=Shard(1) if sp and not positions else Replicate()),
        # Vocab-parallel head: logits sharded over the vocabulary, kept as a DTensor for loss_parallel.
        "head.out": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(), output_layouts=Shard(-1),
                                    use_local_output=False),
    }
    if sp:
        plan["head.norm"] = SequenceParallel()
        if positions:  # token + position embeddings are replicated: split them along the sequence
            plan["embed.dropout"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                                       use_local_output=True)
    return plan
