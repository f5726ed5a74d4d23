"""What a continuation of a run (`smplan execute -o RUN` again) refuses before launch, in one line
and exit 2: a model whose code changed since its checkpoint (one process, no launch)."""

from __future__ import annotations

import textwrap

import pytest

from smplan.cli.main import cli
from tests.executor.finished_run import PLAN, finished_run

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp.save in one process

PARTS = textwrap.dedent('''
    from torch import nn


    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.up = nn.Linear(d, 4 * d)
            self.down = nn.Linear(4 * d, d)

        def forward(self, x):
            return x + self.down(self.up(x).relu())
''')
MODEL = textwrap.dedent('''
    import torch
    from torch import nn
    from parts import Block


    class Net(nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.emb = nn.Embedding(32, d)
            self.blocks = nn.ModuleList(Block(d) for _ in range(2))
            self.head = nn.Linear(d, 32)

        def forward(self, tokens):
            x = self.emb(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(x)


    def model():
        return Net()


    def batch(micro_batch_size, model=None, seed=0):
        t = torch.randint(0, 32, (micro_batch_size, 9), generator=torch.Generator().manual_seed(seed))
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()
''')


@pytest.fixture
def no_launch(monkeypatch):
    def launched(*args, **kwargs):
        raise AssertionError("launched")

    monkeypatch.setattr("smplan.executor.run.launch_local", launched)


def _execute(cli_runner, *args):
    result = cli_runner.invoke(cli, ["execute", PLAN, *args])
    lines = result.output.strip().splitlines()
    return result.exit_code, lines[-1] if lines else ""


def test_a_module_beside_the_model_file_edited_since_the_checkpoint_is_refused(cli_runner, tmp_path, no_launch):
    (tmp_path / "parts.py").write_text(PARTS)
    (tmp_path / "net.py").write_text(MODEL)
    out = finished_run(tmp_path / "run", model=str(tmp_path / "net.py"))
    # the model file's bytes are the same (so is the fingerprint); the size changes too, so no stale .pyc is read
    (tmp_path / "parts.py").write_text(PARTS.replace("4 * d", "(2 * d)"))
    code, line = _execute(cli_runner, "--model", str(tmp_path / "net.py"), "--steps", "4", "-o", str(out))
    assert code == 2, line
    assert line.startswith(f"error: checkpoint {out / 'checkpoints' / 'step-2'} holds another model: it has "
                           "blocks.0.up.weight as (64, 16), where the model has (32, 16); the model changed since "
                           "it was written though its file did not"), line
    assert "restore that code to continue the run, or pass another -o/--output" in line
