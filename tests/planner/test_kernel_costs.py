"""Kernel costs: fused attention timed from queries, keys, head dim and the causal mask (perf.flash_attention_time_s),
tagged by the profiler (MatmulShape.kernel); FP8 cast traffic; the ZeRO-3 gathered-parameter cap."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from smplan.hwprofiles import HardwareProfileError, load_cluster
from smplan.hwprofiles.perf import (
    FLASH_BACKWARD_FLOPS_RATIO,
    PerfModelError,
    flash_attention_efficiency,
    flash_attention_time_s,
    matmul_time_s,
)
from smplan.planner import estimate, profile_model
from smplan.planner.memory_model import chunk_memory
from smplan.planner.plan import Plan, even_stages

A100 = load_cluster("a100x8")
H100 = load_cluster("h100x8")


def test_long_sequence_rate_is_the_published_kernel_rate():
    """At head dim 128 and 64k keys the kernel runs within 0.2% of its gpu.attention figure."""
    s, d, heads = 65536, 128, 8
    t = flash_attention_time_s(s, s, d, heads, causal=False, cluster=A100)
    tflops = 4 * s * s * d * heads / t / 1e12
    assert tflops == pytest.approx(0.63 * 312, rel=2e-3)


def test_causal_skips_the_masked_half():
    """Half the FLOPs; a little more than half the time (each query attends to fewer keys)."""
    full = flash_attention_time_s(4096, 4096, 128, 32, causal=False, cluster=A100)
    causal = flash_attention_time_s(4096, 4096, 128, 32, causal=True, cluster=A100)
    assert 0.5 < causal / full < 0.55


def test_backward_is_two_and_a_half_forwards():
    fwd = flash_attention_time_s(2048, 2048, 64, 16, causal=True, cluster=H100)
    bwd = flash_attention_time_s(2048, 2048, 64, 16, causal=True, cluster=H100, backward=True)
    assert bwd / fwd == pytest.approx(FLASH_BACKWARD_FLOPS_RATIO)


@given(st.sampled_from([32, 64, 80, 128, 256]), st.integers(16, 1 << 17), st.booleans())
def test_efficiency_bounded_and_grows_with_head_dim_and_length(head_dim, keys, causal):
    eff = flash_attention_efficiency(head_dim, keys, A100)
    assert 0 < eff <= 1
    assert flash_attention_efficiency(head_dim * 2, keys, A100) >= eff
    assert flash_attention_efficiency(head_dim, keys * 2, A100) >= eff


def test_the_stacks_kernel_decides_the_rate():
    """cuDNN (FA3-class) on H100 is faster than FlashAttention-2, which beats FlashAttention-1."""
    times = {k: flash_attention_time_s(8192, 8192, 128, 32, True, H100.with_overrides({"efficiency.attention_kernel": k}))
             for k in ("flash1", "flash2", "cudnn")}
    assert times["cudnn"] < times["flash2"] < times["flash1"]
    with pytest.raises(HardwareProfileError, match="attention_kernel must be one of flash1, flash2, cudnn"):
        H100.with_overrides({"efficiency.attention_kernel": "flash9"})
    with pytest.raises(PerfModelError):
        flash_attention_time_s(0, 8, 8, 1, True, H100)


def test_fp16_attention_runs_at_the_fp16_peak_and_plans_on_v100():
    """A GPU without a bf16 peak (V100) times an fp16 plan's fused attention at its fp16 peak."""
    half_fp16 = A100.with_overrides({"gpu.peak_tflops.fp16": 156.0})  # fp16 at half the bf16 peak
    assert flash_attention_time_s(4096, 4096, 128, 8, True, half_fp16, dtype="fp16") == pytest.approx(
        2 * flash_attention_time_s(4096, 4096, 128, 8, True, half_fp16))
    v100 = load_cluster("v100x8")
    assert flash_attention_time_s(4096, 4096, 128, 8, True, v100, dtype="fp16") > 0
    with pytest.raises(PerfModelError, match="bf16 or fp16"):
        flash_attention_time_s(4096, 4096, 128, 8, True, A100, dtype="fp8")
    profile = _tiny("sdpa")
    plan = Plan(model="tiny", hw="v100x8", nodes=1, dp=8, micro_batch=1, global_batch=8, dtype="fp16",
                stages=even_stages(profile.num_blocks, 1))
    assert estimate(plan, profile, v100).step_time_s > 0


def test_flash_is_faster_than_the_same_gemms_on_the_gemm_curve():
    """The old costing (two GEMMs at the min-dimension curve, the whole s x s square) was ~3x slower."""
    s, d, heads = 8192, 128, 32
    gemms = 2 * matmul_time_s(s, s, d, A100, batch=heads)
    assert flash_attention_time_s(s, s, d, heads, True, A100) < gemms / 2.5


