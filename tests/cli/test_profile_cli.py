"""`smplan profile`: the table, the JSON names scripts rely on, and one-line errors."""

from __future__ import annotations

import json

import pytest

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

GPT = str(EXAMPLES / "gpt.py")
SMALL = ["--arg", "layers=3", "--arg", "hidden=128", "--arg", "heads=4"]


def test_table_shows_parts_and_totals(cli_runner):
    result = cli_runner.invoke(cli, ["profile", GPT, *SMALL, "--seq-len", "64"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "blocks.0 .. 2" in out and "embed" in out and "head" in out and "loss" in out
    assert "train FLOPs per token" in out and "fwd 2x all_reduce" in out and "bwd 2x all_reduce" in out


def test_json_has_the_names_scripts_use(cli_runner):
    result = cli_runner.invoke(cli, ["profile", GPT, *SMALL, "--json", "--no-cache"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert isinstance(data["params"], int) and data["num_blocks"] == 3 and len(data["blocks"]) == 3
    assert data["seq_len"] == 32 and data["pre"] and data["post"]
    forward = sum(p["forward_flops_per_sample"] for p in data["pre"] + data["blocks"] + data["post"])
    assert data["train_flops_per_sample"] == pytest.approx(3 * forward)
    assert data["train_flops_per_token"] == pytest.approx(data["train_flops_per_sample"] / 32)


def test_dtype_option(cli_runner):
    result = cli_runner.invoke(cli, ["profile", str(EXAMPLES / "mlp.py"), "--dtype", "fp32", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["bytes_per_element"] == 4


@pytest.mark.parametrize(
    "source,args,expected",
    [
        ("def model(:\n", [], "syntax error"),
        ("x = 1\n", [], "no builder function"),
        ("def model():\n    return 1\n", [], "not a torch.nn.Module"),
        ("from torch import nn\ndef model(width: int = 4):\n    return nn.Linear(4, width)\n",
         ["--arg", "width=wide"], "must be a whole number"),
        ("from torch import nn\ndef model(width: int = 4):\n    return nn.Linear(4, width)\n",
         ["--arg", "depth=2"], "takes no argument 'depth'"),
    ],
    ids=["syntax", "no-builder", "not-module", "wrong-type", "unknown-arg"],
)
def test_broken_model_file_is_one_line_and_exit_2(cli_runner, tmp_path, source, args, expected):
    path = tmp_path / "broken.py"
    path.write_text(source)
    result = cli_runner.invoke(cli, ["profile", str(path), *args])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0] and str(path) in lines[0]


def test_an_hf_config_without_a_tp_plan_says_so_once(cli_runner, tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32).save_pretrained(tmp_path)
    result = cli_runner.invoke(cli, ["profile", f"hf:{tmp_path}", "--no-cache"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "tensor parallel" in line or line.startswith("tp ")]
    assert len(lines) == 1 and lines[0].startswith("tp will not be offered: GPT2Config has no base_model_tp_plan")


def test_a_folder_holding_a_config_and_an_encoder_file_are_one_line(cli_runner, tmp_path):
    """A Hugging Face folder passed without hf:, and a model file whose transformers encoder would
    train on hf:'s next-token batches: one line, exit 2, naming the fix."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32)
    config.save_pretrained(tmp_path / "bert")
    folder = cli_runner.invoke(cli, ["profile", str(tmp_path / "bert")])
    assert folder.exit_code == 2 and f"pass hf:{tmp_path / 'bert'} for a Hugging Face config" in folder.output
    (tmp_path / "lm.py").write_text("import transformers as T\n\n\ndef model():\n    return T.BertLMHeadModel("
                                    f"T.BertConfig(**{config.to_diff_dict()!r}))\n")
    encoder = cli_runner.invoke(cli, ["profile", str(tmp_path / "lm.py"), "--no-cache"])
    assert encoder.exit_code == 2 and "Traceback" not in encoder.output
    assert "BertConfig is an encoder-only model" in encoder.output and "define batch() and loss() in" in encoder.output
