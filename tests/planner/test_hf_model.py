"""Hugging Face models as input (`hf:DIR` and model files returning a PreTrainedModel):
built from a config.json only, profiled on the meta device with exact parameter counts,
GQA attention costed as the fused kernel, pp turned off with its reason, planned and
simulated. Nothing is downloaded: every config is written here."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

transformers = pytest.importorskip("transformers")

from smplan.planner import ModelFileError, load_model_file, profile_model  # noqa: E402
from smplan.planner.hf_model import TPUnsupported  # noqa: E402
from smplan.planner.model_file import file_digest  # noqa: E402
from smplan.planner.model_profile import MatmulShape  # noqa: E402

from tests.conftest import ROOT  # noqa: E402

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            intermediate_size=128, max_position_embeddings=32)  # seq_len 32 != hidden 64 (profiler_trace._category)


def write_config(folder, config_cls=None, **overrides):
    folder.mkdir(parents=True, exist_ok=True)
    (config_cls or transformers.LlamaConfig)(**{**TINY, **overrides}).save_pretrained(folder)
    return f"hf:{folder}"


@pytest.fixture
def tiny(tmp_path):
    return write_config(tmp_path / "tiny")


def _meta_params(ref, args=None):
    return sum(p.numel() for p in load_model_file(ref).build(args or {}, device="meta").parameters())


def test_profile_has_exact_params_and_pp_off_with_reason(tiny):
    p = profile_model(tiny, cache=False)
    assert p.params == _meta_params(tiny) == 90432
    assert p.num_blocks == 2 and p.seq_len == 32 and p.num_heads == 2  # kv heads: what tp must divide
    assert p.has_tp_plan and p.supports_sequence_parallel and "tp" not in p.unsupported
    assert "does not skip the layers another stage holds" in p.unsupported["pp"]
    assert "LlamaForCausalLM" in p.unsupported["pp"]
    # the config's TP plan: q/k/v, gate/up column-parallel, o/down row-parallel; vocab-parallel head
    block = p.blocks[0]
    attention, mlp = 2 * 64 * 64 + 2 * 64 * 32, 3 * 64 * 128
    assert block.params_tp_sharded == attention + mlp == block.params - 2 * 64  # all but the two norms
    head = next(b for b in p.post if b.name == "lm_head")
    assert head.params_tp_sharded == head.params == 128 * 64


def test_gqa_attention_is_the_fused_kernel(tmp_path):
    """transformers calls SDPA with enable_gqa=True: flash attention, no s x s scores saved,
    and FLOPs as the multi-head model's (GQA changes only the k/v projections)."""
    gqa = profile_model(write_config(tmp_path / "gqa"), cache=False).blocks[0]
    mha = profile_model(write_config(tmp_path / "mha", num_key_value_heads=4), cache=False).blocks[0]
    assert gqa.saved_bytes_attention_core_per_sample == 0 == mha.saved_bytes_attention_core_per_sample
    attention = lambda b: [m for m in b.matmuls if m.batch == 4 and m.m == 32]  # noqa: E731
    # one causal flash call: queries x keys x head dim, its two GEMMs in MatmulShape.flops
    assert attention(gqa) == attention(mha) == [MatmulShape(32, 32, 16, batch=4, count=1, tp_dim="batch",
                                                            kernel="flash_causal")]
    saved = lambda b: b.saved_bytes_tp_sharded_per_sample + b.saved_bytes_replicated_per_sample  # noqa: E731
    assert saved(gqa) < saved(mha)  # k and v are kept at 2 heads, not expanded to 4
    projections = 2 * 32 * 64 * 32 * 2  # k and v: 32 tokens x 64 -> 32 (2 heads of 16) instead of 64
    assert mha.forward_flops_per_sample - gqa.forward_flops_per_sample == pytest.approx(projections)


