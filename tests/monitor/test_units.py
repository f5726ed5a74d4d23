"""Pure parts of smplan.monitor: sparkline, straggler detection, memory warnings, reading
run directories that are being written (or were cut short)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smplan.monitor import (
    RunDirError,
    Thresholds,
    find_stragglers,
    follow,
    load_run,
    memory_over_prediction,
    own_step_times,
    read_jsonl,
    render_status,
    run_status,
    sparkline,
)
from smplan.monitor.sparkline import BARS
from tests.monitor.fake_runs import PREDICTED, write_run

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


# -- sparkline ------------------------------------------------------------------------------
@given(st.lists(finite, min_size=1, max_size=200), st.integers(min_value=1, max_value=60))
def test_sparkline_length_and_characters(values, width):
    line = sparkline(values, width)
    assert len(line) == min(len(values), width)
    assert set(line) <= set(BARS)


@given(st.lists(finite, min_size=2, max_size=100))
def test_sparkline_keeps_order(values):
    """Sorted values give non-decreasing bars; the extremes get the lowest and highest bar."""
    line = sparkline(sorted(values), width=len(values))
    assert list(line) == sorted(line, key=BARS.index)
    if min(values) < max(values):
        assert line[0] == BARS[0] and line[-1] == BARS[-1]


def test_sparkline_constant_missing_and_empty():
    assert sparkline([3.0, 3.0, 3.0]) == BARS[3] * 3
    assert sparkline([1.0, None, 2.0]) == BARS[0] + " " + BARS[-1]
    assert sparkline([None, float("nan")]) == "  "
    assert sparkline([]) == ""


# -- stragglers -----------------------------------------------------------------------------
def test_own_step_times_subtract_the_wait_from_the_median_step():
    assert own_step_times([0.14, 0.15], [0.1, 0.0]) == pytest.approx([0.045, 0.145])


def _times(steps: int, ranks: int, slow: dict[int, range] | None = None, seed: int = 0) -> list[list[float]]:
    rng = random.Random(seed)
    rows = [[0.1 * (1 + 0.02 * rng.random()) for _ in range(ranks)] for _ in range(steps)]
    for rank, where in (slow or {}).items():
        for i in where:
            rows[i][rank] *= 1.5
    return rows


def test_straggler_needs_n_consecutive_steps():
    times = _times(10, 4, {2: range(3, 6)})
    found = find_stragglers(times, threshold_pct=20, min_steps=3)
    assert [(s.rank, s.first_step, s.last_step, s.steps, s.ongoing) for s in found] == [(2, 4, 6, 3, False)]
    assert found[0].excess_pct == pytest.approx(50, abs=3)
    assert find_stragglers(times, threshold_pct=20, min_steps=4) == []
    assert find_stragglers(times, threshold_pct=60, min_steps=1) == []


def test_straggler_reports_longest_streak_and_ongoing():
    times = _times(12, 3, {0: [1, 2, 5, 6, 7, 8, 9, 10, 11]})
    (found,) = find_stragglers(times, 20, 2, steps=list(range(101, 113)), ranks=[7, 8, 9])
    assert (found.rank, found.first_step, found.last_step, found.ongoing) == (7, 106, 112, True)


@settings(max_examples=60)
@given(st.integers(1, 12), st.integers(1, 6), st.integers(0, 1000), st.floats(0.1, 100.0),
       st.floats(0, 80), st.integers(1, 4))
def test_straggler_invariants(steps, ranks, seed, scale, pct, n):
    """Scaling every time changes nothing; permuting ranks permutes the answer; equal
    times have no straggler; every reported streak is at least n steps long."""
    rng = random.Random(seed)
    times = [[rng.uniform(0.05, 0.2) for _ in range(ranks)] for _ in range(steps)]
    base = find_stragglers(times, pct, n)
    scaled = find_stragglers([[t * scale for t in row] for row in times], pct, n)
    assert [(s.rank, s.first_step, s.steps) for s in scaled] == [(s.rank, s.first_step, s.steps) for s in base]
    perm = list(range(ranks))
    rng.shuffle(perm)
    permuted = find_stragglers([[row[p] for p in perm] for row in times], pct, n, ranks=perm)
    assert sorted((s.rank, s.first_step) for s in permuted) == sorted((s.rank, s.first_step) for s in base)
    assert all(s.steps >= n and s.excess_pct > pct - 1e-9 for s in base)
    assert find_stragglers([[0.1] * ranks for _ in range(steps)], pct, n) == []


def test_memory_over_prediction():
    assert memory_over_prediction({0: 1.05, 1: 1.3}, 1.0, 10) == pytest.approx({1: 30.0})
    assert memory_over_prediction({0: 9.0}, None, 10) == {}


# -- reading run directories ----------------------------------------------------------------
def test_read_jsonl_skips_a_truncated_last_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n" + "not json\n" + json.dumps({"step": 2}) + '\n{"step": 3, "lo')
    records, skipped = read_jsonl(path)
    assert [r["step"] for r in records] == [1, 2] and skipped == [2, 4]
    assert read_jsonl(tmp_path / "absent.jsonl") == ([], [])


@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=20), st.integers(1, 40))
def test_read_jsonl_any_cut_keeps_the_whole_lines(tmp_path_factory, steps, cut):
    """However much of the last line was written, the whole lines before it are read."""
    path = tmp_path_factory.mktemp("cut") / "m.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in steps]
    last = lines[-1][: min(cut, len(lines[-1]) - 1)]
    path.write_text("".join(line + "\n" for line in lines[:-1]) + last)
    records, skipped = read_jsonl(path)
    assert [r["step"] for r in records] == steps[:-1]
    assert len(skipped) == (1 if last.strip() else 0)


def test_load_run_errors(tmp_path):
    with pytest.raises(RunDirError, match="does not exist"):
        load_run(tmp_path / "nope")
    with pytest.raises(RunDirError, match="is not a run directory"):
        load_run(tmp_path)
    (tmp_path / "run_config.json").write_text("{}")
    with pytest.raises(RunDirError, match="no metrics.jsonl"):
        load_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "lo')
    with pytest.raises(RunDirError, match="holds no step yet"):
        load_run(tmp_path)


# -- status ---------------------------------------------------------------------------------
def test_status_names_the_slow_rank(tmp_path):
    status = run_status(load_run(write_run(tmp_path / "r", steps=6, ranks=4, slow_rank=2)))
    assert [s["rank"] for s in status["stragglers"]] == [2]
    assert status["stragglers"][0]["first_step"] == 2  # the first step is warm-up
    assert any("rank 2 is a straggler" in w for w in status["warnings"])
    assert status["progress"] == 1.0 and status["finished"]
    assert status["step_time_s"]["ratio"] == pytest.approx(0.09 / 0.05)


def test_validation_loss_and_lr_in_the_status_and_the_view(tmp_path):
    plain = run_status(load_run(write_run(tmp_path / "plain", steps=6)))
    assert plain["val_loss"] is None and plain["lr"] is None  # older runs record neither
    assert "val loss" not in render_status(plain) and "  lr " not in render_status(plain)
    status = run_status(load_run(write_run(tmp_path / "r", steps=8, val_every=3, lr_warmup=4)))
    val = status["val_loss"]
    assert (val["first_step"], val["last_step"], val["best_step"]) == (3, 6, 3)
    assert val["first"] == pytest.approx(4.7) and val["last"] == pytest.approx(4.76) and len(val["sparkline"]) == 2
    lr = status["lr"]
    assert lr["first"] == pytest.approx(2.5e-4) and lr["peak"] == pytest.approx(1e-3)
    assert lr["last"] == pytest.approx(1e-3 / 16) and lr["schedule"] == "cosine" and lr["warmup_steps"] == 4
    # stopped in warmup: the peak is the run's --lr, not the highest lr reached so far
    early = run_status(load_run(write_run(tmp_path / "early", steps=2, lr_warmup=4)))["lr"]
    assert early["peak"] == pytest.approx(1e-3) and early["last"] == pytest.approx(5e-4)
    text = render_status(status)
    assert "val loss    4.7000 (step 3) -> 4.7600 (step 6), best 4.7000 at step 3" in text
    assert "lr          6.25e-05 now (peak 0.001, 4 warmup steps, then cosine)" in text


def test_status_even_run_and_rss_not_compared(tmp_path):
    status = run_status(load_run(write_run(tmp_path / "r", memory_gib=5.0, memory_source="rss")))
    assert status["stragglers"] == [] and status["warnings"] == []
    assert status["memory"]["compared"] is False
    text = render_status(status)
    assert "(CPU: process RSS, which the plan's GPU memory does not predict)" in text and "predicted peak" not in text


def test_status_memory_above_prediction_on_gpu(tmp_path):
    run = load_run(write_run(tmp_path / "r", memory_gib=1.3, memory_source="cuda_allocator"))
    status = run_status(run, Thresholds(memory_pct=10))
    assert sorted(status["memory_over_prediction_pct"]) == [0, 1]
    assert sum("above the predicted" in w for w in status["warnings"]) == 2
    assert run_status(run, Thresholds(memory_pct=40))["warnings"] == []


def test_a_tiny_model_is_not_flagged_for_what_no_model_counts(tmp_path):
    """0.1 GiB measured against a 0.001 GiB prediction is 10000% over, but only by the cuBLAS
    workspaces and such that MEMORY_SLACK_GIB covers."""
    run = load_run(write_run(tmp_path / "r", memory_gib=0.1, memory_source="cuda_allocator"))
    run.config["plan"]["predicted"] = {**run.predicted, "peak_memory_gib": 0.001}
    assert run_status(run, Thresholds(memory_pct=10))["warnings"] == []


def test_memory_is_compared_without_the_predicted_reserve(tmp_path):
    """The plan's peak counts a reserve (CUDA context, fragmentation) the allocator's peak never
    sees: 1.3 GiB measured against 3.0 predicted of which 2.0 reserve is 30% over, not 57% under."""
    run = load_run(write_run(tmp_path / "r", memory_gib=1.3, memory_source="cuda_allocator"))
    run.config["plan"]["predicted"] = {**run.predicted, "peak_memory_gib": 3.0,
                                       "memory_breakdown_gib": {"reserve": 2.0}}
    assert run.predicted_allocated_gib == pytest.approx(1.0)
    status = run_status(run, Thresholds(memory_pct=10))
    assert sorted(status["memory_over_prediction_pct"]) == [0, 1]
    assert all("1.00 GiB (allocated" in w for w in status["warnings"] if "memory" in w)


def test_status_of_a_run_in_progress(tmp_path):
    run = load_run(write_run(tmp_path / "r", steps=3, total_steps=10, finished=False))
    status = run_status(run)
    assert status["progress"] == pytest.approx(0.3) and not status["finished"]
    assert "step 3/10" in render_status(status)


def test_thresholds_are_checked():
    with pytest.raises(ValueError, match="straggler-steps"):
        Thresholds(straggler_steps=0)


def test_follow_waits_for_the_first_step_then_stops_when_finished(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    seen = []

    def sleep(_):  # the run makes progress while we sleep
        write_run(run_dir, steps=2 + len(seen), total_steps=4, finished=len(seen) >= 2)

    last = follow(run_dir, lambda run: seen.append(None if run is None else run.records[-1]["step"]),
                  interval_s=0, sleep=sleep)
    assert seen == [None, 3, 4] and last.finished
    # a folder that does not exist yet: waited for (execute creates it after its start-up), then an error
    late, shown = tmp_path / "late", []

    def appear(_):
        if len(shown) == 2:
            write_run(late, steps=2, total_steps=2)

    assert follow(late, shown.append, interval_s=1.0, sleep=appear).finished and shown[:2] == [None, None]
    waited = []
    with pytest.raises(RunDirError, match="did not appear in 30 s of waiting"):
        follow(tmp_path / "missing", waited.append, interval_s=10.0, sleep=lambda _: None)
    assert len(waited) == 3  # 0, 10 and 20 s: then 30 s have passed


def test_view_of_many_ranks_and_of_a_run_without_per_rank_records(tmp_path):
    text = render_status(run_status(load_run(write_run(tmp_path / "many", ranks=20, slow_rank=13))))
    assert "16 of 20 ranks" in text and "max 0.69 (rank 19)" in text
    assert text.index("\n    13 ") < text.index("\n     0 ")  # the straggler's row comes first
    old = write_run(tmp_path / "old")
    for file in (old / "ranks").iterdir():
        file.unlink()
    status = run_status(load_run(old))
    assert status["ranks"] == [] and status["stragglers"] == []
    assert "max over ranks 0.50" in render_status(status) and "predates" in render_status(status)


def test_a_model_without_sequences_is_watched_in_samples_per_second(tmp_path):
    """An image model counts one token per sample: execute prints samples/s (executor.metrics.rate_key),
    and monitor said tokens/s beside the plan's samples/s."""
    run_dir = write_run(tmp_path / "images", steps=4, finished=False)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({**r, "tokens_per_s": r["samples_per_s"]}) + "\n"
                                                   for r in lines))
    status = run_status(load_run(run_dir))
    assert status["throughput"]["key"] == "samples_per_s" and status["throughput"]["unit"] == "samples/s"
    assert status["throughput"]["predicted"] == PREDICTED["samples_per_s"]
    assert "samples/s   median 100   predicted 80" in render_status(status)
    tokens = run_status(load_run(write_run(tmp_path / "tokens", steps=4)))  # 16 tokens a sample
    assert tokens["throughput"]["unit"] == "tokens/s" and "tokens/s    median 1,600" in render_status(tokens)
    # the summary's record of what execute reported wins
    (run_dir / "summary.json").write_text(json.dumps({"steps": 4, "throughput_key": "tokens_per_s"}))
    assert run_status(load_run(run_dir))["throughput"]["key"] == "tokens_per_s"


def test_the_all_clear_line_claims_no_memory_check_it_did_not_make(tmp_path):
    """A CPU run's RSS is not held against the GPU prediction: its all-clear line said it had no
    memory above the prediction (a new user's review)."""
    cpu = render_status(run_status(load_run(write_run(tmp_path / "cpu", steps=4))))
    assert "no straggler (>" in cpu and "memory above the prediction" not in cpu
    gpu = run_status(load_run(write_run(tmp_path / "gpu", steps=4, memory_source="cuda_allocator")))
    assert gpu["memory"]["compared"] and "and no memory above the prediction (>" in render_status(gpu)
