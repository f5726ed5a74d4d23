"""A --data stream shorter than the run wraps around: the launch says how many epochs it reads."""

from __future__ import annotations

import numpy as np
from smplan.executor.config import RunConfig
from smplan.executor.run import _data_epochs_note
from smplan.planner import Plan


def _cfg(tmp_path, tokens: int, steps: int) -> RunConfig:
    path = tmp_path / "train.bin"
    np.arange(tokens, dtype=np.uint16).tofile(path)
    plan = Plan(model="m.py", hw="a100x8", nodes=1, dp=2, micro_batch=1, global_batch=4)
    return RunConfig(plan=plan.to_dict(), model_ref="m.py", out_dir=str(tmp_path / "run"), steps=steps,
                     data=str(path), data_seq_len=16)


def test_a_short_stream_says_how_many_epochs_the_run_reads(tmp_path):
    # 2000 tokens = 117 sequences of 17; 30 steps x 4 = 120 of them
    note = _data_epochs_note(_cfg(tmp_path, 2000, 30))
    assert note == (f"note: {tmp_path / 'train.bin'} holds 117 sequences of seq_len+1=17 tokens and 30 steps read "
                    "120: the stream wraps around, 1.03 epochs")
    assert _data_epochs_note(_cfg(tmp_path, 2000, 29)) is None  # 116 of 117: read once
