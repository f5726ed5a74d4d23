"""The profiler reads the model file's tp_plan_outer (the plan the executor applies) for the
parts around the blocks: a vocab-parallel head counts tp-sharded, a model without the outer
plan keeps its embedding and head replicated, and the memory model follows the profile."""

from __future__ import annotations

import pytest
from smplan.hwprofiles import load_cluster
from smplan.planner import PlanError, profile_model
from smplan.planner.memory_model import chunk_memory

from tests.conftest import EXAMPLES

GPT = str(EXAMPLES / "gpt.py")
ARGS = {"layers": 2, "hidden": 128, "heads": 4, "seq_len": 64, "vocab": 512}


@pytest.fixture(scope="module")
def replicated_gpt(tmp_path_factory):
    """examples/gpt.py without tp_plan_outer: only the blocks are tensor-parallel."""
    path = tmp_path_factory.mktemp("blocks_only") / "gpt_blocks_only.py"
    source = (EXAMPLES / "gpt.py").read_text()
    path.write_text(source[: source.index("def tp_plan_outer(")])
    return str(path)


def test_vocab_parallel_head_and_embedding_from_the_plan():
    s, h, v = ARGS["seq_len"], ARGS["hidden"], ARGS["vocab"]
    p = profile_model(GPT, ARGS, cache=False)
    embed, (head, loss) = p.pre[0], p.post
    assert [(m.m, m.n, m.k, m.tp_dim) for m in head.matmuls] == [(s, v, h, "n")]
    assert head.output_tp_sharded and not embed.output_tp_sharded and not p.blocks[0].output_tp_sharded
    # the loss reads the sharded logits: its saved softmax and its element-wise work are / tp
    assert loss.saved_bytes_tp_sharded_per_sample >= 4 * s * v and loss.elementwise_tp_sharded_fraction == 1.0
    # the final norm runs replicated without SP (Megatron): its saved input stays replicated
    assert head.saved_bytes_replicated_per_sample > 0 and head.elementwise_tp_sharded_fraction == 0.0
    assert [c.module for c in head.tp_collectives] == ["head.out"]
    assert [(c.module, c.phase) for c in embed.tp_collectives] == [("embed.tokens", "forward")]
    assert head.params_tp_sharded == v * h and embed.params_tp_sharded == v * h  # norm, positions replicated
    assert p.supports_sequence_parallel


def test_without_the_outer_plan_the_head_stays_replicated(replicated_gpt):
    v = ARGS["vocab"]
    p = profile_model(replicated_gpt, ARGS, cache=False)
    embed, (head, loss) = p.pre[0], p.post
    assert p.has_tp_plan and not p.supports_sequence_parallel
    assert all(m.tp_dim is None for m in head.matmuls) and not head.tp_collectives and not embed.tp_collectives
    assert head.params_tp_sharded == 0 == embed.params_tp_sharded and not head.output_tp_sharded
    assert loss.saved_bytes_tp_sharded_per_sample == 0 and loss.elementwise_tp_sharded_fraction == 0.0
    # the memory model keeps the replicated embedding and head (and their logits) whole on every rank
    sharded = profile_model(GPT, ARGS, cache=False)
    cl = load_cluster("a100x8")
    kw = dict(dp=1, sp=False, zero=0, micro_batch=1, flight=1.0, recompute="none", first=True, last=True,
              device_first_chunk=True, dtype="bf16")
    whole, split = chunk_memory(p, cl, tp=4, **kw), chunk_memory(sharded, cl, tp=4, **kw)
    assert whole.weights0 == pytest.approx(2.0 * (embed.params + head.params))
    assert split.weights0 == pytest.approx(2.0 * (embed.params + head.params - 2 * v * ARGS["hidden"] * 3 / 4))
    # Megatron's in-place loss (a100x8's default stack): 3x the logits, less what the loss part saves
    # (counted with the activations), whole on every rank without the outer plan, / tp with it
    kept = {id(q): next(x for x in q.post if x.name == "loss").saved_bytes_per_gpu(4) for q in (p, sharded)}
    logits = head.output_bytes_per_sample
    assert whole.buffers - split.buffers == pytest.approx((3 * logits - kept[id(p)]) - (3 * logits / 4 - kept[id(sharded)]))
    assert chunk_memory(p, cl, tp=1, **kw).weights0 == pytest.approx(whole.weights0)


