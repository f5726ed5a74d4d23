"""`smplan monitor` and `smplan report` on run directories written by hand: a missing or
empty directory is one line and exit 2; a truncated last line is skipped with one note."""

from __future__ import annotations

import json
import os

import pytest

from smplan.cli.main import cli
from tests.monitor.fake_runs import write_run


def _one_error_line(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.output


@pytest.mark.parametrize("command", ["monitor", "report"])
def test_missing_run_dir(cli_runner, tmp_path, command):
    _one_error_line(cli_runner.invoke(cli, [command, str(tmp_path / "nope")]), "does not exist")


def test_follow_on_a_folder_that_never_appears(cli_runner, tmp_path, monkeypatch):
    """--follow waits for the folder (execute creates it after its start-up), then says what is wrong."""
    import importlib

    monkeypatch.setattr(importlib.import_module("smplan.monitor.follow"), "APPEAR_WAIT_S", 0.1)
    result = cli_runner.invoke(cli, ["monitor", str(tmp_path / "nope"), "--follow", "--interval", "0.05"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == f"waiting for {tmp_path / 'nope'} to appear (smplan execute creates it as it starts) ..."
    assert lines[-1].startswith("error: run directory") and "did not appear in 0.1 s of waiting" in lines[-1]
    assert not any("Traceback" in line for line in lines) and not (tmp_path / "nope").exists()


@pytest.mark.parametrize("command", ["monitor", "report"])
def test_empty_run_dir(cli_runner, tmp_path, command):
    (tmp_path / "notes.txt").write_text("a folder no run used")
    _one_error_line(cli_runner.invoke(cli, [command, str(tmp_path)]),
                    f"{tmp_path} is not a run directory (no run_config.json, no metrics.jsonl)")
    (tmp_path / ".smplan.lock").write_text("pid 1 on host")  # a launch that has not written its config yet
    _one_error_line(cli_runner.invoke(cli, [command, str(tmp_path)]), "holds no step yet (no metrics.jsonl)")
    (tmp_path / "metrics.jsonl").write_text("")
    _one_error_line(cli_runner.invoke(cli, [command, str(tmp_path)]), "an empty metrics.jsonl")


def test_truncated_last_line_is_skipped_with_one_note(cli_runner, tmp_path):
    run = write_run(tmp_path / "r", steps=5, total_steps=8, finished=False)
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 6, "loss": 3.')
    result = cli_runner.invoke(cli, ["monitor", str(run)])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "skipped 1 unreadable line(s) (metrics.jsonl:6)" in notes[0]
    assert "step 5/8" in result.output
    status = json.loads(cli_runner.invoke(cli, ["monitor", str(run), "--json"], catch_exceptions=False).stdout)
    assert status["steps_done"] == 5 and status["skipped_lines"] == ["metrics.jsonl:6"]


def test_json_names_the_straggler_and_thresholds_apply(cli_runner, tmp_path):
    run = write_run(tmp_path / "r", steps=6, ranks=3, slow_rank=0)
    status = json.loads(cli_runner.invoke(cli, ["monitor", str(run), "--json"]).output)
    assert [s["rank"] for s in status["stragglers"]] == [0]
    assert status["thresholds"] == {"straggler_pct": 20.0, "straggler_steps": 3, "memory_pct": 10.0}
    lenient = cli_runner.invoke(cli, ["monitor", str(run), "--json", "--straggler-steps", "6"])
    assert json.loads(lenient.output)["stragglers"] == []  # 5 steps after the warm-up one


def test_follow_on_a_finished_run_draws_once(cli_runner, tmp_path):
    run = write_run(tmp_path / "r")
    result = cli_runner.invoke(cli, ["monitor", str(run), "--follow", "--json"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["finished"] is True


def test_follow_stops_on_a_run_its_launcher_recorded_as_stopped(cli_runner, tmp_path):
    from smplan.executor.metrics import clear_stopped, mark_stopped

    run = write_run(tmp_path / "r", steps=3, total_steps=8, finished=False)
    mark_stopped(run, "failed", "rank 1 exited with code 1: EOFError")
    result = cli_runner.invoke(cli, ["monitor", str(run), "--follow", "--json"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["stopped"]["reason"] == "failed"
    text = cli_runner.invoke(cli, ["monitor", str(run)]).output
    assert "stopped (failed)" in text and "rank 1 exited with code 1: EOFError" in text
    report = cli_runner.invoke(cli, ["report", str(run), "-o", str(tmp_path / "out.html")])
    assert report.exit_code == 0 and "(stopped: rank 1 exited" in (tmp_path / "out.html").read_text()
    clear_stopped(run)  # what a new launch in the folder does first (tests/executor/test_units.py)
    status = json.loads(cli_runner.invoke(cli, ["monitor", str(run), "--json"]).output)
    assert status["stopped"] is None and status["running"] is None
    assert "unfinished: no launch holds it here" in cli_runner.invoke(cli, ["monitor", str(run)]).output
    from smplan.executor.run_lock import holding_run_dir

    with holding_run_dir(run):  # what a live launch holds (executor/run_lock.py)
        live = cli_runner.invoke(cli, ["monitor", str(run)]).output
        assert json.loads(cli_runner.invoke(cli, ["monitor", str(run), "--json"]).output)["running"].startswith("pid ")
    assert f"running (pid {os.getpid()} on " in live, live


def test_follow_stops_on_a_run_whose_launcher_on_this_host_was_killed(cli_runner, tmp_path):
    """SIGKILL leaves the lock file (no lock) and no record: --follow redrew forever (a review)."""
    import socket

    from smplan.executor.run_lock import LOCK_FILE

    run = write_run(tmp_path / "r", steps=3, total_steps=8, finished=False)
    (run / LOCK_FILE).write_text(f"pid 999999999 on {socket.gethostname()}, since 2026-12-06 10:00:00")
    result = cli_runner.invoke(cli, ["monitor", str(run), "--follow", "--json"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["abandoned"].startswith("pid 999999999 on ")
    assert "ended without a record: its launch (pid 999999999 on" in cli_runner.invoke(cli, ["monitor", str(run)]).output
    # a launch that takes no lock (local nodes sharing the folder) removes it first: its run is not that one
    from smplan.executor.run_lock import forget_abandoned_lock

    forget_abandoned_lock(run)
    assert not (run / LOCK_FILE).exists()
    # another host's launch may hold a lock this host cannot see: nothing is concluded, nothing removed
    (run / LOCK_FILE).write_text("pid 12 on another-host-of-the-job, since 2026-12-06 10:00:00")
    status = json.loads(cli_runner.invoke(cli, ["monitor", str(run), "--json"]).output)
    assert status["abandoned"] is None
    assert "unfinished: no launch holds it here" in cli_runner.invoke(cli, ["monitor", str(run)]).output
    forget_abandoned_lock(run)
    assert (run / LOCK_FILE).exists()
    # killed before its first step: --follow says so once, not "wait for the first step" forever
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "run_config.json").write_text(json.dumps({"plan": {}, "fingerprint": "a", "steps": 6}))
    (empty / LOCK_FILE).write_text(f"pid 999999999 on {socket.gethostname()}, since 2026-12-06 10:00:00")
    result = cli_runner.invoke(cli, ["monitor", str(empty), "--follow", "--interval", "0.01"])
    assert result.exit_code == 2 and "killed before the first step?" in result.output, result.output


def test_a_run_that_stopped_before_its_first_step_is_not_waited_for(cli_runner, tmp_path):
    """monitor shows its status (exit 0, no waiting under --follow); report has nothing to draw."""
    from smplan.executor.metrics import mark_stopped

    run = tmp_path / "r"
    run.mkdir()
    (run / "run_config.json").write_text(json.dumps({"plan": {}, "fingerprint": "a", "steps": 6}))
    mark_stopped(run, "failed", "rank 0 exited with code 1: error: no checkpoint of this run could be read")
    for args in ([], ["--follow"]):
        result = cli_runner.invoke(cli, ["monitor", str(run), *args])
        assert result.exit_code == 0, result.output
        assert "stopped (failed)" in result.output and "rank 0 exited with code 1" in result.output
        assert "step 0/6" in result.output and "stopped before its first step: nothing was measured" in result.output
    as_json = json.loads(cli_runner.invoke(cli, ["monitor", str(run), "--follow", "--json"]).output)
    assert as_json["stopped"]["reason"] == "failed" and as_json["steps_done"] == 0 and not as_json["finished"]
    report = cli_runner.invoke(cli, ["report", str(run), "-o", str(tmp_path / "r.html")])
    assert report.exit_code == 2 and "the run stopped before its first one (failed: rank 0 exited" in report.output
    (run / "stopped.json").write_text('{"reason": "failed"}')  # no detail: still no KeyError
    assert "stopped (failed)" in cli_runner.invoke(cli, ["monitor", str(run)]).output


def test_text_view(cli_runner, tmp_path):
    run = write_run(tmp_path / "r", steps=6, ranks=2, slow_rank=1)
    out = cli_runner.invoke(cli, ["monitor", str(run)]).output
    for needle in ("step 6/6", "predicted 50.0 ms", "measured/predicted 1.80", "rank 0 0.50",
                   "warning: rank 1 is a straggler"):
        assert needle in out, needle


def test_report_is_one_self_contained_page(cli_runner, tmp_path):
    run = write_run(tmp_path / "r", slow_rank=1)
    result = cli_runner.invoke(cli, ["report", str(run), "-o", str(tmp_path / "out.html")])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "out.html").read_text()
    assert html.count("<img ") == 4 and html.count('src="data:image/png;base64,') == 4
    assert "rank 1 is a straggler" in html
    assert cli_runner.invoke(cli, ["report", str(run)]).exit_code == 0
    assert (run / "report.html").exists()
    assert cli_runner.invoke(cli, ["report", str(run)]).exit_code == 0  # its own page: rewritten
    # a report.html of the user's in the run folder is theirs (review: it was replaced without a word)
    (run / "report.html").write_text("<h1>my notes</h1>")
    refused = cli_runner.invoke(cli, ["report", str(run)])
    assert refused.exit_code == 2 and "is not a run report smplan wrote; pass --force" in refused.output
    assert (run / "report.html").read_text() == "<h1>my notes</h1>"
    assert cli_runner.invoke(cli, ["report", str(run), "--force"]).exit_code == 0
    # a run with a validation set and an lr schedule: both on the page, the lr in a chart of its own
    trained = write_run(tmp_path / "t", steps=8, val_every=3, lr_warmup=4)
    assert cli_runner.invoke(cli, ["report", str(trained), "-o", str(tmp_path / "t.html")]).exit_code == 0
    html = (tmp_path / "t.html").read_text()
    assert html.count("<img ") == 5 and 'id="chart-lr"' in html
    assert "<dt>validation loss</dt><dd>4.7000 (step 3) → 4.7600 (step 6); best 4.7000 at step 3</dd>" in html
    assert "<dt>learning rate</dt><dd>peak 0.001, 4 warmup steps, then cosine; last 6.25e-05</dd>" in html


def test_report_output_must_be_a_file_in_an_existing_folder(cli_runner, tmp_path):
    run = write_run(tmp_path / "r")
    _one_error_line(cli_runner.invoke(cli, ["report", str(run), "-o", str(tmp_path)]), "is a folder")
    _one_error_line(cli_runner.invoke(cli, ["report", str(run), "-o", str(tmp_path / "no" / "x.html")]),
                    "does not exist")


@pytest.mark.parametrize("inside", ["metrics.jsonl", "ranks/page.html", "checkpoints/page.html"])
def test_report_never_writes_over_what_a_run_writes_even_with_force(cli_runner, tmp_path, inside):
    run = write_run(tmp_path / "run")
    target = run / inside
    target.parent.mkdir(exist_ok=True)  # a run's checkpoints/ appears with its first checkpoint
    before = target.read_bytes() if target.is_file() else None
    result = cli_runner.invoke(cli, ["report", str(run), "-o", str(target), "--force"])
    _one_error_line(result, f"is part of the run in {run}")
    assert (target.read_bytes() if target.is_file() else None) == before
    assert cli_runner.invoke(cli, ["monitor", str(run)]).exit_code == 0  # the run still reads
    # without --force too: the answer is another -o, not --force
    _one_error_line(cli_runner.invoke(cli, ["report", str(run), "-o", str(target)]), "is part of the run")


def test_report_follows_links_and_dots_to_what_the_path_really_is(cli_runner, tmp_path):
    run = write_run(tmp_path / "run")
    before = (run / "metrics.jsonl").read_bytes()
    (tmp_path / "link.html").symlink_to(run / "metrics.jsonl")
    (tmp_path / "alias").symlink_to(run / "ranks")
    for target in (tmp_path / "link.html", tmp_path / "alias" / "page.html"):
        _one_error_line(cli_runner.invoke(cli, ["report", str(run), "-o", str(target), "--force"]), "is part of the run")
    assert (run / "metrics.jsonl").read_bytes() == before
    (tmp_path / "loop").symlink_to(tmp_path / "loop")  # a loop of links: one line, not a traceback
    _one_error_line(cli_runner.invoke(cli, ["report", str(run), "-o", str(tmp_path / "loop" / "p.html")]),
                    "does not exist")
    # run/ranks/../page.html is run/page.html: a file of the user's, not of the run
    dotted = cli_runner.invoke(cli, ["report", str(run), "-o", str(run / "ranks" / ".." / "page.html")])
    assert dotted.exit_code == 0 and (run / "page.html").is_file(), dotted.output


def test_report_never_overwrites_a_file_without_force(cli_runner, tmp_path):
    run = write_run(tmp_path / "r")
    mine = tmp_path / "notes.html"
    mine.write_text("my notes")
    _one_error_line(cli_runner.invoke(cli, ["report", str(run), "-o", str(mine)]), "pass --force")
    assert mine.read_text() == "my notes"
    assert cli_runner.invoke(cli, ["report", str(run), "-o", str(mine), "--force"]).exit_code == 0
    assert "<img " in mine.read_text()


def test_help_teaches(cli_runner):
    text = cli_runner.invoke(cli, ["monitor", "--help"]).output
    for needle in ("--follow", "--straggler-pct", "--straggler-steps", "--memory-pct", "RUN_DIR", "--json"):
        assert needle in text
    assert "gradient-norm heatmap" in cli_runner.invoke(cli, ["report", "--help"]).output


def test_rank_that_has_not_written_a_step_yet(cli_runner, tmp_path):
    # Every rank opens its records file before its first step: an empty one is not a crash.
    run = write_run(tmp_path / "r", ranks=2, finished=False)
    (run / "ranks" / "rank-00002.jsonl").write_text("")
    for command in (["monitor", str(run), "--json"], ["report", str(run)]):
        result = cli_runner.invoke(cli, command)
        assert result.exit_code == 0, result.output
    status = json.loads(cli_runner.invoke(cli, ["monitor", str(run), "--json"]).output)
    assert {r["rank"] for r in status["ranks"]} == {0, 1}


def test_report_of_a_run_without_a_prediction_does_not_promise_one(cli_runner, tmp_path):
    run = write_run(tmp_path / "r")
    config = json.loads((run / "run_config.json").read_text())
    del config["plan"]["predicted"]  # an inline plan carries no prediction
    (run / "run_config.json").write_text(json.dumps(config))
    assert cli_runner.invoke(cli, ["report", str(run), "-o", str(tmp_path / "r.html")]).exit_code == 0
    html = (tmp_path / "r.html").read_text()
    assert "and the plan&#x27;s prediction" not in html and "The plan carries no prediction" in html


def test_follow_says_it_is_waiting_once(cli_runner, tmp_path, monkeypatch):
    """Not on a terminal, --follow printed 'waiting for ... to appear' once per --interval."""
    import importlib

    monkeypatch.setattr(importlib.import_module("smplan.monitor.follow"), "APPEAR_WAIT_S", 0.3)
    result = cli_runner.invoke(cli, ["monitor", str(tmp_path / "notyet"), "--follow", "--interval", "0.02"])
    assert result.exit_code == 2, result.output
    waiting = [line for line in result.output.splitlines() if line.startswith("waiting for")]
    assert waiting == [f"waiting for {tmp_path / 'notyet'} to appear (smplan execute creates it as it starts) ..."]


def test_follow_says_each_new_wait_once(cli_runner, tmp_path, monkeypatch):
    """The folder appears, then its first step: two different lines, each once."""
    import importlib

    follow_module = importlib.import_module("smplan.monitor.follow")
    run = tmp_path / "r"
    calls = []

    def sleep(seconds):
        calls.append(seconds)
        if len(calls) == 3:
            run.mkdir()
            (run / "run_config.json").write_text("{}")
        if len(calls) == 6:
            write_run(run, steps=2, total_steps=2, finished=True)

    real_follow = follow_module.follow
    monkeypatch.setattr("smplan.monitor.follow", lambda *a, **kw: real_follow(*a, **kw, sleep=sleep))
    result = cli_runner.invoke(cli, ["monitor", str(run), "--follow", "--interval", "0.01"])
    assert result.exit_code == 0, result.output
    waiting = [line for line in result.output.splitlines() if line.startswith("waiting for")]
    assert waiting == [f"waiting for {run} to appear (smplan execute creates it as it starts) ...",
                       f"waiting for the first step in {run} ..."], result.output


def test_a_run_continued_under_another_plan_is_judged_on_its_own_steps(cli_runner, tmp_path):
    """After a --force-resume, the earlier plan's straggler and step times are another plan's."""
    from smplan.executor.metrics import LAYOUT

    run = write_run(tmp_path / "r", steps=6, slow_rank=0, finished=False)  # rank 0 straggles under "old"
    later = write_run(tmp_path / "later", steps=6, finished=False)  # no straggler, 40 ms a step

    def retag(path, layout, shift=0):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return "".join(json.dumps({**r, "step": r["step"] + shift, LAYOUT: layout}) + "\n" for r in rows)

    for name in ("metrics.jsonl", *(f"ranks/{p.name}" for p in (run / "ranks").iterdir())):
        (run / name).write_text(retag(run / name, "old") + retag(later / name, "new", shift=6))
    status = json.loads(cli_runner.invoke(cli, ["monitor", str(run), "--json"]).output)
    assert status["stragglers"] == [] and status["step_time_s"]["median"] == pytest.approx(0.04)
