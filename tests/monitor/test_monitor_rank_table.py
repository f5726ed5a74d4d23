"""`smplan monitor`'s rank table adds up: step time = own time + waited, on every row."""

from __future__ import annotations

import json
import re

import pytest

from smplan.monitor import load_run, render_status, run_status

# Two ranks whose waits are skewed (mostly short, now and then long), as on a real run: the
# medians of step, own time and wait taken one by one did not add up (12.8 ms = 10.5 + 0.3).
STEPS = [(0.030, 0.020, 0.0100, 0.0004), (0.018, 0.016, 0.0021, 0.0004), (0.020, 0.016, 0.0022, 0.0050),
         (0.015, 0.016, 0.0003, 0.0060), (0.019, 0.017, 0.0025, 0.0004), (0.025, 0.024, 0.0090, 0.0003),
         (0.017, 0.016, 0.0002, 0.0005)]  # (rank 0 step, rank 1 step, rank 0 wait, rank 1 wait) seconds
ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+([\d.]+) ms\s+([\d.]+) ms\s+([\d.]+) ms\s+[\d.]+$")


def _write(run_dir):
    (run_dir / "ranks").mkdir(parents=True)
    (run_dir / "run_config.json").write_text(json.dumps({"plan": {"dp": 2}, "steps": len(STEPS)}))
    with (run_dir / "metrics.jsonl").open("w") as metrics:
        for step, row in enumerate(STEPS, start=1):
            metrics.write(json.dumps({"step": step, "loss": 1.0, "step_time_s": row[0], "tokens_per_s": 1.0,
                                      "peak_memory_gib": 0.3, "grad_norm": 1.0}) + "\n")
    for rank in (0, 1):
        with (run_dir / "ranks" / f"rank-{rank:05d}.jsonl").open("w") as fh:
            for step, row in enumerate(STEPS, start=1):
                fh.write(json.dumps({"step": step, "rank": rank, "step_time_s": row[rank], "sync_wait_s": row[2 + rank],
                                     "tokens_per_s": 1.0, "peak_memory_gib": 0.3, "peak_memory_source": "rss",
                                     "loss": 1.0, "grad_norm": 1.0}) + "\n")
    return run_dir


def test_every_rank_row_adds_up_as_printed(tmp_path):
    status = run_status(load_run(_write(tmp_path / "run")))
    rows = [ROW.match(line) for line in render_status(status).splitlines()]
    rows = [m for m in rows if m]
    assert len(rows) == 2
    for m in rows:
        step, own, waited = (float(m.group(i)) for i in (3, 4, 5))
        assert step == pytest.approx(own + waited, abs=1e-9), m.group(0)


def test_the_json_rank_rows_add_up_and_own_time_is_what_straggler_detection_reads(tmp_path):
    status = run_status(load_run(_write(tmp_path / "run")))
    for row in status["ranks"]:
        assert row["step_time_s"] == pytest.approx(row["own_step_time_s"] + row["sync_wait_s"])
    # own time: the ranks' median step less the rank's wait, here averaged over steps 2..7
    steady = STEPS[1:]
    mean_step = sum((a + b) / 2 for a, b, _, _ in steady) / len(steady)
    assert status["ranks"][1]["own_step_time_s"] == pytest.approx(mean_step - sum(r[3] for r in steady) / len(steady))