def _tiny(attention):
    return profile_model("examples/gpt.py:tiny", {"attention": attention, "seq_len": 64}, cache=False)


def test_profiler_tags_sdpa_as_a_causal_flash_call_and_explicit_attention_as_gemms():
    flash = [m for m in _tiny("sdpa").blocks[0].matmuls if m.kernel != "gemm"]
    assert [(m.m, m.n, m.kernel, m.count) for m in flash] == [(64, 64, "flash_causal", 1)]
    assert flash[0].flops == 4 * 64 * 64 * flash[0].k * flash[0].batch  # q k^T and p v
    assert all(m.kernel == "gemm" for m in _tiny("explicit").blocks[0].matmuls)


def test_a_fused_attention_call_with_a_smaller_v_head_counts_both_gemms():
    """MLA runs q k^T over a larger head dim than p v: the record's head dim is their mean, so
    its FLOPs are what torch's flop counter gives the call."""
    import torch
    import torch.nn.functional as F
    from smplan.planner.profiler_trace import _gemm_shapes
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = torch.randn(1, 2, 64, 48), torch.randn(1, 2, 64, 48), torch.randn(1, 2, 64, 16)
    (m, n, d, heads), = _gemm_shapes(torch.ops.aten._scaled_dot_product_flash_attention, (q, k, v), None)
    assert (m, n, d, heads) == (64, 64, 32, 2)
    with FlopCounterMode(display=False) as counter:
        F.scaled_dot_product_attention(q, k, v)
    assert counter.get_total_flops() == 4 * m * n * d * heads


def test_sdpa_model_steps_faster_than_explicit_attention_at_long_sequences():
    """Through the public estimate: the fused kernel's time replaces the s x s GEMMs and softmax traffic."""
    times = {}
    for attention in ("explicit", "sdpa"):
        profile = profile_model("examples/gpt.py:llama3_8b", {"attention": attention, "seq_len": 8192, "layers": 2},
                                cache=False)
        plan = Plan(model="examples/gpt.py:llama3_8b", hw="h100x8", nodes=1, dp=8, tp=1, pp=1, micro_batch=1,
                    global_batch=8, stages=even_stages(2, 1, "full"))
        times[attention] = estimate(plan, profile, H100).step_time_s
    assert times["sdpa"] < 0.85 * times["explicit"]  # 0.81 measured with 2 blocks (the head is a large share)


def test_zero3_gathered_parameters_capped_by_max_live_params():
    """DeepSpeed keeps at most stage3_max_live_parameters gathered; FSDP the unit in use and the next block, and
    the one in use's unsharded gradients (bf16: the a100x8 default stack reduces in the weights' dtype)."""
    profile = profile_model("examples/gpt.py:gpt3_175b", {"layers": 2}, cache=False)

    def buffers(cluster):
        return chunk_memory(profile, cluster, tp=1, dp=64, sp=False, zero=3, micro_batch=1, flight=1.0,
                            recompute="full", first=True, last=False, device_first_chunk=True, dtype="bf16").buffers

    fsdp = buffers(A100)
    capped = buffers(A100.with_overrides({"efficiency.zero3_max_live_params": 1e9}))
    block = profile.blocks[0].params  # 12 h^2 ~ 1.8e9 for h = 12288
    assert fsdp - capped == pytest.approx((2 * block - 1e9) * 2 + (block - 1e9) * 2, rel=1e-6)


def test_fp8_linear_pays_its_cast_traffic():
    """An FP8 GEMM's forward adds reading its bf16 input and writing the fp8 copy and its transpose
    (4 bytes per element); its backward the same for the output gradient."""
    from smplan.hwprofiles import GroupSpan
    from smplan.hwprofiles.perf import memory_bound_time_s
    from smplan.planner.model_profile import BlockProfile, MatmulShape
    from smplan.planner.pass_model import FP8_CAST_BYTES_PER_ELEMENT, pass_times

    m, n, k = 8192, 4096, 4096
    part = BlockProfile(name="linear", kind="block", params=n * k, forward_flops_per_sample=2.0 * m * n * k,
                        saved_bytes_tp_sharded_per_sample=0.0, saved_bytes_replicated_per_sample=0.0,
                        saved_bytes_attention_core_per_sample=0.0, output_bytes_per_sample=0.0,
                        matmuls=(MatmulShape(m, n, k),))
    one = GroupSpan(size=1, ranks_per_node=1)
    cluster = H100.with_overrides({"efficiency.host_overhead_us_per_layer": 0.0})
    fp8 = pass_times(part, one, False, 1, cluster, "fp8")
    gemm = matmul_time_s(m, n, k, cluster, dtype="fp8")
    assert fp8.forward_s == pytest.approx(gemm + memory_bound_time_s(m * k * FP8_CAST_BYTES_PER_ELEMENT, cluster))
    assert fp8.backward_s == pytest.approx(2 * gemm + memory_bound_time_s(m * n * FP8_CAST_BYTES_PER_ELEMENT, cluster))
    bf16 = pass_times(part, one, False, 1, cluster, "bf16")
    assert bf16.forward_s == pytest.approx(matmul_time_s(m, n, k, cluster, dtype="bf16"))


