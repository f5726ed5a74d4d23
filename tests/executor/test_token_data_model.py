"""The vocabulary --data is held to when the model's config states none: the rows of the
nn.Embedding its token ids index, found by a meta forward (never a position embedding)."""

import copy
import dataclasses
import json
import textwrap

import numpy as np
import pytest
import torch
from smplan.executor.token_data import Vocab, embedding_fed, model_vocab
from torch import nn

from smplan.cli.main import cli

IDS = torch.zeros(2, 8, dtype=torch.long, device="meta")


class Decoder(nn.Module):
    """A user's own model: positions (512 rows) outnumber the vocabulary (100), and come first."""

    def __init__(self, vocab=100, positions=512, d=8):
        super().__init__()
        self.pos = nn.Embedding(positions, d)
        self.tok = nn.Embedding(vocab, d)
        self.out = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.pos(torch.arange(idx.shape[1], device=idx.device)) + self.tok(idx[:, :])
        return self.out(x)


class NoEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, idx):
        return self.lin(idx.float())


class FailsOnMeta(Decoder):
    def forward(self, idx):
        if idx.sum().item() > 0:  # a value: .item() on meta raises
            return idx
        return super().forward(idx)


class HFLike(Decoder):
    def get_input_embeddings(self):
        return self.tok


def on_meta(module):
    return module.to("meta")


def test_the_embedding_the_ids_index_gives_the_vocabulary():
    vocab = model_vocab(on_meta(Decoder()), IDS, "mine.py")
    assert vocab == 100 and vocab.source == "the rows of mine.py's nn.Embedding 'tok', which the token ids index"
    assert embedding_fed(on_meta(HFLike()), IDS)[0] == "tok"  # transformers: get_input_embeddings(), no forward


def test_the_config_comes_first_and_nothing_known_is_unchecked():
    model = on_meta(Decoder())
    model.config = {"vocab_size": 128}
    assert model_vocab(model, IDS, "m.py") == 128 and model_vocab(model, IDS, "m.py").source == "m.py's config.vocab_size"
    assert model_vocab(on_meta(NoEmbedding()), IDS, "m.py") is None
    assert model_vocab(on_meta(FailsOnMeta()), IDS, "m.py") is None
    model = on_meta(Decoder())
    model_vocab(model, IDS, "m.py")
    assert not any(m._forward_pre_hooks for m in model.modules())  # the hooks are removed


def test_a_vocab_is_an_int_that_keeps_its_source_through_a_copy():
    @dataclasses.dataclass
    class Config:
        vocab: int

    vocab = Vocab(256, "there")
    assert copy.deepcopy(vocab).source == "there"
    assert json.dumps(dataclasses.asdict(Config(vocab))) == '{"vocab": 256}'


MODEL = textwrap.dedent('''
    import torch
    from torch import nn

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(64, 16)
            self.pos = nn.Embedding(16, 16)
            self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
            self.out = nn.Linear(16, 64)

        def forward(self, idx):
            x = self.emb(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.out(x)

    def model():
        return LM()

    def batch(micro_batch_size, model=None, seed=0):
        t = torch.randint(0, 64, (micro_batch_size, 17), generator=torch.Generator().manual_seed(seed))
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()
''')


@pytest.mark.parametrize("last, message", [
    (1000, "token id 1000 (first tokens of t.bin) is outside the model's vocabulary [0, 64) (the rows of "
           "mine.py's nn.Embedding 'emb', which the token ids index)"),
    (None, "a .txt file is not token data"),
])
def test_execute_refuses_ids_past_a_config_less_models_embedding_before_launch(cli_runner, tmp_path, last, message):
    (tmp_path / "mine.py").write_text(MODEL)
    tokens = np.arange(2000) % 64
    tokens[-1] = last or 0
    data = tmp_path / ("t.bin" if last else "t.txt")
    tokens.astype(np.uint16).tofile(data)
    result = cli_runner.invoke(cli, ["execute", "dp=1,mbs=2,gbs=8", "--model", str(tmp_path / "mine.py"),
                                     "--data", str(data), "-o", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output
    assert not (tmp_path / "run").exists()
