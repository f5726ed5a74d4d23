"""A Mixture-of-Experts transformer (Mixtral, Qwen3-MoE, DeepSeek-V3, GPT-OSS) for smplan.

    smplan profile examples/moe.py:tiny
    smplan profile examples/moe.py:deepseek_v3
    smplan plan examples/moe.py:mixtral_8x7b --hw h100x8 --nodes 8

Builder `model(...)` and presets (`mixtral_8x7b`, `qwen3_30b_a3b`, `qwen3_235b_a22b`,
`deepseek_v3`, `gpt_oss_120b`, `tiny`) return an `MoE`. Pre-norm RMSNorm blocks; attention
is grouped-query (fused QKV laid out per kv group, as in examples/gpt.py) or DeepSeek's
multi-head latent attention (`attention="mla"`), both through
F.scaled_dot_product_attention. The first `dense_layers` blocks have a dense SwiGLU MLP,
the rest a router, `experts` routed SwiGLU experts of which each token uses `top_k`, and
optionally `shared_experts` that every token uses. Rotary embeddings are left out (no
weights, little work; MLA keeps its rope dims), as are GPT-OSS's attention sinks and
sliding-window layers and DeepSeek-V3's group-limited routing, its aux-loss-free
balancing bias and the MTP module: none of them changes the parameter count by more than
0.01%.

Routing (`MoELayer`): top-k of the router scores, then a sort-based dispatch into a
static [experts, capacity, hidden] buffer, one batched GEMM per expert weight, and a
weighted scatter back. capacity = ceil(tokens * top_k / experts * capacity_factor)
(GShard, Lepikhin et al. 2020); tokens past an expert's capacity are dropped.
`capacity_factor=None` is dropless: on a real device the capacity is the busiest expert's
load, and on the meta device (the profiler: no data, so no loads) it is the balanced load
tokens * top_k / experts, so the profiled FLOPs are those of balanced routing.

Why batched expert weights (`Experts`: w1, w3 [E, hidden, ffn], w2 [E, ffn, hidden], as
torchtitan's GroupedExperts and Megatron-Core's grouped GEMM) rather than a ModuleList of
expert MLPs: expert parallelism shards dim 0 of three tensors (a DTensor Shard(0) or a
slice per rank) instead of re-homing E modules, and the [E, capacity, hidden] dispatch
buffer splits along dim 0 into equal all_to_all chunks, one per ep rank, with no
per-expert bookkeeping. The expert compute stays one GEMM per weight, not E small ones.

Tensor parallelism: `tp_plan(block)` shards attention and the shared experts,
`tp_plan_outer(model)` the embedding and the head (vocab-parallel, logits sharded into the
loss under loss_parallel) and the dense layers before the MoE blocks as `tp_plan` does a
block; the routed experts and the final norm stay replicated. Neither takes sequence_parallel, so sp=0.

`params_active` (smplan profile): a module with integer attributes `num_experts` and
`top_k` is a bank of routed experts, of which each token uses top_k / num_experts; here
that is `Experts`, so the router and shared experts count in full.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class MoEConfig:
    layers: int = 4
    dense_layers: int = 1  # the first blocks have a dense MLP (DeepSeek's first_k_dense_replace)
    hidden: int = 32
    heads: int = 4
    kv_heads: int = 0  # 0 means heads; MLA uses heads
    head_dim: int = 0  # 0 means hidden // heads
    seq_len: int = 16
    vocab: int = 64
    experts: int = 4
    top_k: int = 2
    moe_ffn: int = 32  # width of one routed expert
    shared_experts: int = 0  # each as wide as a routed expert (DeepSeek, Qwen2-MoE)
    dense_ffn: int = 0  # width of the dense MLP of the first blocks; 0 means moe_ffn
    capacity_factor: float | None = None  # None: dropless
    router: str = "softmax"  # "softmax" (Mixtral, Qwen3, GPT-OSS) or "sigmoid" (DeepSeek-V3)
    routed_scale: float = 1.0  # DeepSeek-V3's routed_scaling_factor
    attention: str = "gqa"  # "gqa" or "mla"
    q_lora_rank: int = 0  # MLA: 0 means a plain query projection (DeepSeek-V2-Lite)
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    qk_norm: bool = False  # Qwen3: RMSNorm over each query and key head
    attn_bias: bool = False  # GPT-OSS
    expert_bias: bool = False  # GPT-OSS: biases in the experts
    router_bias: bool = False  # GPT-OSS
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq_len", "vocab", "experts", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        self.head_dim = self.head_dim or self.hidden // self.heads
        self.dense_ffn = self.dense_ffn or self.moe_ffn
        if self.attention not in ("gqa", "mla"):
            raise ValueError(f"attention must be 'gqa' or 'mla', got {self.attention!r}")
        if self.attention == "mla":
            if not (self.kv_lora_rank and self.qk_nope_head_dim and self.qk_rope_head_dim and self.v_head_dim):
                raise ValueError("attention='mla' needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and "
                                 "v_head_dim > 0")
            self.kv_heads = self.heads  # after the up-projection every head has its own k and v
        self.kv_heads = self.kv_heads or self.heads
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} must be divisible by kv_heads={self.kv_heads}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k={self.top_k} must be between 1 and experts={self.experts}")
        if not 0 <= self.dense_layers <= self.layers:
            raise ValueError(f"dense_layers={self.dense_layers} must be between 0 and layers={self.layers}")
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            raise ValueError(f"capacity_factor={self.capacity_factor} must be > 0, or None for dropless routing")
        if self.router not in ("softmax", "sigmoid"):
            raise ValueError(f"router must be 'softmax' or 'sigmoid', got {self.router!r}")


def _rmsnorm(cfg: MoEConfig, width: int) -> nn.RMSNorm:
    return nn.RMSNorm(width, eps=cfg.norm_eps)


def _causal_attention(q, k, v, sequence):
    """Causal SDPA; under context parallelism q holds this rank's tokens and k, v the whole
    sequence, masked by global position (`sequence.mask()`: True where the key comes later)."""
    if sequence is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=~sequence.mask())


class Attention(nn.Module):
    """Grouped-query attention; fused QKV laid out per kv group so a column split keeps groups whole."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden, (cfg.heads + 2 * cfg.kv_heads) * d, bias=cfg.attn_bias)
        self.proj = nn.Linear(cfg.heads * d, cfg.hidden, bias=cfg.attn_bias)
        self.q_norm = _rmsnorm(cfg, d) if cfg.qk_norm else None
        self.k_norm = _rmsnorm(cfg, d) if cfg.qk_norm else None
        self.sequence = None  # context parallelism: set by context_parallel() below

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d, group = self.cfg.head_dim, self.cfg.heads // self.cfg.kv_heads
        # Local sizes come from the tensor, so a tensor-parallel shard runs the same code.
        q, k, v = self.qkv(x).view(b, s, -1, (group + 2) * d).split([group * d, d, d], dim=-1)
        q = q.reshape(b, s, -1, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.sequence is not None:  # context parallelism: the whole sequence's K/V
            k, v = self.sequence.gather(k, 2), self.sequence.gather(v, 2)
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = _causal_attention(q, k, v, self.sequence)
        return self.proj(out.transpose(1, 2).reshape(b, s, -1))


class MLA(nn.Module):
    """Multi-head latent attention (DeepSeek-V2, Liu et al. 2024, section 2.1.2)."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        qk_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if cfg.q_lora_rank:
            self.q_a = nn.Linear(cfg.hidden, cfg.q_lora_rank, bias=False)
            self.q_a_norm = _rmsnorm(cfg, cfg.q_lora_rank)
            self.q_b = nn.Linear(cfg.q_lora_rank, cfg.heads * qk_dim, bias=False)
        else:
            self.q_a, self.q_a_norm = None, None
            self.q_b = nn.Linear(cfg.hidden, cfg.heads * qk_dim, bias=False)
        # One projection makes the kv latent and the rope key shared by all heads.
        self.kv_a = nn.Linear(cfg.hidden, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.kv_a_norm = _rmsnorm(cfg, cfg.kv_lora_rank)
        self.kv_b = nn.Linear(cfg.kv_lora_rank, cfg.heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.proj = nn.Linear(cfg.heads * cfg.v_head_dim, cfg.hidden, bias=False)
        self.sequence = None  # context parallelism: set by context_parallel() below

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        cfg = self.cfg
        q = self.q_b(self.q_a_norm(self.q_a(x)) if self.q_a is not None else x)
        q = q.view(b, s, -1, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
        latent, k_rope = self.kv_a(x).split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        kv = self.kv_b(self.kv_a_norm(latent)).view(b, s, -1, cfg.qk_nope_head_dim + cfg.v_head_dim)
        k_nope, v = kv.split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_rope.unsqueeze(2).expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        # v keeps its own head size (128 against q and k's 192): torch's SDPA runs it (its memory-
        # efficient and cuDNN kernels; flash-attn's needs one size, which Hugging Face's DeepSeek-V3
        # code pads v to), as Megatron-Core's MLA does through Transformer Engine, and the zeros of
        # a padded v would count as a fifth more attention FLOPs.
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if self.sequence is not None:  # context parallelism: the whole sequence's K/V
            k, v = self.sequence.gather(k, 2), self.sequence.gather(v, 2)
        out = _causal_attention(q.transpose(1, 2), k, v, self.sequence)
        return self.proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU (Shazeer 2020): fc2(silu(gate(x)) * fc1(x))."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.fc1 = nn.Linear(hidden, ffn, bias=False)
        self.fc2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.silu(self.gate(x)) * self.fc1(x))


class Experts(nn.Module):
    """`num_experts` SwiGLU experts as batched weights: [E, C, hidden] -> [E, C, hidden]."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.num_experts, self.top_k = cfg.experts, cfg.top_k  # read by the profiler: params_active
        e, h, f = cfg.experts, cfg.hidden, cfg.moe_ffn
        self.w1 = nn.Parameter(torch.empty(e, h, f))  # gate
        self.w3 = nn.Parameter(torch.empty(e, h, f))  # up
        self.w2 = nn.Parameter(torch.empty(e, f, h))  # down
        self.b1 = nn.Parameter(torch.empty(e, 1, f)) if cfg.expert_bias else None
        self.b3 = nn.Parameter(torch.empty(e, 1, f)) if cfg.expert_bias else None
        self.b2 = nn.Parameter(torch.empty(e, 1, h)) if cfg.expert_bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's default init, per expert: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        for w, b in ((self.w1, self.b1), (self.w3, self.b3), (self.w2, self.b2)):
            bound = 1.0 / math.sqrt(w.shape[1])
            nn.init.uniform_(w, -bound, bound)
            if b is not None:
                nn.init.uniform_(b, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def lin(a, w, b):
            return torch.bmm(a, w) if b is None else torch.baddbmm(b, a, w)

        return lin(F.silu(lin(x, self.w1, self.b1)) * lin(x, self.w3, self.b3), self.w2, self.b2)


class MoELayer(nn.Module):
    """Router -> top-k -> static-capacity dispatch -> experts -> weighted combine (+ shared experts)."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=cfg.router_bias)
        self.experts = Experts(cfg)
        self.shared = MLP(cfg.hidden, cfg.moe_ffn * cfg.shared_experts) if cfg.shared_experts else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, expert ids), both [tokens, top_k], for x [tokens, hidden]."""
        cfg = self.cfg
        logits = self.router(x).float()
        scores = torch.sigmoid(logits) if cfg.router == "sigmoid" else torch.softmax(logits, dim=-1)
        weights, ids = scores.topk(cfg.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True) * cfg.routed_scale
        return weights, ids

    def capacity(self, tokens: int, load: torch.Tensor) -> int:
        """Slots per expert; `load` [experts] is how many tokens chose each one."""
        cfg = self.cfg
        balanced = tokens * cfg.top_k / cfg.experts
        if cfg.capacity_factor is not None:
            slots = math.ceil(balanced * cfg.capacity_factor)
        elif load.is_meta:  # no data to route: assume balanced routing
            slots = math.ceil(balanced)
        else:
            slots = int(load.max())
        return max(1, min(slots, tokens))  # an expert takes each token at most once

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        tokens, e, k = x.shape[0], self.cfg.experts, self.cfg.top_k
        weights, ids = self.route(x)
        flat = ids.reshape(-1)  # slot t * k + j: token t's j-th choice
        order = torch.argsort(flat, stable=True)  # slots grouped by expert, tokens in order
        load = torch.zeros(e, dtype=torch.long, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
        cap = self.capacity(tokens, load)
        sorted_ids = flat[order]
        rank = torch.arange(flat.numel(), device=x.device) - (torch.cumsum(load, 0) - load)[sorted_ids]
        dest = torch.where(rank < cap, sorted_ids * cap + rank, e * cap)  # e * cap: the dropped slot
        token = order // k
        buf = x.new_zeros(e * cap + 1, shape[-1]).index_add(0, dest, x[token])
        out = self.experts(buf[: e * cap].view(e, cap, -1)).reshape(e * cap, -1)
        out = torch.cat([out, out.new_zeros(1, out.shape[-1])])[dest]
        y = x.new_zeros(x.shape).index_add(0, token, out * weights.reshape(-1)[order, None].to(out.dtype))
        if self.shared is not None:
            y = y + self.shared(x)
        return y.view(shape)


class Block(nn.Module):
    def __init__(self, cfg: MoEConfig, moe: bool):
        super().__init__()
        self.norm1 = _rmsnorm(cfg, cfg.hidden)
        self.attn = MLA(cfg) if cfg.attention == "mla" else Attention(cfg)
        self.norm2 = _rmsnorm(cfg, cfg.hidden)
        self.mlp = MoELayer(cfg) if moe else MLP(cfg.hidden, cfg.dense_ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class DenseBlocks(nn.Module):
    """The first `dense_layers` blocks. A module of their own, before the MoE blocks, so that
    the repeated blocks (profiler and executor: the longest run of identical modules) are
    the MoE ones and the dense ones go with the embedding to the first pipeline stage."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.layers = nn.ModuleList(Block(cfg, moe=False) for _ in range(cfg.dense_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            x = block(x)
        return x


class Head(nn.Module):
    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.norm = _rmsnorm(cfg, cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


class MoE(nn.Module):
    """embed -> dense blocks -> MoE blocks -> head; any of them may be None on a pipeline stage."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.dense = DenseBlocks(cfg) if cfg.dense_layers else None
        self.blocks = nn.ModuleList(Block(cfg, moe=True) for _ in range(cfg.layers - cfg.dense_layers))
        self.head = Head(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        if self.dense is not None:
            x = self.dense(x)
        for block in self.blocks:
            if block is not None:
                x = block(x)
        return self.head(x) if self.head is not None else x


def model(
    layers: int = 4,
    dense_layers: int = 1,
    hidden: int = 32,
    heads: int = 4,
    kv_heads: int = 0,
    head_dim: int = 0,
    seq_len: int = 16,
    vocab: int = 64,
    experts: int = 4,
    top_k: int = 2,
    moe_ffn: int = 32,
    shared_experts: int = 0,
    dense_ffn: int = 0,
    capacity_factor: float | None = None,
    router: str = "softmax",
    routed_scale: float = 1.0,
    attention: str = "gqa",
    q_lora_rank: int = 0,
    kv_lora_rank: int = 0,
    qk_nope_head_dim: int = 0,
    qk_rope_head_dim: int = 0,
    v_head_dim: int = 0,
    qk_norm: bool = False,
    attn_bias: bool = False,
    expert_bias: bool = False,
    router_bias: bool = False,
    norm_eps: float = 1e-6,
) -> MoE:
    """A MoE transformer; the defaults are a tiny model that trains in seconds on a CPU."""
    return MoE(MoEConfig(**{k: v for k, v in locals().items()}))


def _preset(defaults: dict):
    def builder(**overrides) -> MoE:
        return model(**{**defaults, **overrides})

    # model()'s parameters with this preset's defaults, so that tools see which arguments exist
    sig = inspect.signature(model)
    builder.__signature__ = sig.replace(
        parameters=[q.replace(default=defaults.get(q.name, q.default)) for q in sig.parameters.values()])
    return builder


# seq_len 4096 in every preset: the pre-training length of DeepSeek-V3 (tech report, section 4.2)
# and of Qwen3's first stage (Qwen3 technical report, section 3.2); it sets no weights.
# mistralai/Mixtral-8x7B-v0.1 config.json (Hugging Face model card).
mixtral_8x7b = _preset(dict(layers=32, dense_layers=0, hidden=4096, heads=32, kv_heads=8, vocab=32000,
                            experts=8, top_k=2, moe_ffn=14336, seq_len=4096, norm_eps=1e-5))
# Qwen/Qwen3-30B-A3B config.json (Hugging Face model card).
qwen3_30b_a3b = _preset(dict(layers=48, dense_layers=0, hidden=2048, heads=32, kv_heads=4, head_dim=128,
                             vocab=151936, experts=128, top_k=8, moe_ffn=768, qk_norm=True, seq_len=4096))
# Qwen/Qwen3-235B-A22B config.json (Hugging Face model card).
qwen3_235b_a22b = _preset(dict(layers=94, dense_layers=0, hidden=4096, heads=64, kv_heads=4, head_dim=128,
                               vocab=151936, experts=128, top_k=8, moe_ffn=1536, qk_norm=True, seq_len=4096))
# deepseek-ai/DeepSeek-V3 config.json (Hugging Face model card); the main model, no MTP module.
deepseek_v3 = _preset(dict(layers=61, dense_layers=3, hidden=7168, heads=128, vocab=129280, experts=256,
                           top_k=8, moe_ffn=2048, shared_experts=1, dense_ffn=18432, router="sigmoid",
                           routed_scale=2.5, attention="mla", q_lora_rank=1536, kv_lora_rank=512,
                           qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, seq_len=4096))
# openai/gpt-oss-120b config.json (Hugging Face model card).
gpt_oss_120b = _preset(dict(layers=36, dense_layers=0, hidden=2880, heads=64, kv_heads=8, head_dim=64,
                            vocab=201088, experts=128, top_k=4, moe_ffn=2880, attn_bias=True, expert_bias=True,
                            router_bias=True, seq_len=4096, norm_eps=1e-5))
# A debug size for tests: one dense block, three MoE blocks with a shared expert.
tiny = _preset(dict(layers=4, dense_layers=1, hidden=32, heads=4, kv_heads=2, seq_len=16, vocab=64,
                    experts=4, top_k=2, moe_ffn=32, shared_experts=1))


def batch(micro_batch_size: int, model: MoE | None = None, seed: int = 0):
    """Synthetic next-token data: (tokens, targets), deterministic in `seed`."""
    cfg = model.config if model is not None else MoEConfig()
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab, (micro_batch_size, cfg.seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs.flatten(0, 1).float(), targets.flatten(0, 1))


def context_parallel(model: MoE, sequence) -> None:
    """Context parallelism (smplan's cp): this rank holds the tokens at `sequence.positions`;
    attention gathers K/V of the whole sequence and masks by global position. (No position
    embeddings here.) Routing runs on the local tokens, as Megatron-Core's MoE under CP does."""
    for module in model.modules():
        if isinstance(module, Attention | MLA):
            module.sequence = sequence


def tp_plan(block: Block) -> dict:
    """Megatron tensor parallelism of attention and of the shared experts (Shoeybi et al. 2019).

    The routed experts stay whole on every tp rank (their input is the all-reduced
    attention output, so every rank computes the same thing); sharding them is expert
    parallelism's job, which this plan does not do yet. No sequence_parallel argument:
    the executor then asks for sp=0.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    attn = block.attn
    if isinstance(attn, MLA):
        plan = {"attn.q_b": ColwiseParallel(), "attn.kv_b": ColwiseParallel(), "attn.proj": RowwiseParallel()}
    else:
        plan = {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel()}
    mlp = block.mlp.shared if isinstance(block.mlp, MoELayer) else block.mlp
    if mlp is not None:
        name = "mlp.shared" if isinstance(block.mlp, MoELayer) else "mlp"
        plan.update({f"{name}.gate": ColwiseParallel(), f"{name}.fc1": ColwiseParallel(),
                     f"{name}.fc2": RowwiseParallel()})
    return plan


def tp_plan_outer(model: MoE) -> dict:
    """The vocab-parallel embedding and head around the blocks (Shoeybi et al. 2019 section 3),
    by module path from the root; the logits stay sharded into the loss (loss_parallel). The
    dense layers before the MoE blocks (DeepSeek-V3's first three) as `tp_plan` shards a block:
    Megatron-Core's tensor parallelism takes every layer."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "head.out": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
    }
    dense = getattr(model, "dense", None)  # None: no dense layers, or a pipeline stage without them
    for i, block in enumerate(dense.layers if dense is not None else ()):
        plan.update({f"dense.layers.{i}.{key}": style for key, style in tp_plan(block).items()})
    return plan
