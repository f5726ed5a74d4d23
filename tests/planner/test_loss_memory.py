"""The loss's memory peak on the last stage: measured running the model file's loss on the meta
device (planner/loss_memory.py) for the stacks that run it as written, Megatron's in-place
vocab-parallel cross-entropy for the megatron stacks."""

from __future__ import annotations

import pytest
import torch
from smplan.hwprofiles import load_cluster
from smplan.planner import load_model_file, profile_model
from smplan.planner.loss_memory import loss_peak_bytes
from smplan.planner.memory_model import loss_buffer_bytes as buffer_bytes

from smplan.model.loss import default_loss
from tests.conftest import EXAMPLES

GPT = str(EXAMPLES / "gpt.py")


def _logits(b=2, s=1024, vocab=1000):
    return (torch.empty(b, s, vocab, device="meta", dtype=torch.bfloat16),
            torch.zeros(b, s, dtype=torch.long, device="meta"))


def test_an_fp32_cross_entropy_peaks_at_12_bytes_a_logit_in_its_backward():
    """F.cross_entropy(logits.float()): forward the bf16 logits, an fp32 copy and the fp32
    log-softmax (10 B); backward the saved log-softmax, nll_loss's and log_softmax's gradients
    (12 B), the logits gone (nothing holds them once the loss has read them)."""
    out, targets = _logits()
    per_sample, fixed = loss_peak_bytes(default_loss, out, targets)
    assert per_sample * 2 + fixed == pytest.approx(12 * out.numel(), rel=1e-3)


def test_a_chunked_loss_peaks_at_its_chunk():
    """examples/gpt.py's loss="chunked" keeps the bf16 logits through its backward (2 B), writes
    their bf16 gradient (2 B) and holds fp32 temporaries of CHUNK_TOKENS rows at a time, which do
    not grow with the batch (a review: the logits it saves were missed, and the temporaries of a
    one-sample profile were multiplied by the micro-batch)."""
    loss = load_model_file(GPT).hook("loss")
    out, targets = _logits(b=1, s=1024, vocab=4096)
    per_sample, fixed = loss_peak_bytes(loss, out, targets)
    assert per_sample == pytest.approx(12 * out.numel(), rel=1e-3) and fixed < 1e-3 * per_sample
    out.smplan_loss = "chunked"
    per_sample, fixed = loss_peak_bytes(loss, out, targets)
    assert per_sample == pytest.approx(4 * out.numel(), rel=1e-3)
    # one chunk's rows: the fp32 copy, log-softmax and gradient of 256 tokens, and the chunk's bf16 slice
    assert fixed == pytest.approx(14 * 256 * 4096, rel=0.05)


def test_the_stack_decides_how_the_last_stage_holds_the_loss():
    """Megatron's in-place vocab-parallel loss: 6 B a bf16 logit (the logits and one fp32 copy);
    a stack running the file's fp32 cross-entropy as written: its 12 B peak; both beside the
    loss's saved bytes the activations count, and / tp under a vocab-parallel head."""
    p = profile_model(GPT, dict(layers=2, hidden=64, heads=4, ffn=128, seq_len=64, vocab=512), cache=False)
    loss = next(q for q in p.post if q.name == "loss")
    logits = 64 * 512
    for stack, per_logit in (("megatron-core", 6), ("megatron-deepspeed", 6), ("torchtitan", 12), ("pytorch-fsdp", 12)):
        cl = load_cluster("h100x8", stack=stack)
        for tp in (1, 2):
            held = buffer_bytes(p, cl, tp, False, 1) + loss.saved_bytes_per_gpu(tp)
            assert held * tp == pytest.approx(per_logit * logits, rel=1e-2), (stack, tp)
    # a profile made before the measurement: the logits and their gradient, as before
    import dataclasses

    old = dataclasses.replace(p, post=tuple(dataclasses.replace(q, loss_peak_bytes_per_sample=0.0) for q in p.post))
    titan = load_cluster("h100x8", stack="torchtitan")
    assert buffer_bytes(old, titan, 1, False, 1) == pytest.approx(2 * 2 * logits, rel=1e-2)
