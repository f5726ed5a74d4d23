"""examples/moe.py: routing against a per-token reference, training on CPU, MLA shapes."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from examples import moe


def _layer(**cfg) -> moe.MoELayer:
    torch.manual_seed(0)
    layer = moe.MoELayer(moe.MoEConfig(**{"hidden": 16, "experts": 4, "top_k": 2, "moe_ffn": 24, **cfg}))
    return layer.double()


def _reference(layer: moe.MoELayer, x: torch.Tensor) -> torch.Tensor:
    """Token by token: each chosen expert's SwiGLU, weighted; slots past capacity dropped in
    token order (the earliest tokens keep their place, as in GShard)."""
    cfg, ex = layer.cfg, layer.experts
    flat = x.reshape(-1, x.shape[-1])
    weights, ids = layer.route(flat)
    slots = [0] * cfg.experts
    cap = layer.capacity(flat.shape[0], torch.bincount(ids.reshape(-1), minlength=cfg.experts))
    out = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        for j in range(cfg.top_k):
            e = int(ids[t, j])
            slots[e] += 1
            if slots[e] > cap:
                continue
            b1 = ex.b1[e, 0] if ex.b1 is not None else 0
            b3 = ex.b3[e, 0] if ex.b3 is not None else 0
            b2 = ex.b2[e, 0] if ex.b2 is not None else 0
            h = torch.nn.functional.silu(flat[t] @ ex.w1[e] + b1) * (flat[t] @ ex.w3[e] + b3)
            out[t] += weights[t, j].double() * (h @ ex.w2[e] + b2)
        if layer.shared is not None:
            out[t] += layer.shared(flat[t])
    return out.view(x.shape)


@pytest.mark.parametrize("cfg", [
    {},
    {"shared_experts": 1, "router": "sigmoid", "routed_scale": 2.5},
    {"expert_bias": True, "router_bias": True, "top_k": 3},
    {"capacity_factor": 0.5},  # drops: half the balanced load per expert
    {"capacity_factor": 1.0, "experts": 8},
], ids=["dropless", "shared-sigmoid", "biases", "cf0.5-drops", "cf1-8experts"])
def test_dispatch_equals_per_token_loop(cfg):
    layer = _layer(**cfg)
    x = torch.randn(3, 7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want = layer(x), _reference(layer, x)
    torch.testing.assert_close(got, want)


def test_small_capacity_really_drops():
    layer = _layer(capacity_factor=0.5)
    x = torch.randn(3, 7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        dropped = layer(x)
        layer.cfg.capacity_factor = None
        dropless = layer(x)
    kept = (dropped - dropless).abs().amax(-1) < 1e-12  # tokens whose every choice found a slot
    assert 0 < int(kept.sum()) < kept.numel()


def test_dropless_capacity_is_the_busiest_expert_and_balanced_on_meta():
    layer = _layer()
    load = torch.tensor([5, 0, 2, 1])
    assert layer.capacity(4, load) == 4  # capped: an expert takes a token at most once
    assert layer.capacity(8, load) == 5
    assert layer.capacity(8, load.to("meta")) == 4  # 8 tokens * top_k 2 / 4 experts
    assert _layer(capacity_factor=1.5).capacity(8, load) == 6


def test_meta_forward_runs_balanced_expert_gemms():
    with torch.device("meta"):
        layer = moe.MoELayer(moe.MoEConfig(hidden=16, experts=4, top_k=2, moe_ffn=24))
        x = torch.empty(2, 10, 16)
    shapes = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._overloadpacket is torch.ops.aten.bmm:
                shapes.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    with Spy():
        assert layer(x).shape == x.shape
    assert shapes == [(4, 10, 16), (4, 10, 16), (4, 10, 24)]  # 20 tokens * 2 / 4 experts = 10 each


@pytest.mark.parametrize("overrides", [{}, dict(attention="mla", heads=4, q_lora_rank=16, kv_lora_rank=8,
                                                qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                                                router="sigmoid", shared_experts=1),
                                       dict(qk_norm=True, attn_bias=True, expert_bias=True, router_bias=True,
                                            head_dim=4, dense_layers=0)],
                         ids=["tiny", "tiny-mla", "tiny-gpt-oss-like"])
def test_tiny_trains_on_cpu(overrides):
    torch.manual_seed(0)
    m = moe.tiny(**overrides)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    tokens, targets = moe.batch(4, m)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = moe.loss(m(tokens), targets)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    assert all(p.grad is not None for p in m.parameters())
    assert losses[-1] < losses[0] - 0.5


def test_mla_matches_unpadded_attention():
    torch.manual_seed(0)
    cfg = moe.MoEConfig(attention="mla", hidden=16, heads=2, q_lora_rank=0, kv_lora_rank=8,
                        qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=3)
    attn = moe.MLA(cfg).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    q = attn.q_b(x).view(2, 5, 2, 6).transpose(1, 2)
    latent, k_rope = attn.kv_a(x).split([8, 2], dim=-1)
    k_nope, v = attn.kv_b(attn.kv_a_norm(latent)).view(2, 5, 2, 7).split([4, 3], dim=-1)
    k = torch.cat([k_nope, k_rope[:, :, None].expand(-1, -1, 2, -1)], -1).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)) / 6**0.5
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    want = attn.proj((scores.softmax(-1) @ v.transpose(1, 2)).transpose(1, 2).reshape(2, 5, 6))
    torch.testing.assert_close(attn(x), want)


@pytest.mark.parametrize("bad,match", [
    (dict(top_k=5), "top_k=5"), (dict(dense_layers=9), "dense_layers=9"),
    (dict(capacity_factor=0.0), "capacity_factor"), (dict(attention="mla"), "kv_lora_rank"),
    (dict(router="relu"), "router"),
])
def test_bad_config_names_the_value(bad, match):
    with pytest.raises(ValueError, match=match):
        moe.tiny(**bad)
