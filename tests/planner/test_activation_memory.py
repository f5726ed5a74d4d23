"""Activation bytes of a flash-attention SwiGLU (Llama) block against a hand count, and the
op-level selective checkpointing (`recompute=sac`) figures the planner and executor share.

Hand count, bf16 (2 bytes), micro-batch 1, no dropout, of examples/gpt.py's Llama block with
attention="sdpa" (what autograd keeps until backward; Korthikanti et al. 2022 section 4.1
count the same way, and FlashAttention keeps q, k, v, the output and the per-row
log-sum-exp instead of the s x s scores, Dao et al. 2022 section 3.1):
- RMSNorm x2: its input (2sh) and rstd (4s fp32): torch's `_fused_rms_norm` on CUDA
- the QKV linear's input (2sh) and its output storage (2s(h + 2kv)): k and v are views into
  it, so the kernel keeping them keeps the whole fused buffer; under grouped-query attention
  q is a copy (2sh: the reshape of its per-group slice cannot be a view)
- attention output O (2sh, also the projection's input) and log-sum-exp (4 * heads * s)
- MLP input (2sh, shared by gate and up), gate output, up output, silu(gate), their product
  (4 x 2sf)
"""

from __future__ import annotations

import pytest
import torch
from smplan.planner import Plan, PlanError, plan_from_inline, profile_model
from smplan.planner.memory_model import chunk_memory, in_flight

from tests.conftest import EXAMPLES
from tests.own_models import token_lm_file

GPT = str(EXAMPLES / "gpt.py")


def llama(s: int, h: int, heads: int, kv_heads: int, ffn: int, **extra):
    args = dict(layers=2, hidden=h, heads=heads, kv_heads=kv_heads, ffn=ffn, seq_len=s, vocab=256, attention="sdpa",
                mlp="swiglu", norm="rmsnorm", learned_positions=False, dropout=0.0, **extra)
    return profile_model(GPT, args, cache=False)


def hand_count(s: int, h: int, heads: int, kv_heads: int, ffn: int) -> float:
    kv = h // heads * kv_heads
    norms = 2 * (2 * s * h + 4 * s)
    q_copy = 2 * s * h if kv_heads < heads else 0
    attention = 2 * s * h + 2 * s * (h + 2 * kv) + q_copy + 2 * s * h + 4 * heads * s
    mlp = 2 * s * h + 4 * 2 * s * ffn
    return norms + attention + mlp


def sac_hand_count(s: int, h: int, heads: int, kv_heads: int, ffn: int) -> float:
    """torchtitan's op-level policy on the block's GEMMs in order qkv, proj, gate, up, down:
    it saves the 1st, 3rd and 5th outputs and the attention kernel's (O and the log-sum-exp);
    the block's input is the checkpoint's."""
    kv = h // heads * kv_heads
    return 2 * s * h + 2 * s * (h + 2 * kv) + (2 * s * h + 4 * heads * s) + 2 * s * ffn + 2 * s * h


@pytest.mark.parametrize("s,h,heads,kv_heads,ffn", [(128, 256, 8, 2, 704), (256, 256, 4, 4, 512), (96, 192, 6, 3, 512)])
def test_flash_swiglu_block_matches_the_hand_count(s, h, heads, kv_heads, ffn):
    block = llama(s, h, heads, kv_heads, ffn).blocks[0]
    # philox seed and offset of the attention kernel: 24 bytes
    assert block.saved_bytes_per_sample == pytest.approx(hand_count(s, h, heads, kv_heads, ffn), abs=32)
    # flash attention keeps no s x s tensor, so selective recompute (Korthikanti's) frees nothing,
    # also when seq_len equals the hidden width (the [s, h] activations are not scores)
    assert block.saved_bytes_attention_core_per_sample == 0
    assert block.saved_bytes_per_gpu(recompute="selective") == block.saved_bytes_per_gpu(recompute="none")


