"""Whole-model tensor parallelism in one process (a tp mesh of one rank): the model file's
tp_plan_outer shards the embedding and the head, the logits reach the loss as a DTensor
sharded over the vocabulary, and pipeline chunks without an embedding or head skip them."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from smplan.executor import PlanMismatchError, resolve_plan, validate_plan
from smplan.executor.parallelize import apply_tp, present_styles, shards_logits
from smplan.executor.train import plain_loss
from smplan.planner import load_model_file

from smplan.model.structure import cut_chunk, find_layout, owned_blocks
from tests.conftest import EXAMPLES

GPT = f"{EXAMPLES / 'gpt.py'}:tiny"
MLP = str(EXAMPLES / "mlp.py")


@pytest.fixture(scope="module")
def tp_mesh(tmp_path_factory):
    from torch.distributed.device_mesh import init_device_mesh

    store = tmp_path_factory.mktemp("store") / "file"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


def _chunk(mf, args, first, last, is_first, is_last, tp_mesh, sp):
    torch.manual_seed(0)
    model = mf.build(args, device="cpu")
    layout = find_layout(model)
    chunk = cut_chunk(model, layout, first, last, is_first=is_first, is_last=is_last)
    blocks = [m for _, m in owned_blocks(chunk, layout)]
    apply_tp(chunk, blocks, tp_mesh, mf.hook("tp_plan"), mf.hook("tp_plan_outer"), sp)
    return model, chunk


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("positions", [True, False])
def test_whole_model_plan_shards_embedding_and_head(tp_mesh, sp, positions):
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel

    mf = load_model_file(GPT)
    args = {"learned_positions": positions}
    model, chunk = _chunk(mf, args, 0, 4, True, True, tp_mesh, sp)
    assert isinstance(chunk.embed.tokens.weight, DTensor) and chunk.embed.tokens.weight.placements == (Shard(0),)
    assert isinstance(chunk.head.out.weight, DTensor) and chunk.head.out.weight.placements == (Shard(0),)
    x, y = mf.hook("batch")(2, model=model, seed=1)
    out = chunk(x)
    assert isinstance(out, DTensor) and out.placements[0].is_shard(out.ndim - 1)  # vocab-sharded logits
    loss_fn = plain_loss(mf.hook("loss"))
    with loss_parallel():
        loss = loss_fn(out, y)
        loss.backward()
    assert not isinstance(loss, DTensor)
    expected = mf.hook("loss")(model(x), y)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert chunk.head.out.weight.grad is not None


def test_middle_and_last_chunks_skip_the_parts_they_lack(tp_mesh):
    from torch.distributed.tensor import DTensor

    mf = load_model_file(GPT)
    _, middle = _chunk(mf, {}, 1, 3, False, False, tp_mesh, True)
    assert middle.embed is None and middle.head is None
    assert present_styles(middle, mf.hook("tp_plan_outer")(middle, sequence_parallel=True)) == {}
    _, last = _chunk(mf, {}, 3, 4, False, True, tp_mesh, True)
    assert last.embed is None and isinstance(last.head.out.weight, DTensor)
    h = torch.randn(2, 16, 32)
    assert isinstance(last(h), DTensor)


def test_loss_parallel_follows_the_outer_plan():
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    mf = load_model_file(GPT)
    meta = mf.build({}, device="meta")
    assert shards_logits(mf.hook("tp_plan_outer")(meta, sequence_parallel=False))
    assert not shards_logits({"head": ColwiseParallel(output_layouts=Shard(-1)), "embed": RowwiseParallel()})


def test_sequence_parallel_needs_an_outer_plan(tp_mesh):
    mf = load_model_file(MLP)
    assert mf.hook("tp_plan_outer") is None
    plan, _ = resolve_plan("tp=2,sp=1,mbs=1,gbs=2", model=MLP)
    with pytest.raises(PlanMismatchError, match="tp_plan_outer"):
        validate_plan(plan, mf)
    model = mf.build({}, device="cpu")
    layout = find_layout(model)
    blocks = [m for _, m in owned_blocks(model, layout)]
    with pytest.raises(ValueError, match="tp_plan_outer"):
        apply_tp(model, blocks, tp_mesh, mf.hook("tp_plan"), None, True)
    # without SP the blocks are sharded and the rest stays replicated
    apply_tp(model, blocks, tp_mesh, mf.hook("tp_plan"), None, False)
    assert not hasattr(model.head.weight, "placements") and hasattr(blocks[0].fc1.weight, "placements")
    x, y = mf.hook("batch")(2, model=model, seed=0)
    assert F.cross_entropy(model(x), y).isfinite()


def test_validate_checks_the_outer_plan(tmp_path):
    source = (EXAMPLES / "gpt.py").read_text()
    path = tmp_path / "gpt_bad.py"
    path.write_text(source + '\n\ndef tp_plan_outer(model, sequence_parallel=False):\n'
                    '    from torch.distributed.tensor.parallel import ColwiseParallel\n'
                    '    return {"head.nope": ColwiseParallel()}\n')
    mf = load_model_file(f"{path}:tiny")
    plan, _ = resolve_plan("tp=2,mbs=1,gbs=2", model=f"{path}:tiny")
    with pytest.raises(PlanMismatchError, match="head.nope"):
        validate_plan(plan, mf)
    gpt = load_model_file(GPT)
    plan, _ = resolve_plan("tp=4,mbs=1,gbs=2", model=GPT, model_args={"vocab": 66})
    with pytest.raises(PlanMismatchError, match="vocab|66 features"):
        validate_plan(plan, gpt)