@pytest.mark.parametrize("family", ["MistralConfig", "Qwen2Config", "Qwen3Config"])
def test_decoder_families_profile(tmp_path, family):
    extra = {"head_dim": 16} if family == "Qwen3Config" else {}
    ref = write_config(tmp_path / family, getattr(transformers, family), **extra)
    p = profile_model(ref, cache=False)
    assert p.params == _meta_params(ref) and p.num_blocks == 2 and p.has_tp_plan
    assert p.blocks[0].saved_bytes_attention_core_per_sample == 0 and "pp" in p.unsupported


def test_mixtral_experts_counted(tmp_path):
    """grouped_mm experts: FLOPs of top_k of num_experts, active parameters likewise; the
    config's packed expert TP styles have no torch equivalent: tp off with the reason."""
    moe = profile_model(write_config(tmp_path / "moe", transformers.MixtralConfig, num_local_experts=4,
                                     num_experts_per_tok=2, intermediate_size=32), cache=False)
    dense = profile_model(write_config(tmp_path / "dense", intermediate_size=64), cache=False)
    router = 2 * 32 * 64 * 4  # 32 tokens x 64 -> 4 expert scores
    assert moe.blocks[0].forward_flops_per_sample == pytest.approx(dense.blocks[0].forward_flops_per_sample + router)
    experts = 4 * 3 * 64 * 32
    assert moe.blocks[0].params == dense.blocks[0].params + 4 * 64 + experts - 3 * 64 * 64
    # the router (transformers 5: MixtralTopKRouter, beside the MixtralExperts bank) scores every
    # token: all of its 4 x 64 weights are active, only the experts count top_k / num_experts
    assert moe.blocks[0].params_active == pytest.approx(moe.blocks[0].params - experts / 2)
    assert moe.blocks[0].params_expert == experts
    assert moe.blocks[0].expert_flops_per_sample == 32 * 2 * 2 * (3 * 64 * 32)  # tokens x top_k x 2 x weights
    assert moe.blocks[0].router_flops_per_sample == pytest.approx(router)
    plan = transformers.MixtralConfig().base_model_tp_plan or {}
    if any(style == "packed_colwise" for style in plan.values()):  # transformers 5.24 ships packed expert styles
        assert "packed_colwise" in moe.unsupported["tp"]  # "; use tp=1" is the caller's (plan, execute)
    else:  # 5.25 shards attention only: tp is offered, the experts stay replicated
        assert "tp" not in moe.unsupported and moe.has_tp_plan


def test_qwen3_moe_keeps_the_tp_plan_entries_its_layers_have(tmp_path):
    """Qwen3-MoE's base_model_tp_plan also names the dense MLP of its mlp_only_layers; a sparse
    layer has none, and tp shards its attention alone (the experts stay replicated)."""
    from smplan.planner.hf_model import tp_plan

    ref = write_config(tmp_path / "qmoe", transformers.Qwen3MoeConfig, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=16, head_dim=16)
    p = profile_model(ref, cache=False)
    assert p.params == _meta_params(ref) and "tp" not in p.unsupported and p.has_tp_plan
    model = load_model_file(ref).build({}, device="meta")
    block = model.model.layers[0]
    assert sorted(tp_plan(block)) == ["self_attn.k_proj", "self_attn.o_proj", "self_attn.q_proj", "self_attn.v_proj"]
    plan = dict(model.config.base_model_tp_plan)
    # an entry naming a parameter of the layer is held to the styles smplan maps, not skipped
    model.config.base_model_tp_plan = {**plan, "layers.*.mlp.experts.gate_up_proj": "packed_colwise"}
    with pytest.raises(TPUnsupported, match="packed_colwise"):
        tp_plan(block)
    model.config.base_model_tp_plan = {"layers.*.mlp.gate_proj": "colwise"}  # nothing of this layer
    with pytest.raises(TPUnsupported, match="names none of Qwen3MoeDecoderLayer's modules"):
        tp_plan(block)
    # what a model file would change is transformers' code here: the reasons say use 1 instead
    for dim in ("pp", "cp", "ep"):
        assert "an hf: model runs transformers' code as it is" in p.unsupported[dim], p.unsupported[dim]