def megatron_count(s: int, h: int, heads: int, kv_heads: int, ffn: int, fp8: bool = False) -> float:
    """What Megatron-Core with Transformer Engine keeps of the same block: the norms' inputs and
    rstd, their outputs (the QKV and MLP linears' inputs), q k v, the attention output and
    log-sum-exp, fc1's gate and up outputs (the fused bias_swiglu keeps only its input) and the
    down projection's input. Under FP8 the linears keep their inputs' FP8 cast (1 B), and the
    projection's beside the attention output the kernel keeps."""
    kv = h // heads * kv_heads
    norms = 2 * (2 * s * h + 4 * s)
    linear_inputs = 2 * (2 * s * h) + 2 * s * ffn  # the norm outputs, the SwiGLU product
    attention = 2 * s * (h + 2 * kv) + 2 * s * h + 4 * heads * s
    fc1 = 2 * 2 * s * ffn
    fp8_copy = s * h if fp8 else 0
    return norms + (linear_inputs / 2 if fp8 else linear_inputs) + attention + fc1 + fp8_copy


@pytest.mark.parametrize("s,h,heads,kv_heads,ffn", [(128, 256, 8, 2, 704), (256, 256, 4, 4, 512)])
def test_fused_and_fp8_stacks_keep_what_megatron_keeps(s, h, heads, kv_heads, ffn):
    """The eager trace less what fused kernels recompute (silu(gate), the grouped query's copy made
    of the QKV buffer they keep anyway), and under FP8 the linears' FP8 inputs."""
    block = llama(s, h, heads, kv_heads, ffn).blocks[0]
    fused = block.saved_bytes_per_gpu(fusion=1.0)
    assert fused == pytest.approx(megatron_count(s, h, heads, kv_heads, ffn), abs=32)
    assert block.saved_bytes_per_gpu(fusion=1.0, fp8_input_bytes=1.0) == pytest.approx(
        megatron_count(s, h, heads, kv_heads, ffn, fp8=True), abs=32)
    assert block.saved_bytes_per_gpu(fusion=0.0) == block.saved_bytes_per_sample  # eager keeps them all
    # the memory model reads both from the cluster: megatron-core fuses, torchtitan runs eager
    from smplan.hwprofiles import load_cluster

    p = llama(s, h, heads, kv_heads, ffn)
    common = dict(tp=1, dp=1, sp=False, zero=0, micro_batch=1, flight=1.0, first=False, last=False,
                  device_first_chunk=False, recompute="none")
    act = {(stack, dtype): chunk_memory(p, load_cluster("h100x8", stack=stack), dtype=dtype, **common).act_blk
           for stack in ("megatron-core", "torchtitan") for dtype in ("bf16", "fp8")}
    assert act["torchtitan", "bf16"] == pytest.approx(block.saved_bytes_per_sample)
    assert act["megatron-core", "bf16"] == pytest.approx(fused)
    assert act["megatron-core", "fp8"] == pytest.approx(megatron_count(s, h, heads, kv_heads, ffn, fp8=True), abs=32)


def test_fp8_weights_take_a_transposed_copy_below_blackwell():
    """Transformer Engine caches the FP8 weight and its transpose where FP8 GEMMs take only the TN
    layout (H100), the weight alone on Blackwell (B200)."""
    from smplan.hwprofiles import load_cluster

    p = llama(128, 256, 8, 2, 704)
    common = dict(tp=1, dp=1, sp=False, zero=0, micro_batch=1, flight=1.0, first=False, last=False,
                  device_first_chunk=False, recompute="none")
    extra = {}
    for hw in ("h100x8", "b200x8"):
        cl = load_cluster(hw)
        extra[hw] = (chunk_memory(p, cl, dtype="fp8", **common).weights_blk
                     - chunk_memory(p, cl, dtype="bf16", **common).weights_blk)
    params = p.blocks[0].params
    assert extra["h100x8"] - extra["b200x8"] == pytest.approx(params)  # one more byte per parameter


def test_rmsnorm_keeps_its_bf16_input_not_fp32_copies():
    """The meta device runs RMSNorm's composite (fp32 input copy + fp32 product, 8 B/element);
    the profile counts the CUDA kernel's 2 B/element plus rstd."""
    s, h = 64, 128
    with_norm = llama(s, h, 4, 4, 256).blocks[0].saved_bytes_per_sample
    layer_norm = profile_model(GPT, dict(layers=2, hidden=h, heads=4, ffn=256, seq_len=s, vocab=256, attention="sdpa",
                                         mlp="swiglu", norm="layernorm", dropout=0.0), cache=False).blocks[0]
    # LayerNorm keeps its input and fp32 mean + rstd per row: RMSNorm keeps 4 s bytes less each
    assert layer_norm.saved_bytes_per_sample - with_norm == pytest.approx(2 * 4 * s, abs=32)


