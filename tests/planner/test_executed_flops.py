"""Hardware TFLOP/s count the FLOPs the GPU executes: causal flash attention skips the masked half
of the scores that model FLOPs (PaLM's MFU convention) count, so at long sequences MFU can pass
the GEMM ceiling while the executed figure stays under the peak."""

from __future__ import annotations

import dataclasses

import pytest
from smplan.hwprofiles import load_cluster
from smplan.planner import Plan, estimate, even_stages, profile_model
from smplan.planner.model_profile import MatmulShape

from tests.conftest import ROOT

SEQ = 8192


@pytest.fixture(scope="module")
def long_profile():
    args = {"layers": 2, "hidden": 512, "heads": 8, "seq_len": SEQ, "vocab": 1024, "attention": "sdpa"}
    return profile_model(f"{ROOT / 'examples' / 'gpt.py'}:model", args=args, cache=False)


def test_the_masked_half_is_half_of_the_causal_kernels_flops():
    causal = MatmulShape(m=8, n=8, k=4, batch=2, kernel="flash_causal")
    gemm = MatmulShape(m=8, n=8, k=4)
    from smplan.planner.model_profile import BlockProfile

    part = BlockProfile(name="b", kind="block", params=0, forward_flops_per_sample=0.0,
                        saved_bytes_tp_sharded_per_sample=0, saved_bytes_replicated_per_sample=0,
                        saved_bytes_attention_core_per_sample=0, output_bytes_per_sample=0,
                        matmuls=(causal, gemm))
    assert part.causal_masked_flops_per_sample == pytest.approx(0.5 * causal.flops)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_hardware_flops_leave_out_the_masked_half(long_profile, recompute):
    prof = long_profile
    masked = sum(p.causal_masked_flops_per_sample for p in prof.parts)
    assert masked > 0.2 * prof.forward_flops_per_sample  # attention dominates at this length
    cluster = load_cluster("h100x8", nodes=1)
    plan = Plan(model="gpt", hw="h100x8", nodes=1, dp=8, micro_batch=1, global_batch=8, seq_len=SEQ,
                stages=even_stages(prof.num_blocks, 1, recompute))

    def executed(dtype: str) -> float:
        """FLOPs of one sample: forward + backward (3x), and the blocks' forward re-run under
        full recompute; a flash kernel (half precision) skips the masked half in each."""
        skip = dtype != "fp32"
        rerun = sum(b.forward_flops_per_sample - skip * b.causal_masked_flops_per_sample for b in prof.blocks)
        return 3 * (prof.forward_flops_per_sample - skip * masked) + (rerun if recompute == "full" else 0.0)

    for dtype in ("fp32", "bf16"):  # fp32 runs the math path: every score is computed
        f = estimate(dataclasses.replace(plan, dtype=dtype), prof, cluster)
        per_step = f.step_time_s * plan.world_size * 1e12 / plan.global_batch
        assert f.model_tflops_per_gpu * per_step == pytest.approx(3 * prof.forward_flops_per_sample, rel=1e-6)
        assert f.hardware_tflops_per_gpu * per_step == pytest.approx(executed(dtype), rel=1e-6), dtype
    assert f.hardware_tflops_per_gpu < cluster.gpu.peak_tflops.for_dtype("bf16")
