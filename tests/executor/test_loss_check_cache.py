"""validate_plan's loss checks (a forward on the meta device: seconds in a fresh process) run once
per model: a passed check is recorded, a failed one is not, an edited file or module beside it is
checked again."""

import pytest

from smplan.executor import resolve_plan, validate_plan
from smplan.executor import validate as validate_module
from smplan.executor.validate import PlanMismatchError
from smplan.planner.model_file import load_model_file

MODEL = '''
import torch
from torch import nn
from parts import WIDTH


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + self.fc(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def model():
    return Net()


def batch(micro_batch_size, model=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(micro_batch_size, WIDTH, generator=g), torch.randn(micro_batch_size, WIDTH, generator=g)


def loss(outputs, targets):
    return ((outputs - targets) ** 2).mean(){per_row}
'''


@pytest.fixture
def forwards(monkeypatch):
    """How many loss checks ran their forward."""
    calls = []
    real = validate_module._check_own_loss
    monkeypatch.setattr(validate_module, "_check_own_loss", lambda *a: (calls.append(1), real(*a))[1])
    return calls


def _validate(path):
    model_file = load_model_file(f"{path}:model")
    plan, _ = resolve_plan("mbs=2,gbs=2", model=f"{path}:model")
    return validate_plan(plan, model_file, world_size=1)


def test_a_passed_loss_check_runs_once_per_model_and_again_when_a_file_changes(tmp_path, forwards):
    path, parts = tmp_path / "net.py", tmp_path / "parts.py"
    path.write_text(MODEL.format(per_row=""))
    parts.write_text("WIDTH = 8\n")
    _validate(path)
    _validate(path)
    assert len(forwards) == 1
    parts.write_text("WIDTH = 4\n")  # a module the file imports from its folder
    _validate(path)
    assert len(forwards) == 2
    path.write_text(MODEL.format(per_row="") + "\n# edited\n")
    _validate(path)
    assert len(forwards) == 3


def test_a_failed_loss_check_is_not_recorded(tmp_path, forwards):
    path = tmp_path / "net.py"
    path.write_text(MODEL.format(per_row=".expand(3)"))  # three numbers, not one
    (tmp_path / "parts.py").write_text("WIDTH = 8\n")
    for _ in range(2):
        with pytest.raises(PlanMismatchError, match="not one number"):
            _validate(path)
    assert len(forwards) == 2
