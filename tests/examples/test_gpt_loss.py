"""examples/gpt.py loss="chunked": the same loss and gradients as the fp32 default, and the
profile (hence the memory model) counts what each loss keeps for backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from examples import gpt


def test_chunked_cross_entropy_matches_f_cross_entropy_with_ignored_tokens():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(23, 11, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (23,), generator=gen)
    targets[[2, 9, 17]] = -100  # F.cross_entropy's default ignore_index
    ref = F.cross_entropy(logits, targets)
    (g_ref,) = torch.autograd.grad(ref * 3.0, logits)
    got = gpt.chunked_cross_entropy(logits, targets, chunk_tokens=5)  # 5 chunks, the last partial
    (g_got,) = torch.autograd.grad(got * 3.0, logits)
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g_got, g_ref, rtol=1e-6, atol=1e-7)


def _loss_and_grads(loss: str):
    torch.manual_seed(0)
    model = gpt.tiny(loss=loss)  # fp32 weights
    x, y = gpt.batch(40, model)  # 640 tokens: 3 chunks of CHUNK_TOKENS
    value = gpt.loss(model(x), y)
    assert ("Chunked" in type(value.grad_fn).__name__) == (loss == "chunked")
    value.backward()
    return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_chunked_model_gives_the_default_loss_and_gradients():
    assert 40 * gpt.tiny().config.seq_len > 2 * gpt.CHUNK_TOKENS
    ref, g_ref = _loss_and_grads("fp32")
    got, g_got = _loss_and_grads("chunked")
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert g_got.keys() == g_ref.keys()
    for name in g_ref:
        torch.testing.assert_close(g_got[name], g_ref[name], rtol=1e-4, atol=1e-6, msg=name)


def test_chunked_keeps_only_the_bf16_logits_and_writes_a_bf16_gradient():
    logits = torch.randn(600, 50, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 50, (600,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        value = gpt.chunked_cross_entropy(logits, targets)
    assert {t.dtype for t in saved} == {torch.bfloat16, torch.int64}  # no fp32 logits kept
    assert sum(t.numel() for t in saved if t.is_floating_point()) == logits.numel()
    value.backward()
    assert logits.grad.dtype == torch.bfloat16
    ref = F.cross_entropy(logits.detach().float().requires_grad_(), targets)
    assert value.item() == pytest.approx(ref.item(), rel=1e-5)


def test_unknown_loss_is_refused_in_one_line():
    with pytest.raises(ValueError, match="loss must be one of fp32, chunked"):
        gpt.model(loss="fused")


def test_profile_counts_what_each_loss_keeps():
    from smplan.hwprofiles import load_cluster
    from smplan.planner import profile_model
    from smplan.planner.memory_model import chunk_memory

    # 512 tokens a sample: two of the chunked loss's 256-token chunks
    args = dict(layers=1, hidden=64, heads=2, seq_len=512, vocab=512, dropout=0.0)
    logits = 512 * 512  # per sample
    total = {}
    for loss in ("fp32", "chunked"):
        p = profile_model("examples/gpt.py", {**args, "loss": loss}, cache=False)
        (loss_part,) = [b for b in p.post if b.name == "loss"]
        head = next(b for b in p.post if b.name != "loss")
        assert head.output_bytes_per_sample == 2 * logits  # bf16 logits
        # fp32: the fp32 log-softmax (4 B per logit); chunked: only the targets (8 B per token)
        expect = 4 * logits if loss == "fp32" else 0
        assert loss_part.saved_bytes_per_sample == pytest.approx(expect, abs=8 * 512 + 64)
        for stack in ("torchtitan", "megatron-core"):
            m = chunk_memory(p, load_cluster("a100x8", nodes=1, stack=stack), tp=1, dp=1, sp=False, zero=0,
                             micro_batch=2, flight=1.0, recompute="none", first=False, last=True,
                             device_first_chunk=False, dtype="bf16")
            total[loss, stack] = m.act0 + m.buffers
    # The loss's share of the last stage where the stack runs the file's loss (torchtitan): the fp32
    # loss's backward peak, 12 B per logit, against the chunked loss's logits and gradient (4 B)
    # beside one chunk's fp32 temporaries (about 14 B per logit of its 256 tokens), per micro-batch.
    chunk = 14 * 256 * 512
    assert total["fp32", "torchtitan"] - total["chunked", "torchtitan"] == pytest.approx(
        2 * 12 * logits - (2 * 4 * logits + chunk), rel=0.05)
    # Megatron's in-place vocab-parallel loss whatever the file's: 3x the bf16 logits for both
    assert total["fp32", "megatron-core"] == pytest.approx(total["chunked", "megatron-core"], rel=1e-3)


@pytest.mark.parametrize("plan", [pytest.param("dp=2,zero=3,mbs=2,gbs=4", marks=pytest.mark.slow), pytest.param("tp=2,mbs=2,gbs=4", marks=pytest.mark.slow)])
def test_executor_trains_with_the_chunked_loss_to_the_same_loss(tmp_path, plan):
    """FSDP runs the chunked loss (512 tokens: 2 chunks); tp=2 hands it vocab-sharded logits, which
    it chunks under loss_parallel. Either way the step's loss is the default's."""
    from tests.executor.runs import metrics, run_execute

    losses = {}
    for loss in ("fp32", "chunked"):
        out = tmp_path / loss
        result = run_execute(plan, out, "--steps", "1", "--arg", "seq_len=256", "--arg", f"loss={loss}", timeout=180)
        assert result.returncode == 0, result.stdout[-3000:]
        losses[loss] = metrics(out)[0]["loss"]
    assert losses["chunked"] == pytest.approx(losses["fp32"], rel=1e-5)


def _sharded_chunked_worker(rank: int, world: int, spec: str, init_file: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    from tests.executor.gloo_group import gloo_group

    with gloo_group(init_file, rank, world):
        gen = torch.Generator().manual_seed(0)
        logits = torch.randn(2, 300, 12, generator=gen, dtype=torch.float64)  # 600 tokens: 3 chunks
        targets = torch.randint(0, 12, (2, 300), generator=gen)
        targets[0, [2, 17]] = -100
        ref_logits = logits.clone().requires_grad_()
        ref = F.cross_entropy(ref_logits.flatten(0, 1), targets.flatten(0, 1))
        ref.backward()
        sharded = distribute_tensor(logits, init_device_mesh("cpu", (world,)), [Shard(2)]).requires_grad_()
        outputs = sharded * 1.0
        outputs.smplan_loss = "chunked"  # what the model sets on its logits (GPT.forward)
        with loss_parallel():
            value = gpt.loss(outputs, targets)
            assert "Chunked" in type(value.grad_fn).__name__
            value.backward()
        assert sharded.grad.placements == (Shard(2),)  # each rank wrote only its vocab columns
        torch.testing.assert_close(value.full_tensor().double(), ref.detach(), rtol=1e-6, atol=1e-6)  # fp32 total
        torch.testing.assert_close(sharded.grad.full_tensor(), ref_logits.grad, rtol=1e-6, atol=1e-9)


def test_chunked_loss_takes_vocab_sharded_logits(tmp_path):
    """tp > 1: the head's logits reach the loss as a vocab-sharded DTensor; the chunked loss still
    chunks them, under loss_parallel: what the memory model prices (its temporaries split by tp)."""
    from tests.executor.runs import spawn_workers

    spawn_workers(_sharded_chunked_worker, 2, "", tmp_path, timeout_s=120)
