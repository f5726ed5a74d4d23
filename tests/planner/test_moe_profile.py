"""Profiling examples/moe.py: published parameter counts, params_active, and the CLI."""

from __future__ import annotations

import json
import textwrap

import pytest
from smplan.planner import ModelProfile, profile_model

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

MOE = str(EXAMPLES / "moe.py")

# (preset, total, active) as published; active counts embedding and output head alike.
PUBLISHED = [
    ("mixtral_8x7b", 46.7e9, 12.9e9),  # Jiang et al. 2024 (Mixtral of Experts), section 2.1
    ("qwen3_235b_a22b", 235e9, 22e9),  # Qwen3 technical report (2025), Table 2
    ("qwen3_30b_a3b", 30.5e9, 3.3e9),  # same table
    ("deepseek_v3", 671e9, 37e9),  # DeepSeek-V3 technical report (2024), abstract; main model, no MTP
]


def _profile(preset: str) -> ModelProfile:
    return profile_model(f"{MOE}:{preset}", seq_len=256, cache=False)  # parameters do not depend on seq_len


@pytest.mark.parametrize("preset,total,active", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameter_counts_match_the_published_ones(preset, total, active):
    p = _profile(preset)
    assert p.params == pytest.approx(total, rel=0.02)
    assert p.params_active == pytest.approx(active, rel=0.03)


def test_gpt_oss_counts_as_openai_does():
    # gpt-oss model card (OpenAI 2025), Table 1: 116.83B total, 5.13B active, the active
    # figure without the embedding table (a lookup) but with the unembedding.
    p = _profile("gpt_oss_120b")
    assert p.params == pytest.approx(116.83e9, rel=0.02)
    embedding = sum(part.params for part in p.pre if part.name == "embed")
    assert p.params_active - embedding == pytest.approx(5.13e9, rel=0.03)


def test_dense_parts_count_in_full_and_experts_by_top_k():
    p = profile_model(f"{MOE}:tiny", cache=False)
    block = p.blocks[0]
    experts = 4 * 3 * 32 * 32  # experts x (w1, w2, w3) x hidden x moe_ffn
    assert block.params - block.params_active == experts - experts * 2 // 4
    assert all(part.params_active == part.params for part in p.pre + p.post)
    assert p.params_active == sum(part.params_active for part in p.parts)
    # meta routing is balanced: each of 4 experts gets 16 tokens * top_k 2 / 4 = 8
    assert any(m.batch == 4 and m.m == 8 and m.k == 32 and m.n == 32 for m in block.matmuls)
    gpt = profile_model(str(EXAMPLES / "gpt.py"), cache=False)
    assert gpt.params_active == gpt.params
    again = ModelProfile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again.params_active == p.params_active


def test_the_rule_needs_only_num_experts_and_top_k(tmp_path):
    path = tmp_path / "hf_style.py"
    path.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class SparseBlock(nn.Module):  # a Hugging Face style bank: a ModuleList of expert MLPs
            def __init__(self):
                super().__init__()
                self.num_experts, self.top_k = 8, 2
                self.experts = nn.ModuleList(nn.Linear(16, 16, bias=False) for _ in range(8))

            def forward(self, x):
                return sum(e(x) for e in self.experts[:2])

        def model():
            return nn.Sequential(nn.Linear(16, 16, bias=False), SparseBlock())

        def batch(micro_batch_size, model=None):
            return torch.randn(micro_batch_size, 16), torch.randn(micro_batch_size, 16)
    """))
    p = profile_model(str(path), cache=False)
    assert (p.params, p.params_active) == (9 * 256, 256 + 2 * 256)


def test_profile_cli_prints_active_params(cli_runner):
    result = cli_runner.invoke(cli, ["profile", f"{MOE}:tiny"])
    assert result.exit_code == 0, result.output
    assert "params active per token:   47,776" in result.output and "dense" in result.output
    data = json.loads(cli_runner.invoke(cli, ["profile", f"{MOE}:tiny", "--json"]).stdout)
    assert data["params_active"] == 47776 and data["params"] == 66208
    dense = cli_runner.invoke(cli, ["profile", str(EXAMPLES / "gpt.py")])
    assert dense.exit_code == 0 and "params active" not in dense.output


def test_plan_cli_plans_tiny(cli_runner):
    result = cli_runner.invoke(cli, ["plan", f"{MOE}:tiny", "--hw", "a100x8", "--json"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)["plans"]  # progress lines go to stderr
    assert plans and all(p["dp"] * p["tp"] * p["pp"] == 8 and p["step_time_s"] > 0 for p in plans)
    assert {p["tp"] for p in plans} <= {1, 2}  # tp divides tiny's kv_heads=2
    assert all(p["stage_blocks"][-1][-1] == 3 for p in plans)  # the 3 MoE blocks; the dense one is pre
    text = cli_runner.invoke(cli, ["plan", f"{MOE}:tiny", "--hw", "a100x8"])
    assert text.exit_code == 0 and "searched" in text.output


def test_expert_fields_of_a_moe_block():
    """tiny: 16 tokens, hidden 32, 4 experts, top_k 2, expert width 32, one shared expert."""
    profile = profile_model(f"{MOE}:tiny", cache=False)
    block = profile.blocks[0]
    tokens, hidden, top_k, ffn = 16, 32, 2, 32
    assert (profile.num_experts, block.num_experts, block.top_k) == (4, 4, 2)
    assert block.params_expert == 4 * 3 * hidden * ffn
    # expert FLOPs are counted by top_k: each token runs top_k SwiGLU experts (3 GEMMs)
    assert block.expert_flops_per_sample == tokens * top_k * 3 * 2 * hidden * ffn
    assert block.router_flops_per_sample == 2 * tokens * hidden * 4
    # dispatch buffer: tokens x hidden x top_k x 2 bytes (bf16), each way
    assert block.all_to_all_bytes_per_sample == tokens * hidden * top_k * 2
    assert sum(m.flops for m in block.matmuls if m.tp_dim == "expert") == block.expert_flops_per_sample
    assert block.attention_kv_bytes_per_sample > 0
    assert all(p.num_experts == 0 and p.params_expert == 0 for p in profile.pre + profile.post)


def test_dense_models_have_no_expert_fields():
    profile = profile_model(str(EXAMPLES / "gpt.py") + ":tiny", cache=False)
    assert profile.num_experts == 0 and profile.blocks[0].all_to_all_bytes_per_sample == 0


def test_profile_prints_the_expert_figures(cli_runner):
    result = cli_runner.invoke(cli, ["profile", f"{MOE}:tiny", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert "4 routed, top_k=2" in result.output and "all-to-all MiB/sample" in result.output
    assert "router GFLOPs/sample" in result.output


def test_the_dense_layers_before_the_moe_blocks_are_tensor_parallel():
    """DeepSeek-V3's first three layers were whole on every tp rank (an audit's finding): they
    shard as a block does, with a block's collectives per layer."""
    profile = profile_model(f"{MOE}:tiny", args={"dense_layers": 2, "layers": 4})
    dense = next(p for p in profile.pre if p.name == "dense")
    block = profile.blocks[0]
    assert dense.params_tp_sharded and dense.params_per_gpu(2) < 0.6 * dense.params
    def count(part):
        return sum(c.phase == "forward" for c in part.tp_collectives)

    assert count(dense) == 2 * count(block) > 0
