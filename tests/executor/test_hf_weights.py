"""Weights in and out for real: a tiny Hugging Face Llama (config written here, no download)
trained with dp=2 on two gloo processes, exported with `smplan export`, loaded with
transformers' `from_pretrained` (the logits of smplan's own model holding the checkpoint),
and trained on with `--init-from` under other layouts (tp=2 from the safetensors folder,
FSDP from the DCP checkpoint): the first step's loss is the exported model's loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smplan.cli.main import cli
from tests.executor.runs import checkpoint_state, metrics, run_execute

transformers = pytest.importorskip("transformers")

SEQ = 16
VOCAB = 128
GBS = 4
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
            intermediate_size=128, max_position_embeddings=SEQ)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(model ref, token stream, run directory, exported folder) of 3 dp=2 steps on a token stream."""
    from click.testing import CliRunner

    root = tmp_path_factory.mktemp("weights")
    transformers.LlamaConfig(**TINY).save_pretrained(root / "llama")
    llama = f"hf:{root / 'llama'}"
    stream = root / "train.bin"
    (np.arange(64 * (SEQ + 1)) % VOCAB).astype(np.uint16).tofile(stream)  # next token: the successor
    run = root / "run"
    result = run_execute(f"dp=2,mbs=1,gbs={GBS}", run, "--data", str(stream), "--steps", "3", "--lr", "1e-2",
                         "--checkpoint-every", "3", model=llama, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    out = root / "hf"
    exported = CliRunner().invoke(cli, ["export", str(run), str(out)])
    assert exported.exit_code == 0, exported.output
    return llama, stream, run, out


def first_batch(stream) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1's global batch of --data: sequences 0..GBS-1 of SEQ+1 tokens, targets shifted by one."""
    tokens = torch.from_numpy(np.fromfile(stream, dtype=np.uint16)[: GBS * (SEQ + 1)].astype(np.int64))
    seqs = tokens.view(GBS, SEQ + 1)
    return seqs[:, :-1], seqs[:, 1:]


def test_export_matches_smplans_model_of_the_checkpoint(trained, tmp_path):
    from smplan.planner.model_file import load_model_file

    llama, stream, run, out = trained
    state = checkpoint_state(run / "checkpoints" / "step-3", tmp_path)
    ours = load_model_file(llama).build({}, device="cpu")
    ours.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}, strict=True)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out)
    x, _ = first_batch(stream)
    with torch.no_grad():
        torch.testing.assert_close(theirs.eval()(x).logits, ours.eval()(x).logits)


def _loss_of_export(out, stream) -> float:
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    x, y = first_batch(stream)
    with torch.no_grad():
        logits = model(x).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).item()


@pytest.mark.parametrize("plan, source", [("tp=2,mbs=1,gbs=4", "safetensors"),
                                          pytest.param("dp=2,zero=3,mbs=1,gbs=4", "dcp", marks=pytest.mark.slow)])
def test_init_from_starts_at_the_trained_loss(trained, tmp_path, plan, source):
    llama, stream, run, out = trained
    expected = _loss_of_export(out, stream)
    assert expected < np.log(VOCAB) - 0.3  # trained: well below the uniform guess
    path = out if source == "safetensors" else run / "checkpoints" / "step-3"
    result = run_execute(plan, tmp_path / "run", "--data", str(stream), "--steps", "1", "--init-from", str(path),
                         model=llama, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "initial weights from" in result.stdout
    assert metrics(tmp_path / "run")[0]["loss"] == pytest.approx(expected, rel=1e-4)