@pytest.mark.parametrize("s,h,heads,kv_heads,ffn", [(128, 256, 8, 2, 704), (96, 192, 6, 3, 512)])
def test_sac_keeps_every_other_gemm_output_and_the_attention_output(s, h, heads, kv_heads, ffn):
    block = llama(s, h, heads, kv_heads, ffn).blocks[0]
    assert block.supports_sac
    kept = block.saved_bytes_per_gpu(recompute="sac")
    assert kept == pytest.approx(sac_hand_count(s, h, heads, kv_heads, ffn), abs=32)
    assert block.saved_bytes_per_gpu(recompute="full") < kept < block.saved_bytes_per_gpu()
    # it re-runs the projection and the up GEMM, not the attention kernel
    rerun = sorted((mm.n, mm.k) for mm in block.sac_recompute_matmuls)
    assert rerun == sorted([(h, h), (ffn, h)])
    assert block.sac_recompute_matmuls and all(mm.tp_dim in ("n", "k") for mm in block.sac_recompute_matmuls)


def test_sac_under_tp_divides_the_column_parallel_outputs_only():
    s, h, heads, ffn = 128, 256, 8, 512
    block = llama(s, h, heads, heads, ffn).blocks[0]
    one, four = block.saved_bytes_per_gpu(1, False, "sac"), block.saved_bytes_per_gpu(4, False, "sac")
    # col-parallel qkv and gate outputs and the attention kernel's are / tp; the row-parallel
    # down projection's partial sums and the input are whole on every rank
    whole = 2 * s * h + 2 * s * h
    assert four == pytest.approx(whole + (one - whole) / 4, abs=32)


def test_memory_model_and_plan_accept_sac():
    from smplan.hwprofiles import load_cluster

    p = llama(128, 256, 8, 2, 704)
    cluster = load_cluster("a100x8")
    common = dict(tp=1, dp=1, sp=False, zero=0, micro_batch=2, flight=in_flight("1f1b", 1, 1, 4, 0), first=True,
                  last=True, device_first_chunk=True, dtype="bf16")
    mems = {r: chunk_memory(p, cluster, recompute=r, **common) for r in ("none", "sac", "full")}
    assert mems["full"].act_rec_blk < mems["sac"].act_rec_blk < mems["none"].act_rec_blk
    # a recomputing block re-materialises one block's activations during its backward
    assert mems["sac"].buffers == mems["full"].buffers > mems["none"].buffers
    inline = dict(model=GPT, hw="a100x8", nodes=1, gpus_per_node=8, num_blocks=2)
    plan = plan_from_inline("dp=8,mbs=1,gbs=8,recompute=sac", **inline)
    assert plan.recompute == "sac" and all(st.recompute == "sac" for st in plan.stages)
    assert Plan.from_dict(plan.to_dict()).recompute == "sac"
    with pytest.raises(PlanError, match="recompute must be one of none, selective, sac, full"):
        plan_from_inline("dp=8,mbs=1,gbs=8,recompute=ops", **inline)


def test_sac_costs_less_than_full_and_is_offered_by_the_search():
    from smplan.hwprofiles import load_cluster
    from smplan.planner import estimate, plan_search

    # large enough that the GPU's time, not the host's launch overhead, sets each pass
    p = profile_model(GPT, dict(layers=4, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq_len=4096, vocab=256,
                                attention="sdpa", mlp="swiglu", norm="rmsnorm", learned_positions=False, dropout=0.0),
                      cache=False)
    cluster = load_cluster("a100x8", nodes=1)
    times = {}
    for r in ("none", "sac", "full"):
        plan = plan_from_inline(f"dp=8,tp=1,pp=1,mbs=1,gbs=16,recompute={r}", model=GPT, hw="a100x8", nodes=1,
                                gpus_per_node=8, num_blocks=p.num_blocks, model_args=p.args)
        fig = estimate(plan, p, cluster)
        times[r] = (fig.step_time_s, fig.hardware_tflops_per_gpu * fig.step_time_s)
    assert times["none"][0] < times["sac"][0] < times["full"][0]
    assert times["none"][1] < times["sac"][1] < times["full"][1]  # recompute FLOPs in the hardware count
    # GPUs too small for no recompute: the planner picks the cheaper of sac and full that fits
    mem = {r: estimate(plan_from_inline(f"dp=8,tp=1,pp=1,mbs=1,gbs=16,zero=3,recompute={r}", model=GPT, hw="a100x8",
                                        nodes=1, gpus_per_node=8, num_blocks=p.num_blocks, model_args=p.args),
                       p, cluster).peak_memory_gib for r in ("none", "sac")}
    tight = load_cluster("a100x8", nodes=1, overrides={"gpu.memory_gib": (mem["none"] + mem["sac"]) / 2})
    plans = plan_search(p, tight, global_batch=16, fix="tp=1,pp=1,dp=8,mbs=1,zero=3")
    assert plans[0].recompute == "sac" and plans[0].predicted.peak_memory_gib < tight.gpu.memory_gib


