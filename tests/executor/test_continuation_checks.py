"""What a continuation of a run (`smplan execute -o RUN` again) refuses before launch, in one line
and exit 2: a model whose code changed since its checkpoint (one process, no launch)."""

from __future__ import annotations

import textwrap

import pytest

from smplan.cli.main import cli
from tests.executor.finished_run import PLAN, finished_run
from tests.executor.runs import GPT_TINY

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


def _execute(cli_runner, *args, model: str = GPT_TINY):
    """(exit code, last line) of `smplan execute PLAN --model MODEL ARGS`, or "launched" when it got that far."""
    result = cli_runner.invoke(cli, ["execute", PLAN, "--model", model, *args])
    if str(result.exception) == "launched":
        return None, "launched"
    lines = result.output.strip().splitlines()
    return result.exit_code, lines[-1] if lines else ""


def test_a_module_beside_the_model_file_edited_since_the_checkpoint_is_refused(cli_runner, tmp_path, no_launch):
    (tmp_path / "parts.py").write_text(PARTS)
    (tmp_path / "net.py").write_text(MODEL)
    out = finished_run(tmp_path / "run", model=str(tmp_path / "net.py"))
    # the model file's bytes are the same (so is the fingerprint); the size changes too, so no stale .pyc is read
    (tmp_path / "parts.py").write_text(PARTS.replace("4 * d", "(2 * d)"))
    code, line = _execute(cli_runner, "--steps", "4", "-o", str(out), model=str(tmp_path / "net.py"))
    assert code == 2, line
    assert line.startswith(f"error: checkpoint {out / 'checkpoints' / 'step-2'} holds another model: it has "
                           "blocks.0.up.weight as (64, 16), where the model has (32, 16); the model changed since "
                           "it was written though its file did not"), line
    assert "restore that code to continue the run, or pass another -o/--output" in line


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_another_runs_checkpoint_folder_is_not_saved_into(cli_runner, tmp_path, no_launch):
    a = finished_run(tmp_path / "a", steps=4)
    before = _files(a)
    code, line = _execute(cli_runner, "--steps", "8", "-o", str(tmp_path / "b"), "--checkpoint-dir",
                          str(a / "checkpoints"), "--checkpoint-every", "2", "--keep-checkpoints", "1")
    assert code == 2, line
    assert line == (f"error: {a / 'checkpoints'} holds step-4, which this run did not write (the run in {a} did): "
                    f"its checkpoints would replace or prune them there; start from their weights with --init-from "
                    f"{a / 'checkpoints'}, continue that run with -o {a}, or give this run a --checkpoint-dir of its "
                    "own (or none: RUN_DIR/checkpoints)")
    assert _files(a) == before and not (tmp_path / "b").exists()


@pytest.mark.parametrize("args", [
    ("--checkpoint-every", "2"),  # its own folder's checkpoints
    ("--checkpoint-every", "2", "--checkpoint-dir", "{a}/checkpoints"),  # the same, named
])
def test_a_run_continues_into_its_own_checkpoints(cli_runner, tmp_path, no_launch, args):
    a = finished_run(tmp_path / "a", steps=4)
    assert _execute(cli_runner, "--steps", "8", "-o", str(a), *(x.format(a=a) for x in args)) == (None, "launched")


def test_another_runs_checkpoints_are_still_resumed_without_saving(cli_runner, tmp_path, no_launch):
    a = finished_run(tmp_path / "a", steps=4)
    assert _execute(cli_runner, "--steps", "8", "-o", str(tmp_path / "b"), "--checkpoint-dir",
                    str(a / "checkpoints")) == (None, "launched")


def test_an_explicit_checkpoint_dir_of_the_run_keeps_its_older_checkpoints(cli_runner, tmp_path, no_launch):
    # written before checkpoints named their run: the --checkpoint-dir the run recorded holds its own
    from smplan.executor.run_dir import earlier_config

    from tests.executor.finished_run import write_checkpoint

    a = finished_run(tmp_path / "a", steps=2, checkpoint_dir=str(tmp_path / "ck"))
    meta = tmp_path / "ck" / "step-2" / "smplan.json"
    meta.write_text(meta.read_text().replace('"run_dir"', '"older_key"'))
    assert _execute(cli_runner, "--steps", "8", "-o", str(a)) == (None, "launched")
    write_checkpoint(tmp_path / "ck", 4, earlier_config(a), run_dir=str(tmp_path / "other"))
    code, line = _execute(cli_runner, "--steps", "8", "-o", str(a))
    assert code == 2 and "holds step-4, which this run did not write (the run in" in line, line


def test_a_users_folder_named_as_a_checkpoint_is_not_replaced(cli_runner, tmp_path, no_launch):
    mine = tmp_path / "docs" / "step-1" / "mine.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("notes")
    code, line = _execute(cli_runner, "--steps", "2", "-o", str(tmp_path / "run"), "--checkpoint-dir",
                          str(tmp_path / "docs"), "--checkpoint-every", "1")
    assert code == 2 and f"{tmp_path / 'docs'} holds step-1, which this run did not write: its checkpoints would " \
        "replace them there; move them aside, or give this run a --checkpoint-dir of its own" in line, line
    assert mine.read_text() == "notes"