def test_sequence_parallel_is_not_offered_without_the_outer_plan(replicated_gpt):
    from smplan.planner import estimate, plan_search
    from smplan.planner.plan import Plan

    p = profile_model(replicated_gpt, ARGS, cache=False)
    cl = load_cluster("a100x8")
    plans = plan_search(p, cl, global_batch=8, fix="tp=2", top=5)
    assert plans and not any(q.sequence_parallel for q in plans)
    with pytest.raises(PlanError, match="tp_plan_outer"):
        plan_search(p, cl, global_batch=8, fix="tp=2,sp=1", top=1)
    plan = Plan(model=replicated_gpt, hw="a100x8", nodes=1, dp=1, tp=2, pp=1, micro_batch=1, global_batch=8,
                sequence_parallel=True)
    with pytest.raises(PlanError, match="tp_plan_outer"):
        estimate(plan, p, cl)


TOP_LEVEL = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, vocab=512, hidden=64, layers=2, seq_len=32):
        super().__init__()
        self.seq_len = seq_len
        self.emb = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Block(hidden) for _ in range(layers))
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def model(**kw):
    return Net(**kw)


def batch(micro_batch_size, model, seed=0):
    tokens = torch.randint(0, 512, (micro_batch_size, model.seq_len))
    return tokens, tokens


def tp_plan(block):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


def tp_plan_outer(model):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    return {"emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "out": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
'''


def test_top_level_tp_styled_modules_keep_their_collectives_and_sharded_logits(tmp_path):
    """An embedding and head that are themselves the model's top-level parts (as transformers'
    embed_tokens and lm_head are): their TP collectives belong to them and the logits are sharded,
    as for examples/gpt.py's nested ones (the profiler once recorded neither: a part's own hook ran
    first and left the part)."""
    path = tmp_path / "toplevel.py"
    path.write_text(TOP_LEVEL)
    p = profile_model(str(path), {}, cache=False)
    (emb,), (out, *_) = p.pre, p.post
    assert [(c.module, c.phase) for c in emb.tp_collectives] == [("emb", "forward")]
    assert [(c.module, c.phase) for c in out.tp_collectives] == [("out", "backward")]
    assert out.output_tp_sharded and not emb.output_tp_sharded
    moe = profile_model(str(EXAMPLES / "moe.py:tiny"), {}, cache=False)
    assert [(c.module, c.phase) for c in moe.pre[0].tp_collectives] == [("embed", "forward")]


def test_a_tp_hook_that_fails_under_sp_leaves_sp_out_with_the_reason(tmp_path):
    """A user's tp_plan that raises under sequence_parallel=True: the profile stands, sp is not
    offered, and the reason reaches plan --explain (the search's unsupported)."""
    from smplan.planner.search import plan_model

    path = tmp_path / "gpt_no_sp.py"
    path.write_text((EXAMPLES / "gpt.py").read_text() + (
        "\n\n_tp_plan = tp_plan\n\n\ndef tp_plan(block, sequence_parallel=False):\n"
        "    if sequence_parallel:\n        raise RuntimeError('no sequence split here')\n"
        "    return _tp_plan(block)\n"))
    p = profile_model(str(path), ARGS, cache=False)
    assert p.has_tp_plan and "tp" not in p.unsupported and not p.supports_sequence_parallel
    assert "tp_plan raised RuntimeError: no sequence split here" in p.unsupported["sp"]
    planned = plan_model(str(path), load_cluster("a100x8"), model_args=ARGS, global_batch=8, top=1)
    assert "no sequence split here" in planned.unsupported["sp"] and not planned.plans[0].sequence_parallel