@pytest.mark.parametrize("mode,attention", [("sac", "sdpa"), ("selective", "sdpa"), ("selective", "explicit")])
def test_executor_recompute_policies_give_the_same_gradients(mode, attention):
    """On an RMSNorm model too: torch's composite RMSNorm (CPU) adds eps to its mean in place,
    which a cached output must not see (the selective policy recomputes both)."""
    import copy

    from smplan.executor.parallelize import apply_recompute
    from smplan.planner import load_model_file

    mf = load_model_file(GPT)
    torch.manual_seed(0)
    ref = mf.build(dict(layers=2, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=50, seq_len=16, attention=attention,
                        mlp="swiglu", norm="rmsnorm", dropout=0.0), device="cpu", dtype=torch.float32)
    sac = copy.deepcopy(ref)
    apply_recompute(sac.blocks, ["0", "1"], mode)
    x, y = mf.hook("batch")(2, ref)
    for model in (ref, sac):
        mf.hook("loss")(model(x), y).backward()
    for (name, a), b in zip(ref.named_parameters(), sac.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name


def test_selective_recompute_of_a_fused_attention_reruns_its_kernel():
    """Megatron-Core checkpoints the core attention under selective whatever its kernel: with a
    flash kernel the re-run costs its forward and frees (next to) nothing, so selective is slower
    than none at the same memory, and the hardware FLOPs count the re-run kernel."""
    from smplan.hwprofiles import load_cluster
    from smplan.planner import estimate

    p = profile_model(GPT, dict(layers=4, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq_len=8192, vocab=256,
                                attention="sdpa", mlp="swiglu", norm="rmsnorm", learned_positions=False, dropout=0.0),
                      cache=False)
    cluster = load_cluster("h100x8", nodes=1)
    figs = {r: estimate(plan_from_inline(f"dp=8,tp=1,pp=1,mbs=1,gbs=16,recompute={r}", model=GPT, hw="h100x8",
                                         nodes=1, gpus_per_node=8, num_blocks=p.num_blocks, model_args=p.args),
                        p, cluster) for r in ("none", "selective")}
    assert figs["selective"].step_time_s > 1.02 * figs["none"].step_time_s
    assert figs["selective"].peak_memory_gib == pytest.approx(figs["none"].peak_memory_gib, rel=1e-3)
    work = {r: f.hardware_tflops_per_gpu * f.step_time_s for r, f in figs.items()}
    assert work["selective"] > work["none"]


GLU_FILE = token_lm_file('''
class Block(nn.Module):  # a gated MLP whose up projection is scaled {how}
    def __init__(self, d=32):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, 64), nn.Linear(d, 64), nn.Linear(64, d)

    def forward(self, x):
        u = self.up(x)
        {scale}
        return x + self.down(F.silu(self.gate(x)) * u)
''', vocab=64, width=32)


@pytest.mark.parametrize("how, scale", [("out of place", "u = u * 2.0"), ("in place", "u.mul_(2.0)")])
def test_only_silu_of_the_gate_is_recomputable_whatever_scales_up_in_place(tmp_path, how, scale):
    """A fused kernel recomputes silu(gate) from the gate output it keeps; the up projection's
    output, scaled in place, is no longer what made it and is not recomputable (a review: an
    in-place op's output counted its own storage among its inputs)."""
    path = tmp_path / "glu.py"
    path.write_text(GLU_FILE.replace("{how}", how).replace("{scale}", scale))
    block = profile_model(str(path), cache=False).blocks[0]
    silu = 2 * 16 * 64  # bf16, 16 tokens, 64 wide
    assert block.saved_bytes_refusable_tp_sharded_per_sample + block.saved_bytes_refusable_replicated_per_sample == silu