def test_args_override_config_fields_and_seq_len(tiny):
    p = profile_model(tiny, {"num_hidden_layers": 3, "seq_len": 16}, cache=False)
    assert p.num_blocks == 3 and p.seq_len == 16 and p.params == _meta_params(tiny, {"num_hidden_layers": 3})
    assert profile_model(tiny, seq_len=24, cache=False).seq_len == 24  # --seq-len is the same argument
    with pytest.raises(ModelFileError, match="config.json has no field 'layers'"):
        profile_model(tiny, {"layers": 3}, cache=False)


def test_default_seq_len_is_the_context_capped(tmp_path):
    assert profile_model(write_config(tmp_path / "a", max_position_embeddings=48), cache=False).seq_len == 48
    assert load_model_file(write_config(tmp_path / "b", max_position_embeddings=8192)).builder_parameters()[
        "seq_len"].default == 4096


def test_cache_key_is_the_config_digest(tiny, tmp_path):
    folder, builder, digest = file_digest(tiny)
    assert builder == "hf" and folder.name == "tiny" and len(digest) == 64
    write_config(folder, num_hidden_layers=3)
    assert file_digest(tiny)[2] != digest
    assert profile_model(tiny).num_blocks == 3  # not the cached 2-layer profile


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "is not a folder"),
    (lambda d: d.mkdir(), "has no config.json"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text("{")), "not valid JSON"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text(json.dumps({"model_type": "nope"}))), "cannot read"),
])
def test_bad_folders_are_one_line(tmp_path, make, message):
    make(tmp_path / "m")
    with pytest.raises(ModelFileError, match=message) as err:
        load_model_file(f"hf:{tmp_path / 'm'}").build()
    assert "\n" not in str(err.value)


def test_hf_without_a_folder_says_it_needs_one(cli_runner):
    """`hf:` alone read as the current folder: "hf:: . has no config.json" (a review)."""
    from smplan.cli.main import cli

    result = cli_runner.invoke(cli, ["plan", "hf:", "--hw", "h100x8"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith("error: hf: needs a folder, e.g. hf:models/llama3-8b")


def test_model_file_returning_llama_profiles_the_same(tiny, tmp_path):
    """A model file whose builder returns a LlamaForCausalLM gets the HF hooks it lacks."""
    path = tmp_path / "llama_file.py"
    path.write_text(textwrap.dedent(f"""
        from transformers import LlamaConfig, LlamaForCausalLM

        def model(layers: int = 2):
            cfg = LlamaConfig(**{ {**TINY, "num_hidden_layers": 2}!r})
            cfg.num_hidden_layers = layers
            return LlamaForCausalLM(cfg)
    """))
    from_file = profile_model(str(path), cache=False)
    from_dir = profile_model(tiny, cache=False)
    assert from_file.params == from_dir.params == 90432
    assert from_file.train_flops_per_sample == from_dir.train_flops_per_sample
    assert from_file.has_tp_plan and "pp" in from_file.unsupported
    assert from_file.blocks[0].saved_bytes_per_sample == from_dir.blocks[0].saved_bytes_per_sample


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-c", "from smplan.cli.main import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_plan_and_simulate_cli(tiny, tmp_path):
    plan = tmp_path / "plan.json"
    out = _cli("plan", tiny, "--hw", "a100x8", "--global-batch", "16", "-o", str(plan))
    assert out.returncode == 0, out.stderr
    saved = json.loads(plan.read_text())
    assert saved["model"] == tiny and saved["pp"] == 1
    inline = f"dp={saved['dp']},tp={saved['tp']},pp=1,mbs={saved['micro_batch']},gbs=16"
    for args in ((str(plan),), (tiny, "--hw", "a100x8", "--plan", inline)):
        sim = _cli("simulate", *args, "--json")
        assert sim.returncode == 0, sim.stderr
        assert json.loads(sim.stdout)["step_time_s"] > 0
    refused = _cli("plan", tiny, "--hw", "a100x8", "--fix", "pp=2")
    assert refused.returncode == 2 and "an hf: model runs transformers' code as it is" in refused.stderr


LLAMA3_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 intermediate_size=14336, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192,
                 rms_norm_eps=1e-5)  # meta-llama/Meta-Llama-3-8B config.json


def test_llama3_8b_plans_within_5_percent_of_the_gpt_example(tmp_path):
    """Issue 18's target: the HF Llama-3-8B config plans within 5% of examples/gpt.py:llama3_8b
    with sdpa attention, at the same sequence length and batch."""
    folder = tmp_path / "llama3-8b"
    folder.mkdir()
    transformers.LlamaConfig(**LLAMA3_8B).save_pretrained(folder)
    common = ("--hw", "a100x8", "--global-batch", "64", "--json")
    hf = _cli("plan", f"hf:{folder}", "--arg", "seq_len=8192", *common)
    gpt = _cli("plan", f"{ROOT / 'examples' / 'gpt.py'}:llama3_8b", "--arg", "attention=sdpa", *common)
    assert hf.returncode == 0 and gpt.returncode == 0, hf.stderr + gpt.stderr
    best = lambda out: json.loads(out.stdout)["plans"][0]["step_time_s"]  # noqa: E731
    hf_step, gpt_step = best(hf), best(gpt)
    assert abs(hf_step / gpt_step - 1) < 0.05, (hf_step, gpt_step)
    assert profile_model(f"hf:{folder}", {"seq_len": 8192}).params == 8_030_261_248  # Llama 3 8B


def test_gpt2_profiles_with_tp_off_and_its_reason(tmp_path):
    """GPT-2's Conv1D projections and no base_model_tp_plan: dp/FSDP only, said honestly."""
    folder = tmp_path / "gpt2"
    transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=32, bos_token_id=0,
                            eos_token_id=0).save_pretrained(folder)
    p = profile_model(f"hf:{folder}", cache=False)
    assert p.params == _meta_params(f"hf:{folder}") and p.num_blocks == 2 and not p.has_tp_plan
    assert "no base_model_tp_plan" in p.unsupported["tp"] and "pp" in p.unsupported


