"""batch()'s inputs as a tensor, a tuple or a dict train the same model the same way (the
README's forward(*inputs) / forward(**inputs)); what cannot take them (pipeline stages,
--data), a tie across pipeline stages and outputs the default loss cannot take are refused
in one line before any process starts; the default loss is profiled like a file's own."""

from pathlib import Path

import numpy as np
import pytest
import torch
from smplan.planner import profile_model

from smplan.cli.main import cli
from smplan.model import call_model, sequence_length, tokens_per_sample
from tests.executor.runs import metrics, run_execute

MODELS = str(Path(__file__).with_name("inputs_models.py"))


def test_call_model_and_tokens_follow_the_inputs_shape():
    seen = []

    class Echo(torch.nn.Module):
        def forward(self, *args, **kwargs):
            seen.append((len(args), sorted(kwargs)))

    ids = torch.zeros(2, 7, dtype=torch.long)
    for inputs in (ids, (ids, torch.ones(2, 7)), {"input_ids": ids, "mask": torch.ones(2, 7)}):
        call_model(Echo(), inputs)
        assert tokens_per_sample(inputs) == 7
    assert seen == [(1, []), (2, []), (0, ["input_ids", "mask"])]
    assert tokens_per_sample(torch.randn(2, 3, 8, 8)) == 1  # images: one sample, not tokens
    # one rule for the profile's seq_len (the plan's rate) and execute's tokens: the token ids decide,
    # after an image (the profile read the first tensor: samples, while execute counted 16 tokens)
    # and after a dict's float mask (a Hugging Face batch keyed in another order)
    captioned = (torch.randn(2, 3, 8, 8), torch.zeros(2, 16, dtype=torch.long))
    assert sequence_length(captioned) == 16 and tokens_per_sample(captioned) == 16
    masked = {"attention_mask": torch.ones(2, 1, 7, 7), "labels": torch.zeros(2, 9, dtype=torch.long), "input_ids": ids}
    assert sequence_length(masked) == 7
    assert sequence_length(ids) == 7 and sequence_length(torch.zeros(2, 7, 3, dtype=torch.long)) == 7
    assert sequence_length(torch.randn(2, 7)) == 0 and tokens_per_sample(torch.randn(2, 7)) == 1


def _losses_of(tmp_path, builder):
    out = tmp_path / builder
    result = run_execute("dp=2,mbs=2,gbs=4", out, "--steps", "3", model=f"{MODELS}:{builder}", timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    return [r["loss"] for r in metrics(out)]


@pytest.mark.parametrize("builder", ["dict_inputs", pytest.param("tuple_inputs", marks=pytest.mark.slow)])
def test_tuple_and_dict_inputs_train_as_the_tensor_does(tmp_path, builder):
    # CI time: the tuple with -m slow; a dict is split over the dp ranks by the same code, keyword by keyword
    reference = _losses_of(tmp_path, "model")
    assert all(np.isfinite(reference)) and len(reference) == 3
    assert _losses_of(tmp_path, builder) == pytest.approx(reference, rel=1e-5)


@pytest.mark.parametrize("args, says", [
    (["pp=2,mbs=1,gbs=2"], "pp=2: batch() gives KeywordDecoder's inputs as a dict; pipeline stages pass one tensor on"),
    (["cp=2,mbs=1,gbs=2"], "inputs_models.py's batch() gives its inputs as a dict; context parallelism splits one"),
    (["mbs=1,gbs=2", "--data", "DATA"], "--data feeds one tensor of token ids, but inputs_models.py's batch() gives "
                                         "a dict of inputs"),
])
def test_what_takes_one_tensor_refuses_a_dict(cli_runner, tmp_path, args, says):
    data = tmp_path / "tokens.bin"
    (np.arange(64 * 17) % 64).astype(np.uint16).tofile(data)
    args = [str(data) if a == "DATA" else a for a in args]
    out = tmp_path / "run"
    result = cli_runner.invoke(cli, ["execute", *args, "--model", f"{MODELS}:dict_inputs", "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_the_planner_offers_no_pipeline_for_a_dict_and_says_why(cli_runner):
    why = profile_model(f"{MODELS}:dict_inputs", cache=False).unsupported["pp"]
    assert why == "batch() gives KeywordDecoder's inputs as a dict; pipeline stages pass one tensor on"
    plan = cli_runner.invoke(cli, ["plan", f"{MODELS}:tuple_inputs", "--hw", "a100x8", "--fix", "pp=2"])
    assert plan.exit_code == 2 and "pp=2: batch() gives Decoder's inputs as a tuple" in plan.output


def test_a_tie_across_pipeline_stages_is_not_offered(cli_runner, tmp_path):
    why = profile_model(f"{MODELS}:tied", cache=False).unsupported["pp"]
    assert why.startswith("Decoder ties emb.weight to head.weight (one Parameter), which pipeline stages would hold apart")
    assert "pp" not in profile_model(MODELS, cache=False).unsupported
    plan = cli_runner.invoke(cli, ["plan", f"{MODELS}:tied", "--hw", "a100x8", "--fix", "pp=2"])
    assert plan.exit_code == 2 and "pp=2: Decoder ties emb.weight to head.weight" in plan.output
    out = tmp_path / "run"
    run = cli_runner.invoke(cli, ["execute", "pp=2,mbs=1,gbs=2", "--model", f"{MODELS}:tied", "-o", str(out)])
    assert run.exit_code == 2 and "ties emb.weight to head.weight" in run.output and not out.exists()


def test_outputs_the_default_loss_cannot_take_are_refused(cli_runner, tmp_path):
    profiled = cli_runner.invoke(cli, ["profile", f"{MODELS}:pair_out", "--no-cache"])
    assert profiled.exit_code == 2 and "the default loss" in profiled.output
    assert "define loss(outputs, targets) in inputs_models.py" in profiled.output
    out = tmp_path / "run"
    run = cli_runner.invoke(cli, ["execute", "mbs=1,gbs=2", "--model", f"{MODELS}:pair_out", "-o", str(out)])
    assert run.exit_code == 2 and "defines no loss(outputs, targets) and the default loss" in run.output
    assert "(tuple: " in run.output and "Traceback" not in run.output and not out.exists()


def test_the_default_loss_is_profiled_as_a_files_own():
    loss = next(p for p in profile_model(MODELS, cache=False).post if p.name == "loss")
    assert loss.saved_bytes_per_sample > 0  # the fp32 log-softmax it keeps for backward
