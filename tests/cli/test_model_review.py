"""Findings of the own-models review: simulate refuses what the model cannot run, a model file
imports its neighbours, headers show the sequence, --json carries the notes."""

import json

import pytest

from smplan.cli.main import cli
from tests.conftest import ROOT

INPUTS = str(ROOT / "tests" / "model" / "inputs_models.py")


@pytest.mark.parametrize(("ref", "plan", "said"), [
    (f"{INPUTS}:tied", "pp=2,dp=4,mbs=1,gbs=8", "pp=2: "),  # a weight tied across pipeline pieces
    (INPUTS, "cp=2,dp=4,mbs=1,gbs=8", "cp=2: inputs_models.py defines no context_parallel"),
])
def test_simulate_refuses_a_layout_the_model_cannot_run(cli_runner, ref, plan, said):
    result = cli_runner.invoke(cli, ["simulate", ref, "--hw", "a100x8", "--plan", plan])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: " + said) and line.endswith("=1"), result.output
    assert "Traceback" not in result.output


def _notes(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("note: ")]


def test_plan_header_shows_the_sequence_and_json_lists_the_notes(cli_runner):
    args = ["plan", "examples/gpt.py:tiny", "--hw", "a100x8", "--global-batch", "7", "--top", "1"]
    text = cli_runner.invoke(cli, args)
    assert text.exit_code == 0, text.output
    header = next(line for line in text.output.splitlines() if line.startswith("examples/gpt.py:tiny on "))
    data = json.loads(cli_runner.invoke(cli, [*args, "--json"]).stdout)
    seq_len = data["plans"][0]["plan"]["seq_len"]
    assert f"global batch 7, {seq_len:,}-token sequences ({7 * seq_len:,} tokens per step)" in header
    assert any(n.startswith("note: global batch 7 allows dp of at most 1") for n in data["notes"])
    assert data["notes"] == _notes(text.stdout)  # the lines the text prints, in its order


def test_an_hf_context_capped_by_default_is_said_in_plan_and_simulate(cli_runner, tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             vocab_size=128, intermediate_size=128, max_position_embeddings=8192
                             ).save_pretrained(tmp_path / "long")
    ref = f"hf:{tmp_path / 'long'}"
    said = f"note: {ref}'s config states a 8,192-token context; these are 4,096-token sequences"
    planned = cli_runner.invoke(cli, ["plan", ref, "--hw", "a100x8", "--top", "1"])
    assert planned.exit_code == 0, planned.output
    assert "4,096-token sequences (32,768 tokens per step)" in planned.output
    assert any(n.startswith(said) for n in _notes(planned.stdout))
    simulate = ["simulate", ref, "--hw", "a100x8", "--plan", "dp=8,mbs=1,gbs=8"]
    simulated = cli_runner.invoke(cli, simulate)
    assert simulated.exit_code == 0, simulated.output
    assert "1 micro-batch of 1, 4,096-token sequences (32,768 tokens per step)" in simulated.output
    data = json.loads(cli_runner.invoke(cli, [*simulate, "--json"]).stdout)
    assert any(n.startswith(said) for n in data["notes"]), data["notes"]
    asked = cli_runner.invoke(cli, ["plan", ref, "--hw", "a100x8", "--top", "1", "--seq-len", "4096"])
    assert asked.exit_code == 0 and "-token context" not in asked.output  # asked for: nothing to say


def test_explain_says_what_the_best_plan_without_cp_costs(cli_runner):
    # 64k-token sequences of the tiny GPT in 24 GiB: cp=8 runs whole, cp=1 must recompute
    args = ["plan", "examples/gpt.py:tiny", "--hw", "h100x8", "--hw-set", "gpu.memory_gib=24", "--seq-len", "65536",
            "--global-batch", "8", "--top", "2", "--json"]
    data = json.loads(cli_runner.invoke(cli, [*args, "--explain"]).stdout)
    best = data["plans"][0]
    assert best["cp"] > 1
    line = data["explain"][0]
    alone = json.loads(cli_runner.invoke(cli, [*args, "--fix", "cp=1"]).stdout)["plans"][0]
    slower = 100 * (alone["step_time_s"] / best["step_time_s"] - 1)
    assert line.startswith(f"without cp: {slower:+.1f}% step time (") and " cp=" not in line, line
    assert line.endswith(f": {alone['step_time_s']:.3f} s vs {best['step_time_s']:.3f} s)"), line
    # in 4.5 GiB only cp fits: the line says so, without the change a search held at cp=1 would make
    squeezed = [a if a != "gpu.memory_gib=24" else "gpu.memory_gib=4.5" for a in args]
    line = json.loads(cli_runner.invoke(cli, [*squeezed, "--explain"]).stdout)["explain"][0]
    assert line.startswith("without cp: no plan fits in 4.5 GiB per GPU on 8 GPUs") and ";" not in line, line