def test_a_batch_longer_than_a_learned_position_table_is_refused(tmp_path):
    """GPT-2 learns 32 positions here (wpe): 64 would fail at the first forward of a real run.
    A rotary model (Llama) states 32 too but has no table, so it profiles at 64."""
    folder = tmp_path / "gpt2"
    transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=32, bos_token_id=0,
                            eos_token_id=0).save_pretrained(folder)
    with pytest.raises(ModelFileError, match=r"seq_len 64 is beyond the 32 positions its learned position table "
                                             r"\(transformer.wpe\) holds; pass --seq-len N \(or --arg seq_len=N\) "
                                             r"with N <= 32"):
        profile_model(f"hf:{folder}", seq_len=64, cache=False)
    assert profile_model(f"hf:{folder}", seq_len=32, cache=False).num_blocks == 2
    rotary = write_config(tmp_path / "llama", max_position_embeddings=32)
    assert profile_model(rotary, seq_len=64, cache=False).seq_len == 64


def test_a_negative_count_is_refused(tiny):
    with pytest.raises(ModelFileError, match=r"--arg num_hidden_layers=-1 is negative; counts and sizes are >= 0"):
        profile_model(tiny, {"num_hidden_layers": -1}, cache=False)


def test_positions_held_counts_from_position_zero():
    import torch
    from smplan.planner.hf_checks import positions_held

    assert positions_held(torch.nn.Embedding(32, 4)) == 32  # GPT-2's wpe
    opt = torch.nn.Embedding(34, 4)
    opt.offset = 2  # OPTLearnedPositionalEmbedding
    assert positions_held(opt) == 32
    assert positions_held(torch.nn.Embedding(34, 4, padding_idx=1)) == 32  # RoBERTa: from padding_idx + 1


