"""An analytic GPT ModelProfile (Megatron layout), built from closed-form formulas.

Activations follow Korthikanti et al. 2022 (section 4.1, bytes per layer for a micro-batch
of b sequences): 34·sbh + 5·as²b without parallelism, of which 24·sbh is divided by
tensor parallelism, 10·sbh (layer-norm inputs, linear inputs, dropout masks) only with
sequence parallelism, and 5·as²b is the attention core that selective recompute frees.
FLOPs follow Narayanan et al. 2021 (24·sh² + 4·s²h per layer forward, 2·shV head).
Element-wise HBM traffic counts one read and one write of every non-GEMM kernel's
tensors (layer norms, GeLU, softmax, dropout, residual adds), bf16 values, 1-byte masks.

Used by the planner tests before (and to cross-check) `smplan.planner.profile_model`.
"""

from __future__ import annotations

from smplan.planner.model_profile import BlockProfile, MatmulShape, ModelProfile, TPCollective


def gpt_profile(
    layers: int = 4,
    hidden: int = 256,
    heads: int = 4,
    seq: int = 128,
    vocab: int = 1024,
    name: str = "gpt",
    dtype: str = "bf16",
) -> ModelProfile:
    s, h, a, v = seq, hidden, heads, vocab
    d = h // a
    sh = s * h
    block = BlockProfile(
        name="block",
        kind="block",
        params=12 * h * h + 13 * h,
        forward_flops_per_sample=24.0 * s * h * h + 4.0 * s * s * h,
        saved_bytes_tp_sharded_per_sample=24.0 * sh,
        saved_bytes_replicated_per_sample=10.0 * sh,
        saved_bytes_attention_core_per_sample=5.0 * a * s * s,
        output_bytes_per_sample=2.0 * sh,
        input_bytes_per_sample=2.0 * sh,
        # LN x2 (8sh) + 2 residual dropout-adds (14sh) replicated; GeLU (16sh) and
        # scale-mask-softmax + dropout over a·s² scores (9as²) sharded over heads.
        elementwise_bytes_per_sample=38.0 * sh + 9.0 * a * s * s,
        elementwise_tp_sharded_fraction=(16.0 * sh + 9.0 * a * s * s) / (38.0 * sh + 9.0 * a * s * s),
        matmuls=(
            MatmulShape(m=s, n=3 * h, k=h, tp_dim="n"),  # fused QKV, column parallel
            MatmulShape(m=s, n=s, k=d, batch=a, tp_dim="batch"),  # Q K^T per head
            MatmulShape(m=s, n=d, k=s, batch=a, tp_dim="batch"),  # probs V per head
            MatmulShape(m=s, n=h, k=h, tp_dim="k"),  # attention projection, row parallel
            MatmulShape(m=s, n=4 * h, k=h, tp_dim="n"),  # fc1
            MatmulShape(m=s, n=h, k=4 * h, tp_dim="k"),  # fc2
        ),
        tp_collectives=(
            TPCollective("all_reduce", "forward", 2.0 * sh),
            TPCollective("all_reduce", "forward", 2.0 * sh),
            TPCollective("all_reduce", "backward", 2.0 * sh),
            TPCollective("all_reduce", "backward", 2.0 * sh),
        ),
        # torchtitan's op-level SAC: the QKV (6sh) and fc1 (8sh) outputs kept; the attention
        # core (batched GEMMs), the projection and fc2 re-run
        saved_bytes_sac_tp_sharded_per_sample=14.0 * sh,
        sac_recompute_matmuls=(
            MatmulShape(m=s, n=s, k=d, batch=a, tp_dim="batch"),
            MatmulShape(m=s, n=d, k=s, batch=a, tp_dim="batch"),
            MatmulShape(m=s, n=h, k=h, tp_dim="k"),
            MatmulShape(m=s, n=h, k=4 * h, tp_dim="k"),
        ),
    )
    embed = BlockProfile(
        name="embed",
        kind="pre",
        params=v * h + s * h,
        forward_flops_per_sample=0.0,
        saved_bytes_tp_sharded_per_sample=0.0,
        saved_bytes_replicated_per_sample=1.0 * sh,  # dropout mask
        saved_bytes_attention_core_per_sample=0.0,
        output_bytes_per_sample=2.0 * sh,
        elementwise_bytes_per_sample=13.0 * sh,
        tp_collectives=(TPCollective("all_reduce", "forward", 2.0 * sh),),  # vocab-parallel lookup
    )
    head = BlockProfile(
        name="head",
        kind="post",
        params=v * h + 2 * h,
        forward_flops_per_sample=2.0 * s * h * v,
        saved_bytes_tp_sharded_per_sample=4.0 * s * v,  # fp32 softmax kept for the loss backward
        saved_bytes_replicated_per_sample=4.0 * sh,  # final LN input, head input
        saved_bytes_attention_core_per_sample=0.0,
        output_bytes_per_sample=2.0 * s * v,  # logits
        elementwise_bytes_per_sample=8.0 * sh + 20.0 * s * v,
        elementwise_tp_sharded_fraction=20.0 * s * v / (8.0 * sh + 20.0 * s * v),
        matmuls=(MatmulShape(m=s, n=v, k=h, tp_dim="n"),),
        tp_collectives=(TPCollective("all_reduce", "backward", 2.0 * sh),),
    )
    return ModelProfile(
        model=name,
        args=dict(layers=layers, hidden=h, heads=a, seq_len=s, vocab=v),
        seq_len=s,
        dtype=dtype,
        bytes_per_element=2 if dtype in ("bf16", "fp16") else 4,
        pre=(embed,),
        blocks=tuple(block for _ in range(layers)),
        post=(head,),
        has_tp_plan=True,
        num_heads=a,
    )


def korthikanti_activation_bytes(s: int, b: int, h: int, a: int, t: int, mode: str) -> float:
    """Korthikanti et al. 2022, Table 2: activation bytes per layer per GPU."""
    if mode == "none":  # tensor parallel only
        return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    if mode == "sp":  # tensor + sequence parallel
        return s * b * h * (34 / t + 5 * a * s / (h * t))
    if mode == "selective":  # tensor + sequence parallel + selective recompute
        return s * b * h * 34 / t
    if mode == "full":  # full recompute keeps the layer input
        return 2 * s * b * h
    raise ValueError(mode)
