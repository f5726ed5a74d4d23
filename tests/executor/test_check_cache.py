"""validate_plan's checks that run the forward on the meta device (seconds in a fresh process) run
once per model: a passed check is recorded, a failed one is not, an edited file or module beside it
is checked again."""

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
            x = x if block is None else block(x)  # None on a pipeline stage that does not hold it
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
    """The checks that ran their forward, by name."""
    calls = []
    for name in ("_check_own_loss", "pipeline_problem"):
        real = getattr(validate_module, name)
        monkeypatch.setattr(validate_module, name, lambda *a, real=real, name=name, **k: (calls.append(name),
                                                                                         real(*a, **k))[1])
    return calls


def _validate(path, spec="mbs=2,gbs=2"):
    model_file = load_model_file(f"{path}:model")
    plan, _ = resolve_plan(spec, model=f"{path}:model")
    return validate_plan(plan, model_file, world_size=plan.world_size)


def test_a_passed_loss_check_runs_once_per_model_and_again_when_a_file_changes(tmp_path, forwards):
    path, parts = tmp_path / "net.py", tmp_path / "parts.py"
    path.write_text(MODEL.format(per_row=""))
    parts.write_text("WIDTH = 8\n")
    _validate(path)
    _validate(path)
    assert forwards == ["_check_own_loss"]
    parts.write_text("WIDTH = 4\n")  # a module the file imports from its folder
    _validate(path)
    assert forwards == ["_check_own_loss"] * 2
    path.write_text(MODEL.format(per_row="") + "\n# edited\n")
    _validate(path)
    assert forwards == ["_check_own_loss"] * 3
    forwards.clear()
    for _ in range(2):  # the pipeline check by its own name
        _validate(path, "pp=2,mbs=2,gbs=4")
    assert forwards == ["pipeline_problem"]


def test_a_failed_loss_check_is_not_recorded(tmp_path, forwards):
    path = tmp_path / "net.py"
    path.write_text(MODEL.format(per_row=".expand(3)"))  # three numbers, not one
    (tmp_path / "parts.py").write_text("WIDTH = 8\n")
    for _ in range(2):
        with pytest.raises(PlanMismatchError, match="not one number"):
            _validate(path)
    assert forwards == ["_check_own_loss"] * 2
