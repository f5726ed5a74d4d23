"""Acceptance, for real: 2 gloo processes run a plan with --tensorboard; the event files
hold the scalars and the block histogram; `smplan monitor --json` names a rank slowed by
the SMPLAN_SLOW_RANK hook as the straggler, and no rank without it."""

from __future__ import annotations

import json

import pytest

from smplan.cli.main import cli
from tests.executor.runs import GPT_TINY, metrics, run_execute
from tests.monitor.fake_runs import PREDICTED

STEPS = 6
PLAN = {"model": GPT_TINY, "hw": "local", "nodes": 1, "dp": 2, "tp": 1, "pp": 1, "micro_batch": 1, "global_batch": 4,
        "dtype": "fp32", "predicted": PREDICTED}


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    """dp=2 for 6 steps with --tensorboard and block norms every 2 steps (a plan file, so
    there is a predicted step time to draw next to the measured one)."""
    root = tmp_path_factory.mktemp("monitored")
    plan = root / "plan.json"
    plan.write_text(json.dumps(PLAN))
    out = root / "run"
    result = run_execute(str(plan), out, "--steps", str(STEPS), "--tensorboard", "--grad-norms-every", "2")
    assert result.returncode == 0, result.stdout
    return out


@pytest.fixture(scope="module")
def slowed(tmp_path_factory):
    out = tmp_path_factory.mktemp("slowed") / "run"
    result = run_execute("dp=2,mbs=1,gbs=4", out, "--steps", str(STEPS), "--grad-norms-every", "0",
                         env={"SMPLAN_SLOW_RANK": "1:0.1"})
    assert result.returncode == 0, result.stdout
    return out


def _monitor_json(cli_runner, run_dir) -> dict:
    result = cli_runner.invoke(cli, ["monitor", str(run_dir), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_tensorboard_event_files(monitored):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(monitored / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    for tag in ("loss", "grad_norm", "tokens_per_s", "peak_memory_gib", "step_time_s/measured",
                "step_time_s/predicted", "phases_s/forward", "phases_s/optimizer"):
        assert tag in tags["scalars"], tag
    records = metrics(monitored)
    measured = acc.Scalars("step_time_s/measured")
    assert [e.step for e in measured] == list(range(1, STEPS + 1))
    assert [e.value for e in measured] == pytest.approx([r["step_time_s"] for r in records], rel=1e-6)
    predicted = [e.value for e in acc.Scalars("step_time_s/predicted")]
    assert predicted == pytest.approx([PREDICTED["step_time_s"]] * STEPS)
    assert [e.value for e in acc.Scalars("loss")] == pytest.approx([r["loss"] for r in records], rel=1e-6)
    hists = acc.Histograms("grad_norm/blocks")
    assert [h.step for h in hists] == [1, 2, 4, 6]
    assert all(h.histogram_value.num == 4 for h in hists)  # gpt tiny has 4 blocks


def test_records_per_step_and_per_rank(monitored):
    records = metrics(monitored)
    for r in records:  # the keys metrics.jsonl always had are still there
        assert {"step", "loss", "step_time_s", "tokens_per_s", "samples_per_s", "peak_memory_gib",
                "grad_norm"} <= set(r)
    assert [r["step"] for r in records if "block_grad_norms" in r] == [1, 2, 4, 6]
    for rank in (0, 1):
        lines = (monitored / "ranks" / f"rank-{rank:05d}.jsonl").read_text().splitlines()
        per_rank = [json.loads(line) for line in lines]
        assert [r["step"] for r in per_rank] == list(range(1, STEPS + 1))
        for r in per_rank:
            assert r["rank"] == rank and r["peak_memory_source"] == "rss" and r["peak_memory_gib"] > 0
            assert {"forward", "backward", "grad_clip", "optimizer"} <= set(r["phases_s"])
            assert sum(r["phases_s"].values()) + r["sync_wait_s"] <= r["step_time_s"] * 1.01 + 1e-4


def test_no_straggler_without_the_hook(cli_runner, monitored):
    status = _monitor_json(cli_runner, monitored)
    assert status["stragglers"] == []
    assert status["finished"] and status["steps_done"] == STEPS and status["progress"] == 1.0
    assert status["step_time_s"]["predicted"] == PREDICTED["step_time_s"]
    assert sorted(status["memory"]["peak_gib_by_rank"]) == ["0", "1"]


def test_slow_rank_is_named_as_straggler(cli_runner, slowed):
    status = _monitor_json(cli_runner, slowed)
    assert [s["rank"] for s in status["stragglers"]] == [1], status["ranks"]
    assert status["stragglers"][0]["steps"] >= 3
    text = cli_runner.invoke(cli, ["monitor", str(slowed)]).output
    assert "warning: rank 1 is a straggler" in text


def test_report_of_a_real_run(cli_runner, monitored, tmp_path):
    out = tmp_path / "report.html"
    result = cli_runner.invoke(cli, ["report", str(monitored), "-o", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    for chart in ("loss", "step_time", "memory", "grad_norms"):
        assert f'id="chart-{chart}"' in html, chart
