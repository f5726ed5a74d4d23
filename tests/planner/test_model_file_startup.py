"""A model build on the meta device: torch.nn.init's fills that would import torch._dynamo are
skipped there (with their argument checks kept), and nothing heavy is imported to build a model
that is not a transformers one (about 3 s of every `smplan execute` process's start-up)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from smplan.planner.model_file import ModelFileError, load_model_file

from tests.conftest import EXAMPLES

BAD_INIT = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        nn.init.{call}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for block in self.blocks:
            x = block.fc(x)
        return x


def model():
    return Net()


def batch(micro_batch_size: int):
    return torch.randn(micro_batch_size, 8)
'''


@pytest.mark.parametrize("call, says", [
    ("kaiming_normal_(self.fc.bias)", "Fan in and fan out can not be computed"),
    ("xavier_normal_(self.fc.bias)", "Fan in and fan out can not be computed"),
    ("kaiming_normal_(self.fc.weight, mode='fan_inn')", "Mode fan_inn not supported"),
    ("eye_(self.fc.bias)", "Only tensors with 2 dimensions are supported"),
    ("normal_(self.fc.weight, std=-1.0)", "normal expects std >= 0.0"),
    ("xavier_normal_(self.fc.weight, gain=-1.0)", "normal expects std >= 0.0"),
])
def test_a_wrong_init_call_still_fails_on_meta_and_the_fills_come_back(tmp_path, call, says):
    path = tmp_path / "badinit.py"
    path.write_text(BAD_INIT.format(call=call))
    originals = {name: getattr(torch.nn.init, name) for name in ("normal_", "kaiming_normal_", "xavier_normal_", "eye_")}
    with pytest.raises(ModelFileError, match=says):
        load_model_file(str(path)).build({}, device="meta")
    assert all(getattr(torch.nn.init, name) is fill for name, fill in originals.items())


def test_a_right_init_call_builds_on_meta_and_fills_on_cpu(tmp_path):
    path = tmp_path / "goodinit.py"
    path.write_text(BAD_INIT.format(call="kaiming_normal_(self.fc.weight, nonlinearity='relu')"))
    model_file = load_model_file(str(path))
    assert model_file.build({}, device="meta").blocks[0].fc.weight.is_meta
    torch.manual_seed(0)
    weight = model_file.build({}, device="cpu").blocks[0].fc.weight
    torch.manual_seed(0)
    reference = torch.nn.init.kaiming_normal_(torch.nn.Linear(8, 8).weight, nonlinearity="relu")
    assert torch.equal(weight, reference)  # the CPU fill is torch's own, same generator draws


def test_building_a_plain_model_imports_neither_transformers_nor_dynamo_nor_matplotlib():
    code = (f"import sys; import smplan.cli.execute; from smplan.planner.model_file import load_model_file; "
            f"load_model_file({str(EXAMPLES / 'gpt.py:tiny')!r}).build({{}}, device='meta'); "
            "print(sorted(m for m in ('transformers', 'torch._dynamo', 'matplotlib') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
