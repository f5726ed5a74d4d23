"""One capability rule: a dimension the executor would reject is never offered by the planner."""

import json
import textwrap
from pathlib import Path

import pytest
from smplan.planner import profile_model

from smplan.cli.main import cli
from tests.executor.runs import metrics, run_execute

RESNET = str(Path(__file__).with_name("resnet_like.py"))
GPT = "examples/gpt.py:tiny"


def test_the_profile_says_why_pipeline_stages_cannot_be_cut():
    why = profile_model(RESNET, cache=False).unsupported["pp"]
    assert why.startswith("ResNet's blocks are called by torch's Sequential.forward, which does not skip")
    assert profile_model(GPT, cache=False).unsupported == {}


def test_the_planner_offers_no_pipeline_and_says_why(cli_runner):
    result = cli_runner.invoke(cli, ["plan", RESNET, "--hw", "a100x8", "--top", "20", "--json"])
    assert result.exit_code == 0, result.output
    assert {p["pp"] for p in json.loads(result.stdout)["plans"]} == {1}
    explained = cli_runner.invoke(cli, ["plan", RESNET, "--hw", "a100x8", "--explain"])
    assert "pp not offered: ResNet's blocks are called by torch's Sequential.forward" in explained.stdout
    fixed = cli_runner.invoke(cli, ["plan", RESNET, "--hw", "a100x8", "--fix", "pp=2"])
    assert fixed.exit_code == 2 and "pp=2: ResNet's blocks are called by torch's Sequential.forward" in fixed.output


def test_a_file_building_a_transformers_model_names_its_forward_not_a_line_of_transformers(tmp_path):
    # it named "line 178 of deprecation.py" (transformers' decorator), a line no user edits (a review's finding)
    pytest.importorskip("transformers")
    path = tmp_path / "llama.py"
    path.write_text(textwrap.dedent("""
        from transformers import LlamaConfig, LlamaForCausalLM

        def model(layers: int = 2):
            return LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                                                num_key_value_heads=2, intermediate_size=64, vocab_size=64,
                                                max_position_embeddings=64))
    """))
    why = profile_model(str(path), cache=False).unsupported["pp"]
    assert why.startswith("LlamaForCausalLM's blocks are called by transformers' "), why
    assert "deprecation.py" not in why and "as examples/gpt.py does, to allow pp" in why


def test_execute_refuses_the_pipeline_with_the_same_reason(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["execute", "pp=2,mbs=1,gbs=2", "--model", RESNET, "-o", str(tmp_path / "r")])
    assert result.exit_code == 2 and "pp=2: ResNet's blocks are called by torch's Sequential.forward" in result.output


@pytest.mark.parametrize("plan", [pytest.param("dp=2,mbs=2,gbs=4", marks=pytest.mark.slow),  # CI time: DDP,
                                  "dp=2,zero=3,mbs=2,gbs=4"])  # beside FSDP, which wraps the torch blocks
def test_a_resnet_trains_data_parallel(tmp_path, plan):
    result = run_execute(plan, tmp_path / "run", "--steps", "3", model=RESNET, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    losses = [r["loss"] for r in metrics(tmp_path / "run")]
    assert len(losses) == 3 and all(loss == loss for loss in losses)


CONV1D = str(Path(__file__).with_name("conv1d_gpt.py"))


def test_tensor_parallelism_is_off_for_modules_torch_cannot_shard(cli_runner, tmp_path):
    why = profile_model(CONV1D, cache=False).unsupported["tp"]
    assert why.startswith("tp_plan() shards c_fc, a Conv1D")
    planned = cli_runner.invoke(cli, ["plan", CONV1D, "--hw", "a100x8", "--top", "20", "--json"])
    assert planned.exit_code == 0, planned.output
    assert {p["tp"] for p in json.loads(planned.stdout)["plans"]} == {1}
    fixed = cli_runner.invoke(cli, ["plan", CONV1D, "--hw", "a100x8", "--fix", "tp=2"])
    assert fixed.exit_code == 2 and "tp=2: tp_plan() shards c_fc, a Conv1D" in fixed.output
    run = cli_runner.invoke(cli, ["execute", "tp=2,mbs=1,gbs=2", "--model", CONV1D, "-o", str(tmp_path / "r")])
    assert run.exit_code == 2 and "tp=2: tp_plan() shards c_fc, a Conv1D" in run.output
    assert not (tmp_path / "r").exists()


def test_a_pipeline_reason_names_torchs_own_forward(tmp_path):
    """Blocks inside nn.TransformerEncoder are called by torch's forward, which the user cannot
    edit: the reason says to call them from a forward of their own; a user's forward is named."""
    path = tmp_path / "enc.py"
    path.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Enc(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(32, 16)
                layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
                self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
                self.head = nn.Linear(16, 32)

            def forward(self, x):
                return self.head(self.encoder(self.emb(x)))

        class Own(Enc):
            def forward(self, x):
                x = self.emb(x)
                for layer in self.encoder.layers:
                    x = layer(x)
                return self.head(x)

        def model():
            return Enc()

        def own():
            return Own()

        def batch(micro_batch_size, model=None, seed=0):
            t = torch.randint(0, 32, (micro_batch_size, 9), generator=torch.Generator().manual_seed(seed))
            return t[:, :-1], t[:, 1:]
    """))
    why = profile_model(str(path), cache=False).unsupported["pp"]
    assert why.startswith("Enc's blocks are called by torch's TransformerEncoder.forward, which does not skip")
    assert "call them from a forward of your own that skips None layers" in why
    own = profile_model(f"{path}:own", cache=False).unsupported["pp"]
    assert own.startswith("Own.forward does not skip the layers another stage holds")