def test_sequence_parallel_plans(tiny):
    """Under sp the norms run on sequence shards, attention/MLP inputs are gathered, the
    row-parallel outputs reduce-scattered; the embedding stays whole (positions and the mask
    come from its length), layer 0 splits it and the head gathers it."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    mf = load_model_file(tiny)
    model = mf.build({}, device="meta")
    block = mf.hook("tp_plan")(model.model.layers[0], sequence_parallel=True)
    assert isinstance(block["input_layernorm"], SequenceParallel) and isinstance(block["mlp"], PrepareModuleInput)
    assert block["self_attn.o_proj"].output_layouts == (Shard(1),) and isinstance(block["self_attn.q_proj"], ColwiseParallel)
    outer = mf.hook("tp_plan_outer")(model, sequence_parallel=True)
    assert isinstance(outer["model.layers.0"], PrepareModuleInput) and isinstance(outer["model.norm"], SequenceParallel)
    assert isinstance(outer["model.embed_tokens"], RowwiseParallel) and outer["lm_head"].input_layouts == (Shard(1),)
    assert set(mf.hook("tp_plan_outer")(model)) == {"model.embed_tokens", "lm_head"}


# -- what a new user meets: refusals in one line, exit 2 ------------------------------------

def _cli_error(cli_runner, *args) -> str:
    """`smplan ARGS` refused: exit 2, one error line, no traceback."""
    from smplan.cli.main import cli

    result = cli_runner.invoke(cli, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=128,
             max_position_embeddings=32)


def test_an_encoder_only_config_is_refused(tmp_path, cli_runner):
    """BertLMHeadModel with is_decoder=False attends both ways: next-token targets it can see."""
    transformers.BertConfig(**SMALL).save_pretrained(tmp_path / "bert")
    line = _cli_error(cli_runner, "profile", f"hf:{tmp_path / 'bert'}")
    assert "BertConfig is an encoder-only model (bidirectional attention" in line
    assert "use a decoder config (or --arg is_decoder=true) or a model file with batch()/loss()" in line
    # as a decoder it is causal: BERT's layers then mask the future (modeling_bert.BertLayer)
    assert profile_model(f"hf:{tmp_path / 'bert'}", {"is_decoder": True}, cache=False).num_blocks == 2
    # GPT-NeoX states is_decoder=False, yet its attention is causal (is_causal=True): not refused
    transformers.GPTNeoXConfig(**SMALL).save_pretrained(tmp_path / "neox")
    assert profile_model(f"hf:{tmp_path / 'neox'}", cache=False).num_blocks == 2


def test_configs_without_a_causal_lm_say_what_is_wrong(tmp_path, cli_runner):
    transformers.T5Config(d_model=64, num_layers=2, num_heads=4, d_ff=128, d_kv=16,
                          vocab_size=128).save_pretrained(tmp_path / "t5")
    line = _cli_error(cli_runner, "profile", f"hf:{tmp_path / 't5'}")
    assert "T5Config is an encoder-decoder model, which hf: does not support" in line and "--arg" not in line
    # a config transformers refuses names the --arg values only when some were given
    transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=32, bos_token_id=0,
                            eos_token_id=0).save_pretrained(tmp_path / "gpt2")
    line = _cli_error(cli_runner, "profile", f"hf:{tmp_path / 'gpt2'}", "--arg", "n_head=3")
    assert "must be divisible by num_heads" in line and "check the --arg values (n_head=3)" in line


def test_an_attention_free_model_builds_without_sdpa(tmp_path):
    """Mamba has no SDPA path (nor attention): built with transformers' default, not refused."""
    transformers.MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=128).save_pretrained(tmp_path / "mamba")
    p = profile_model(f"hf:{tmp_path / 'mamba'}", seq_len=16, cache=False)
    assert p.num_blocks == 2 and p.params == _meta_params(f"hf:{tmp_path / 'mamba'}")


