"""The host's launch time per layer pass scales with the kernels a block without attention
launches (pass_model.FITTED_LAYER_KERNELS); transformer layers keep the stack's fitted figure,
however few kernels they launch."""

import dataclasses
import textwrap

import pytest
from smplan.hwprofiles import load_cluster
from smplan.planner import profile_model
from smplan.planner.pass_model import FITTED_LAYER_KERNELS, host_launch_s

from tests.own_models import token_lm_file

H100 = load_cluster("h100x8")
PER_LAYER_S = H100.efficiency.host_overhead_us_per_layer * 1e-6

CONV_FILE = '''
import torch
from torch import nn


class Block(nn.Module):  # a 1-D conv token mixer: norm, conv, GELU, linear, residual
    def __init__(self, d):
        super().__init__()
        self.norm, self.conv, self.fc = nn.LayerNorm(d), nn.Conv1d(d, d, 3, padding=1), nn.Linear(d, d)

    def forward(self, x):
        y = self.conv(self.norm(x).transpose(1, 2)).transpose(1, 2)
        return x + self.fc(torch.nn.functional.gelu(y))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.blocks, self.out = nn.Embedding(64, 32), nn.Sequential(*[Block(32) for _ in range(3)]), nn.Linear(32, 64)

    def forward(self, tokens):
        return self.out(self.blocks(self.emb(tokens)))


def model():
    return Net()


def batch(micro_batch_size, model=None, seed=0):
    x = torch.randint(0, 64, (micro_batch_size, 17), generator=torch.Generator().manual_seed(seed))
    return x[:, :-1], x[:, 1:]
'''


def test_a_transformer_layer_keeps_the_stacks_host_time():
    # the fitted layer: vTrain's and SC21's GPT-3 layers, as examples/gpt.py builds them
    assert profile_model("examples/gpt.py:gpt3_175b", args={"layers": 1, "hidden": 64, "heads": 4, "vocab": 64},
                         seq_len=32, cache=False).blocks[0].forward_kernels == FITTED_LAYER_KERNELS
    block = profile_model("examples/gpt.py:tiny", args={"attention": "sdpa"}, cache=False).blocks[0]
    assert block.forward_kernels < FITTED_LAYER_KERNELS  # flash attention, no dropout: fewer launches
    assert host_launch_s(H100, block) == pytest.approx(PER_LAYER_S)  # a transformer layer all the same


LEAN_FILE = token_lm_file('''
class Block(nn.Module):  # a pre-norm transformer layer, fused qkv, torch SDPA, no tp_plan
    def __init__(self, d=64, h=4):
        super().__init__()
        self.h = h
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, 3, self.h, d // self.h).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.n2(x))))
''', vocab=128, width=64)


def test_a_lean_transformer_layer_without_a_tp_plan_keeps_it(tmp_path):
    """Attention is found without a TP plan too (the fused kernel, its K/V): 10 kernels, full host time."""
    path = tmp_path / "lean.py"
    path.write_text(textwrap.dedent(LEAN_FILE))
    block = profile_model(str(path), cache=False).blocks[0]
    assert block.forward_kernels < FITTED_LAYER_KERNELS
    assert host_launch_s(H100, block) == pytest.approx(PER_LAYER_S)


def test_a_lighter_block_takes_its_share(tmp_path):
    path = tmp_path / "conv.py"
    path.write_text(textwrap.dedent(CONV_FILE))
    block = profile_model(str(path), cache=False).blocks[0]
    # norm, conv, GELU, linear, residual add (the transposes are views; the linear's strided
    # input may add a copy)
    assert 5 <= block.forward_kernels <= 7
    assert host_launch_s(H100, block) == pytest.approx(PER_LAYER_S * block.forward_kernels / FITTED_LAYER_KERNELS)
    # a profile from before the count (forward_kernels 0) and the parts beside the blocks keep it
    assert host_launch_s(H100, dataclasses.replace(block, forward_kernels=0.0)) == pytest.approx(PER_LAYER_S)
    assert host_launch_s(H100, dataclasses.replace(block, kind="pre")) == pytest.approx(PER_LAYER_S)
