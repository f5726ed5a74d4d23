"""Gradient compression (plan key grad_compress): parsing, the plan forms, and the pricing."""

from __future__ import annotations

import json

import pytest
from smplan.hwprofiles import load_cluster
from smplan.planner import grad_compress as gc
from smplan.planner.model_profile import BlockProfile, MatmulShape
from smplan.planner.plan import Plan, PlanError, parse_inline


def _part(matmuls, params):
    return BlockProfile(name="b", kind="block", params=params, forward_flops_per_sample=1.0,
                        saved_bytes_tp_sharded_per_sample=0.0, saved_bytes_replicated_per_sample=0.0,
                        saved_bytes_attention_core_per_sample=0.0, output_bytes_per_sample=0.0,
                        matmuls=tuple(matmuls))


@pytest.mark.parametrize("text,kind,rank", [("none", "none", 0), ("bf16", "bf16", 0), ("powersgd:4", "powersgd", 4),
                                            (" powersgd:1 ", "powersgd", 1)])
def test_parse(text, kind, rank):
    spec = gc.parse(text)
    assert (spec.kind, spec.rank) == (kind, rank)
    assert gc.parse(str(spec)) == spec


@pytest.mark.parametrize("text", ["powersgd", "powersgd:0", "powersgd:x", "fp8", "bf16:2", "", "powersgd:99999"])
def test_parse_refuses(text):
    with pytest.raises(ValueError, match="powersgd"):
        gc.parse(text)


def test_powersgd_sends_m_plus_n_times_r_per_matrix_vectors_whole():
    # two 128 x 64 column-parallel weights (count 2) and 128 bias elements
    part = _part([MatmulShape(m=16, n=128, k=64, count=2, tp_dim="n"),
                  MatmulShape(m=16, n=16, k=16, batch=8, tp_dim="batch")],  # attention: no weight
                 params=2 * 128 * 64 + 128)
    spec = gc.parse("powersgd:4")
    assert gc.sent_elements(part, part.params, 1, spec) == 2 * (128 + 64) * 4 + 128
    # tp=2 halves n (column-parallel); the rank's local params are what the caller passes
    local = 2 * 64 * 64 + 128
    assert gc.sent_elements(part, local, 2, spec) == 2 * (64 + 64) * 4 + 128
    assert gc.sent_elements(part, part.params, 1, gc.parse("none")) == part.params
    assert gc.sent_elements(part, part.params, 1, gc.parse("bf16")) == part.params


def test_powersgd_leaves_matrices_below_torchs_min_compression_rate():
    # 8 x 8 at rank 4: 64 < 2 * (8 + 8) * 4 = 128, so torch's hook sends it whole
    part = _part([MatmulShape(m=4, n=8, k=8)], params=64)
    assert gc.sent_elements(part, 64, 1, gc.parse("powersgd:4")) == 64
    assert gc.compress_time_s(part, 64, 1, gc.parse("powersgd:4"), load_cluster("a100x8"), "bf16") == 0.0


def test_compress_time_counts_three_gemms_per_matrix():
    cluster = load_cluster("a100x8")
    part = _part([MatmulShape(m=16, n=4096, k=4096)], params=4096 * 4096)
    one = gc.compress_time_s(part, part.params, 1, gc.parse("powersgd:4"), cluster, "bf16")
    assert one > 0
    # 3 GEMMs of 2*m*n*R FLOPs each can be no faster than the bf16 peak
    assert one >= 3 * 2 * 4096 * 4096 * 4 / (cluster.gpu.peak_tflops.bf16 * 1e12)
    assert gc.compress_time_s(part, part.params, 1, gc.parse("bf16"), cluster, "bf16") == 0.0


def test_bf16_halves_only_wider_gradients():
    assert gc.grad_bytes(4.0, gc.parse("bf16")) == 2.0
    assert gc.grad_bytes(2.0, gc.parse("bf16")) == 2.0
    assert gc.grad_bytes(4.0, gc.parse("powersgd:2")) == 4.0


def _plan(**kw):
    return Plan(model="examples/gpt.py:tiny", hw="a100x8", nodes=1, dp=8, global_batch=8, **kw)


def test_plan_forms_and_old_files(tmp_path):
    assert parse_inline("dp=2,grad_compress=powersgd:4") == {"dp": 2, "grad_compress": "powersgd:4"}
    plan = _plan(grad_compress="powersgd:4")
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path).grad_compress == "powersgd:4"
    data = json.loads(path.read_text())
    del data["grad_compress"]  # a file written before the key existed
    path.write_text(json.dumps(data))
    assert Plan.load(path).grad_compress == "none"
    data["grad_compress"] = "powersgd"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match=r'grad_compress: got "powersgd" \(text\), expected "none", "bf16" or "powersgd:R"'):
        Plan.load(path)


def test_powersgd_needs_zero_0():
    with pytest.raises(PlanError, match="needs zero=0"):
        _plan(grad_compress="powersgd:4", zero=1)
    assert _plan(grad_compress="bf16", zero=3).grad_compress == "bf16"


@pytest.mark.parametrize("compress", ["bf16", "powersgd:4", "powersgd:64"])
def test_the_optimizer_updates_every_parameter_whatever_was_sent(compress):
    """Compression shrinks what the all-reduce sends, not what AdamW updates: at dp=1 (nothing
    sent) every choice prices the same step."""
    from smplan.planner import estimate, profile_model
    from smplan.planner.plan import plan_from_inline

    profile = profile_model("examples/gpt.py:tiny")
    cluster = load_cluster("a100x8")

    def step(gc_text: str):
        keys = parse_inline(f"dp=1,mbs=1,gbs=4,grad_compress={gc_text}")
        plan = plan_from_inline(keys, model="examples/gpt.py:tiny", hw="a100x8", nodes=1, gpus_per_node=8,
                                num_blocks=profile.num_blocks)
        return estimate(plan, profile, cluster).breakdown["optimizer"]

    assert step(compress) == pytest.approx(step("none"))