@pytest.mark.parametrize("args, says", [
    (["--arg", "hidden_size=abc"], "--arg hidden_size='abc' is refused (Field 'hidden_size' expected int, got str"),
    (["--arg", "num_attention_heads=3"], "--arg num_attention_heads=3 makes an invalid LlamaConfig (The hidden size "
                                         "(64) is not a multiple of the number of attention heads (3).)"),
    (["--arg", "num_attention_heads=6", "--arg", "num_key_value_heads=4", "--arg", "hidden_size=96"],
     "num_attention_heads=6 is not a multiple of num_key_value_heads=4"),
])
@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5, reason="transformers 5's @strict config checks")
def test_bad_config_values_are_one_line(tiny, cli_runner, args, says):
    assert says in _cli_error(cli_runner, "profile", tiny, *args)


MIXTRAL = dict(hidden_size=64, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=512,
               intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)


def test_mixtral_profiles_in_fp32_as_in_bf16(tmp_path, cli_runner):
    """torch._grouped_mm's meta kernel takes bf16 only; its CPU kernel runs fp32, the dtype a
    probed CPU profile plans in. The fp32 profile counts the same parameters and FLOPs, in fp32 bytes."""
    import torch
    from smplan.hwprofiles.probe import ProbeResult, to_toml

    from smplan.cli.main import cli

    transformers.MixtralConfig(**MIXTRAL).save_pretrained(tmp_path / "mixtral")
    ref = f"hf:{tmp_path / 'mixtral'}"
    fp32, bf16 = (profile_model(ref, dtype=d, cache=False) for d in ("fp32", "bf16"))
    assert fp32.params == bf16.params == _meta_params(ref)
    assert fp32.train_flops_per_sample == bf16.train_flops_per_sample
    for a, b in zip(fp32.blocks, bf16.blocks, strict=True):
        assert (a.params_active, a.params_expert, a.expert_flops_per_sample, a.forward_flops_per_sample) == \
            (b.params_active, b.params_expert, b.expert_flops_per_sample, b.forward_flops_per_sample)
        assert a.saved_bytes_per_sample > b.saved_bytes_per_sample
    meta = torch.empty(8, 64, device="meta"), torch.empty(4, 64, 32, device="meta")
    with pytest.raises(RuntimeError, match="BF16"):  # torch's own meta kernel is back after profiling
        torch._grouped_mm(*meta, offs=torch.empty(4, dtype=torch.int32, device="meta"))
    probed = tmp_path / "probed.toml"  # as `smplan hw probe` writes it on a CPU (tests/cli/conftest.py)
    probed.write_text(to_toml(ProbeResult(device="cpu", nproc=2, peak_tflops={"fp32": 0.15, "bf16": 0.15},
                                          matmul_half_dim=40.0, memory_bandwidth_gbps=12.0, memory_gib=4.0,
                                          link_bandwidth_gbps=1.5, link_latency_us=100.0)))
    result = cli_runner.invoke(cli, ["plan", ref, "--hw", str(probed), "--global-batch", "4", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output[result.output.index("{"):])["plans"][0]["dtype"] == "fp32"


def test_a_builders_seq_len_is_the_batch_length(tmp_path):
    """A model file's PreTrainedModel knows nothing of its builder's seq_len: record_seq_len
    makes it batch()'s length (planner/model_file.py's build() calls it for such builders)."""
    from smplan.planner.hf_model import batch, record_seq_len

    model = load_model_file(write_config(tmp_path / "m", max_position_embeddings=128)).build({}, device="meta")
    assert batch(2, model)[0].shape == (2, 128)
    record_seq_len(model, 32, "ptm.py")
    assert batch(2, model)[0].shape == (2, 32)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=32,
                                                                 n_positions=16))
    with pytest.raises(ModelFileError, match="seq_len 32 is beyond the 16 positions"):
        record_seq_len(gpt2, 32, "ptm.py")


def test_tp_refused_says_use_tp_1_once(tmp_path, cli_runner):
    transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=32, bos_token_id=0,
                            eos_token_id=0).save_pretrained(tmp_path / "gpt2")
    line = _cli_error(cli_runner, "plan", f"hf:{tmp_path / 'gpt2'}", "--hw", "a100x8", "--fix", "tp=2")
    assert "GPT2Config has no base_model_tp_plan" in line and line.count("use tp=1") == 1