def _linear_part(kind: str, m: int = 8192, n: int = 4096, k: int = 4096, tp_collectives: tuple = ()):
    from smplan.planner.model_profile import BlockProfile, MatmulShape

    return BlockProfile(name=kind, kind=kind, params=n * k, forward_flops_per_sample=2.0 * m * n * k,
                        saved_bytes_tp_sharded_per_sample=0.0, saved_bytes_replicated_per_sample=0.0,
                        saved_bytes_attention_core_per_sample=0.0, output_bytes_per_sample=0.0,
                        matmuls=(MatmulShape(m, n, k, tp_dim="n"),), tp_collectives=tp_collectives)


def test_fp8_keeps_the_output_head_in_bf16():
    """FP8 recipes quantise the blocks' linears only (Megatron-Core's output_layer is not a TE
    module; torchtitan filters "output"): a head part's GEMM runs at bf16, without casts."""
    from smplan.hwprofiles import GroupSpan
    from smplan.planner.pass_model import pass_times

    one = GroupSpan(size=1, ranks_per_node=1)
    cluster = H100.with_overrides({"efficiency.host_overhead_us_per_layer": 0.0})
    head, block = _linear_part("post"), _linear_part("block")
    assert pass_times(head, one, False, 1, cluster, "fp8").forward_s == pytest.approx(
        pass_times(head, one, False, 1, cluster, "bf16").forward_s)
    assert pass_times(block, one, False, 1, cluster, "fp8").forward_s < pass_times(head, one, False, 1, cluster,
                                                                                   "fp8").forward_s


def test_tp_comm_overlap_hides_sequence_parallel_collectives_under_the_linears():
    """Transformer Engine userbuffers (stack key tp_comm_overlap): under sequence parallelism the
    TP all-gather / reduce-scatter hide behind the linear GEMMs, up to their time; without SP
    (no userbuffers) they still wait."""
    from smplan.hwprofiles import GroupSpan
    from smplan.planner.model_profile import TPCollective
    from smplan.planner.pass_model import pass_times

    tp = GroupSpan(size=8, ranks_per_node=8)
    coll = (TPCollective(kind="all_reduce", phase="forward", bytes_per_sample=8192 * 4096 * 2.0),
            TPCollective(kind="all_reduce", phase="backward", bytes_per_sample=8192 * 4096 * 2.0))
    part = _linear_part("block", tp_collectives=coll)
    base = H100.with_overrides({"efficiency.host_overhead_us_per_layer": 0.0, "efficiency.tp_comm_overlap": 0.0})
    for sp in (True, False):
        waits = pass_times(part, tp, sp, 1, base, "bf16")
        for o in (0.5, 1.0):
            hidden = pass_times(part, tp, sp, 1, base.with_overrides({"efficiency.tp_comm_overlap": o}), "bf16")
            if not sp:
                assert hidden == waits
                continue
            gemm = matmul_time_s(8192, 4096 // 8, 4096, base)
            assert hidden.tp_forward_s == pytest.approx(waits.tp_forward_s - min(o * waits.tp_forward_s, gemm))
            assert hidden.forward_s == pytest.approx(waits.forward_s - (waits.tp_forward_s - hidden.tp_forward_s))
            assert hidden.tp_backward_s == pytest.approx(waits.tp_backward_s - min(o * waits.tp_backward_s, 2 * gemm))
    # the output head is not a Transformer Engine module: its collectives keep waiting
    head = _linear_part("post", tp_collectives=coll)
    on = base.with_overrides({"efficiency.tp_comm_overlap": 1.0})
    assert pass_times(head, tp, True, 1, on, "bf16") == pass_times(head, tp, True, 1, base, "bf16")
    assert load_cluster("h100x8").efficiency.tp_comm_overlap == 1.0  # megatron-core: TE userbuffers on
    assert load_cluster("h100x8", stack="torchtitan").efficiency.tp_comm_overlap == 0.0  # async TP is opt-in