def test_a_stage_recomputing_no_block_is_written_as_none(cli_runner, tmp_path):
    from smplan.planner.plan import Plan

    out = tmp_path / "plan.json"
    assert cli_runner.invoke(cli, ["plan", "examples/gpt.py:tiny", "--hw", "a100x8", "--top", "1", "-o", str(out)]
                             ).exit_code == 0
    data = json.loads(out.read_text())
    # as files written before said it: a kind, and no block recomputed with it
    data["stages"] = [{**stage, "recompute": "selective", "recompute_blocks": 0} for stage in data["stages"]]
    data["recompute"] = "none"
    out.write_text(json.dumps(data))
    assert cli_runner.invoke(cli, ["simulate", str(out)]).exit_code == 0  # an old file still reads
    stages = Plan.load(out).to_dict()["stages"]
    assert [(s["recompute"], s["recompute_blocks"]) for s in stages] == [("none", None)] * len(stages)


@pytest.mark.parametrize(("family", "row", "extra"), [
    ("GemmaConfig", "| Gemma |", {"head_dim": 16}),
    ("Gemma2Config", "| Gemma2 |", {"head_dim": 16}),
    ("Phi3Config", "| Phi-3 |", {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 1}),  # ids within the vocab
])
def test_readme_hf_rows_say_what_the_profile_finds(tmp_path, family, row, extra):
    """README's hf: table rows for Gemma, Gemma2 and Phi-3 against a tiny config's profile."""
    transformers = pytest.importorskip("transformers")
    from smplan.planner import load_model_file, profile_model

    getattr(transformers, family)(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  vocab_size=128, intermediate_size=128, max_position_embeddings=32,
                                  **extra).save_pretrained(tmp_path / family)
    ref = f"hf:{tmp_path / family}"
    p = profile_model(ref, cache=False)
    assert p.params == sum(t.numel() for t in load_model_file(ref).build({}, device="meta").parameters())
    line = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith(row))
    _, _, profiled, dp, tp, sp, pp, _ = (cell.strip() for cell in line.split("|"))
    assert tp.startswith("yes") == (p.has_tp_plan and "tp" not in p.unsupported) and pp.startswith("no")
    assert ("unfused" in profiled) == (p.blocks[0].saved_bytes_attention_core_per_sample > 0)  # s x s scores kept
    assert "pp" in p.unsupported and dp == "yes"
    assert sp.startswith("yes") == bool(p.supports_sequence_parallel)  # Gemma2's sandwich norms: sp not offered
    if "tp" not in p.unsupported:  # sp left out with the reason plan --explain prints (Gemma2)
        assert ("sp" in p.unsupported) == (not p.supports_sequence_parallel)


def test_sp_on_gemma2_is_refused_with_its_reason(cli_runner, tmp_path):
    """The profile recorded why sp is left out (sandwich norms); --fix sp=1 says that, in one line."""
    transformers = pytest.importorskip("transformers")
    transformers.Gemma2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=16, vocab_size=128, intermediate_size=128,
                              max_position_embeddings=32).save_pretrained(tmp_path / "g2")
    result = cli_runner.invoke(cli, ["plan", f"hf:{tmp_path / 'g2'}", "--hw", "h100x8", "--fix", "tp=2,sp=1"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]  # after the profiling line
    assert len(errors) == 1 and "sequence parallelism: " in errors[0] and "pre_feedforward_layernorm" in errors[0]
    assert "Traceback" not in result.output
