"""zero=2/3 with pp > 1 runs as ZeRO-1 (planner feasibility.effective_zero): the launch says so and
summary.json records what ran, beside what the plan asked for."""

from __future__ import annotations

import json

from smplan.executor.metrics import summarize
from smplan.executor.run import _zero_note, resolve_plan

from tests.executor.runs import GPT_TINY


def test_zero_3_under_pipelining_is_recorded_and_said_as_zero_1(tmp_path):
    plan, _ = resolve_plan("pp=2,dp=2,zero=3,mbs=1,gbs=4", model=GPT_TINY)
    assert _zero_note(plan).startswith("note: zero=3 runs as ZeRO-1 with pipeline stages (pp=2: the gradients and "
                                       "gathered parameters stay until the last micro-batch), as torchtitan runs it")
    assert _zero_note(plan).endswith("summary.json records zero: 1")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0, "step_time_s": 1.0, "tokens_per_s": 1.0,
                                                        "samples_per_s": 1.0, "peak_memory_gib": 0.5}) + "\n")
    ran = summarize(tmp_path, None, plan.to_dict(), "cpu")["plan"]
    assert (ran["zero"], ran["zero_planned"]) == (1, 3)
    flat, _ = resolve_plan("dp=2,zero=3,mbs=1,gbs=4", model=GPT_TINY)
    assert _zero_note(flat) is None and "zero_planned" not in summarize(tmp_path, None, flat.to_dict(), "cpu")["plan"]


def test_zero_1_without_pp_is_said_to_run_as_fsdps_zero_2():
    """FSDP2 has no ZeRO-1: the executor runs it with the parameters kept from forward to backward (a review)."""
    plan, _ = resolve_plan("dp=2,zero=1,mbs=1,gbs=4", model=GPT_TINY)
    assert _zero_note(plan).startswith("note: zero=1 without pipeline stages runs as FSDP2")
    alone, _ = resolve_plan("zero=1,mbs=1,gbs=4", model=GPT_TINY)
    assert _zero_note(alone) is None  # nothing to shard over