def test_a_new_width_gives_a_head_dim_the_file_derived(tmp_path):
    """config.json files write head_dim = hidden_size / heads (Llama's); --arg hidden_size alone
    must not keep the old head_dim (projections of the old width, silently)."""
    folder = write_config(tmp_path / "llama", transformers.LlamaConfig, hidden_size=64, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=128,
                          head_dim=16)
    wide = profile_model(folder, args={"hidden_size": 128}, cache=False)
    built = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=128, head_dim=32))
    assert wide.params == sum(p.numel() for p in built.parameters())
    kept = profile_model(folder, args={"hidden_size": 128, "head_dim": 16}, cache=False)  # the user's own head_dim
    assert kept.params < wide.params


def test_execute_refuses_ep_for_mixtral_with_the_profiles_reason(cli_runner, tmp_path):
    """The launcher's checks run transformers' forward on meta as the profiler does (fp32 grouped_mm
    too): the refusal names the expert bank, not 'did not run on the meta device'."""
    folder = write_config(tmp_path / "moe", transformers.MixtralConfig, num_local_experts=4, num_experts_per_tok=2)
    out = tmp_path / "run"
    error = _cli_error(cli_runner, "execute", "ep=2,dp=2,mbs=1,gbs=2", "--model", folder, "-o", out)
    assert "ep=2: expert bank model.layers.0.mlp.experts's forward takes" in error and not out.exists()


def test_profile_of_a_bank_ep_cannot_split_prints_no_ep_figures(cli_runner, tmp_path):
    from smplan.cli.main import cli

    folder = write_config(tmp_path / "moe", transformers.MixtralConfig, num_local_experts=4, num_experts_per_tok=2)
    result = cli_runner.invoke(cli, ["profile", folder])
    assert result.exit_code == 0, result.output
    assert "ep not offered, see below" in result.output and "ep will not be offered:" in result.output
    assert "all-to-all MiB/sample" not in result.output and "split over ep ranks" not in result.output


def test_plan_says_when_an_moe_or_long_context_run_cannot_take_ep_or_cp(cli_runner, tmp_path):
    """Without --explain, an hf: MoE model's plans kept ep=1 (and cp=1 at long sequences) silently."""
    from smplan.cli.main import cli

    folder = write_config(tmp_path / "moe", transformers.MixtralConfig, num_local_experts=4, num_experts_per_tok=2)
    short = cli_runner.invoke(cli, ["plan", folder, "--hw", "h100x8", "--json"])
    assert short.exit_code == 0, short.output
    assert f"note: {folder} cannot take ep, so every plan keeps it at 1 (--explain says why)" in json.loads(
        short.stdout)["notes"]
    long = cli_runner.invoke(cli, ["plan", folder, "--hw", "h100x8", "--seq-len", "8192"])
    assert f"note: {folder} cannot take ep and cp, so every plan keeps them at 1" in long.output, long.output
    dense = cli_runner.invoke(cli, ["plan", write_config(tmp_path / "dense"), "--hw", "h100x8"])
    assert dense.exit_code == 0 and "cannot take" not in dense.output  # a short dense run needs neither


def test_a_smaller_layer_count_takes_its_share_of_layer_types(tmp_path):
    """Gemma 2's config lists each layer's attention; --arg num_hidden_layers=N keeps the pattern
    for the first N layers instead of failing transformers' check (review: no --arg could fix it)."""
    ref = write_config(tmp_path / "g2", transformers.Gemma2Config, num_hidden_layers=4, head_dim=16)
    p = profile_model(ref, args={"num_hidden_layers": 2}, cache=False)
    assert p.num_blocks == 2
    cfg = load_model_file(ref).config({"num_hidden_layers": 3})
    assert cfg.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    # more layers than the file lists: the class's own pattern, as transformers builds it
    assert load_model_file(ref).config({"num_hidden_layers": 6}).layer_types == ["sliding_attention",
                                                                                 "full_attention"] * 3
