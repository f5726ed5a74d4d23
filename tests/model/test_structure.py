"""The one structure rule the profiler and the executor share (smplan.model)."""

from collections import OrderedDict

import pytest
import torch
from torch import nn

from smplan.model import find_layout
from smplan.model.structure import cut_chunk, owned_blocks
from tests.model.resnet_like import ResNet


def _meta(build):
    with torch.device("meta"):
        return build()


class _Vit(nn.Module):  # torchvision's ViT names its encoder layers "encoder_layer_N"
    def __init__(self):
        super().__init__()
        self.patch = nn.Linear(4, 8)
        self.encoder = nn.Module()
        self.encoder.layers = nn.Sequential(OrderedDict((f"encoder_layer_{i}", nn.Linear(8, 8)) for i in range(3)))
        self.encoder.ln = nn.LayerNorm(8)
        self.heads = nn.Linear(8, 2)


def test_resnet_blocks_are_the_identical_run_with_the_most_parameters():
    layout = find_layout(_meta(ResNet))
    assert (layout.container, layout.block_names) == ("layer2", ("1", "2"))
    assert layout.before == ("conv1", "bn1", "layer1", "layer2.0") and layout.after == ("fc",)


def test_block_names_need_not_be_integers():
    layout = find_layout(_meta(_Vit))
    assert layout.container == "encoder.layers" and layout.num_blocks == 3
    assert layout.block_fqn(2) == "encoder.layers.encoder_layer_2"
    assert layout.before == ("patch",) and layout.after == ("encoder.ln", "heads")
    chunk = cut_chunk(_meta(_Vit), layout, 1, 3, is_first=False, is_last=True)
    assert [i for i, _ in owned_blocks(chunk, layout)] == [1, 2] and chunk.patch is None and chunk.heads is not None


def test_dense_first_layers_in_the_same_list_belong_to_the_first_stage():
    class Moe(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(8, 8), *(nn.Bilinear(8, 8, 8) for _ in range(3))])

    layout = find_layout(_meta(Moe))
    assert layout.block_names == ("1", "2", "3") and layout.before == ("layers.0",) and layout.after == ()


def test_a_model_that_is_itself_the_stack_of_blocks():
    layout = find_layout(_meta(lambda: nn.Sequential(*(nn.Linear(4, 4) for _ in range(3)))))
    assert (layout.container, layout.num_blocks, layout.before, layout.after) == ("", 3, (), ())


def test_a_model_without_repeated_modules_has_no_blocks():
    layout = find_layout(_meta(lambda: nn.Linear(4, 4)))
    assert layout.container is None and layout.num_blocks == 0
    assert owned_blocks(nn.Linear(4, 4), layout) == []


class _ListOfLists(nn.Module):  # stages of blocks: the outer list's items are lists, never called
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.stages = nn.ModuleList(nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)]) for _ in range(3))

    def forward(self, x):
        x = self.inp(x)
        for stage in self.stages:
            for block in stage:
                x = block(x)
        return x


def test_a_list_of_lists_holds_its_blocks_one_level_down():
    layout = find_layout(_meta(_ListOfLists))
    assert (layout.container, layout.block_names) == ("stages.0", ("0", "1"))
    assert layout.before == ("inp",) and layout.after == ("stages.1", "stages.2")


def _model_file(tmp_path, code: str, width: int = 8, inputs: int = 8) -> str:
    """A model file: `code` defines model(); batch() and loss() are the same for every test here."""
    file = tmp_path / "model.py"
    file.write_text(
        "import torch\nfrom torch import nn\nimport torch.nn.functional as F\n" + code + "\n\n"
        "def batch(micro_batch_size, model=None, seed=0):\n"
        f"    return torch.randn(micro_batch_size, {inputs}), torch.randn(micro_batch_size, {width})\n\n\n"
        "def loss(out, target):\n    return F.mse_loss(out, target)\n")
    return str(file)


def test_a_list_of_lists_profiles_every_parameter(tmp_path):
    from smplan.planner import profile_model

    ref = _model_file(tmp_path, "from tests.model.test_structure import _ListOfLists\n\n\n"
                                "def model():\n    return _ListOfLists()\n", inputs=4)
    profile = profile_model(ref, cache=False)
    assert profile.params == sum(p.numel() for p in _ListOfLists().parameters())  # 3 x 2 x 72 + 40
    assert profile.num_blocks == 2


@pytest.mark.parametrize("code, where", [
    # the blocks are called through their weights, never as modules: refused, not dropped from the totals
    ("\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))\n\n"
     "    def forward(self, x):\n        for b in self.blocks:\n            x = F.linear(x, b.weight, b.bias)\n"
     "        return x\n\n\ndef model():\n    return Net()\n", "blocks.0..2"),
    # the same when the root holds them: named plainly
    ("\n\nclass Net(nn.Sequential):\n    def forward(self, x):\n        for b in self:\n"
     "            x = F.linear(x, b.weight)\n        return x\n\n\n"
     "def model():\n    return Net(*(nn.Linear(8, 8, bias=False) for _ in range(4)))\n", "0..3 of the model"),
])
def test_blocks_that_forward_never_calls_are_refused(tmp_path, code, where):
    from smplan.planner import ModelFileError, profile_model

    with pytest.raises(ModelFileError, match=rf"forward never calls the repeated blocks {where}; call each block"):
        profile_model(_model_file(tmp_path, code), cache=False)


class _Stage(nn.ModuleList):  # a list subclass with its own forward is called: it is a block
    def __init__(self):
        super().__init__(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for block in self:
            x = block(x)
        return x


def test_a_list_subclass_with_a_forward_is_a_block():
    layout = find_layout(_meta(lambda: nn.ModuleDict({"stages": nn.ModuleList(_Stage() for _ in range(4))})))
    assert (layout.container, layout.block_names) == ("stages", ("0", "1", "2", "3"))


def test_the_parts_before_the_blocks_that_recompute_are_those_with_matmul_work():
    """DeepSeek-V3's dense layers, not the embedding (planner memory_model.pre_recompute's rule)."""
    from smplan.planner.model_file import load_model_file

    from smplan.model.structure import recomputable_parts_before

    model = load_model_file("examples/moe.py:tiny").build({}, device="meta")
    layout = find_layout(model)
    assert [name for _, name in recomputable_parts_before(model, layout)] == ["dense"]
    gpt = load_model_file("examples/gpt.py:tiny").build({}, device="meta")
    assert recomputable_parts_before(gpt, find_layout(gpt)) == []


def test_a_list_of_dense_layers_recomputes_layer_by_layer_and_a_conv_stem_does_too():
    """A backward re-materialises one dense layer at a time, as it does a block (a review's finding:
    three at once outgrew the one block's buffer the planner counts); a conv does matmul work."""
    from smplan.planner.model_file import load_model_file

    from smplan.model.structure import recomputable_parts_before

    model = load_model_file("examples/moe.py:tiny").build({"dense_layers": 2, "layers": 5}, device="meta")
    assert [name for _, name in recomputable_parts_before(model, find_layout(model))] == ["0", "1"]
    cnn = load_model_file("examples/cnn.py").build({}, device="meta")
    assert recomputable_parts_before(cnn, find_layout(cnn))  # its stem: the profile counts its FLOPs
