"""A rank SIGKILLed mid-run: torchrun restarts the group, training resumes from the newest
complete checkpoint and ends bit-identical to an uninterrupted run; nothing is left running."""

from __future__ import annotations

import json

import pytest

from tests.executor.runs import assert_same_state, checkpoint_state, metrics, rank_logs, run_execute

PLAN = "dp=2,zero=3,mbs=1,gbs=4"  # FSDP2: sharded parameters, gradients and optimizer state
ARGS = ("--steps", "6", "--checkpoint-every", "2")


def test_sigkill_restart_resumes_bit_identical(tmp_path):
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    result = run_execute(PLAN, clean, *ARGS)
    assert result.returncode == 0, result.stdout
    result = run_execute(PLAN, faulty, *ARGS, "--max-restarts", "1", env={"SMPLAN_FAIL_AT_STEP": "3"})
    assert result.returncode == 0, result.stdout
    # rank 1's own output is in its log, not on the console (only local rank 0's is shown)
    assert "SIGKILL rank 1 at step 3" in rank_logs(faulty), result.stdout
    assert "SIGKILL rank 1" not in result.stdout
    assert "restart 1 of 1: the previous attempt failed; every rank's log of it is under" in result.stdout
    assert "resumed from" in result.stdout and "step-2" in result.stdout
    assert [r["step"] for r in metrics(faulty)] == [1, 2, 3, 4, 5, 6]
    a = checkpoint_state(clean / "checkpoints" / "step-6", tmp_path)
    b = checkpoint_state(faulty / "checkpoints" / "step-6", tmp_path)
    assert_same_state(a, b)
    assert [r["loss"] for r in metrics(clean)] == [r["loss"] for r in metrics(faulty)]
    assert not list((faulty / "checkpoints").glob(".step-*")), "a temporary checkpoint folder was left"


def test_failure_without_restarts_exits_cleanly(tmp_path):
    result = run_execute(PLAN, tmp_path, "--steps", "3", "--fail-at-step", "2", timeout=90)
    assert result.returncode == 1
    assert "error: training failed after 0 restart(s): rank 1 killed by signal 9; full log of rank 1:" in result.stdout
    # rank 0 lost its peer: one line, not the traceback of a collective; the agent's own records stay quiet
    assert "Traceback" not in result.stdout and "closing signal" not in result.stdout, result.stdout
    # rank 0's line that it lost its peer (when it sees that before the agent stops it) stays in its
    # log: the report names rank 1, once, and nothing carries the agent's "[default_role0]:" prefix
    assert "another rank left" not in result.stdout and "[default_role" not in result.stdout, result.stdout
    assert result.stdout.count("rank 1 killed by signal 9") == 1, result.stdout
    stopped = json.loads((tmp_path / "stopped.json").read_text())  # what `monitor --follow` stops on
    assert stopped["reason"] == "failed" and stopped["detail"].startswith("rank 1 killed by signal 9")
    # whether it can be resumed, as an interrupted run's record says (a review found only those did)
    no_resume = "it wrote no checkpoint, so it cannot be resumed"
    assert no_resume in stopped["detail"] and no_resume in result.stdout, result.stdout


def test_a_checkpoint_that_does_not_read_back_is_skipped(tmp_path):
    """step-4's shard cut short after it was published (a lost disk block): the resume says so,
    continues from step-2 on both ranks, and trains the same steps again to the same losses."""
    first = run_execute(PLAN, tmp_path, "--steps", "4", "--checkpoint-every", "2")
    assert first.returncode == 0, first.stdout
    before = [r["loss"] for r in metrics(tmp_path)]
    shard = max((tmp_path / "checkpoints" / "step-4").glob("*.distcp"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[:1000])
    second = run_execute(PLAN, tmp_path, "--steps", "6", "--checkpoint-every", "2")
    assert second.returncode == 0, second.stdout
    assert "step-4 could not be read" in second.stdout and "step-2 (step 2)" in second.stdout
    got = metrics(tmp_path)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in got[:4]] == pytest.approx(before, rel=1e-6)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-2", "step-4", "step-6"]
    # rank 1's own file (its RNG state) cut short: only rank 1 fails to read, both ranks move on
    rank_file = tmp_path / "checkpoints" / "step-6" / "rank-1.pt"
    rank_file.write_bytes(rank_file.read_bytes()[:100])
    # ...and, in the same resume, step-4's DCP .metadata zeroed: torch asserts "metadata is None" on every
    # rank, which is damage too (a review's run failed over and over, each time advised to run the same command)
    meta = tmp_path / "checkpoints" / "step-4" / ".metadata"
    meta.write_bytes(bytes(meta.stat().st_size))
    third = run_execute(PLAN, tmp_path, "--steps", "7", "--checkpoint-every", "2")
    assert third.returncode == 0, third.stdout
    assert "step-6 could not be read (rank 1: UnreadableFileError: rank-1.pt does not read back (RuntimeError: " \
           "PytorchStreamReader" in third.stdout
    assert "step-4 could not be read (rank 0: AssertionError: metadata is None" in third.stdout, third.stdout
    assert "step-2 (step 2)" in third.stdout
    assert [r["loss"] for r in metrics(tmp_path)][:6] == pytest.approx([r["loss"] for r in got], rel=1e-6)


@pytest.mark.slow
def test_resume_continues_a_finished_run(tmp_path, reference):
    """pp=2 x dp=2 (replicate per stage): 4 steps, then a run in another folder resumes step-4 of that
    --checkpoint-dir to 6 (saving none there: those are the first run's)."""
    plan, ckpt = "pp=2,dp=2,mbs=1,gbs=4", str(tmp_path / "ckpt")
    first = run_execute(plan, tmp_path / "a", "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", ckpt)
    assert first.returncode == 0, first.stdout
    second = run_execute(plan, tmp_path / "b", "--steps", "6", "--checkpoint-dir", ckpt)
    assert second.returncode == 0, second.stdout
    assert "step-4 (step 4)" in second.stdout
    got = metrics(tmp_path / "b")
    assert [r["step"] for r in got] == [5, 6]
    for rec in got:
        assert rec["loss"] == pytest.approx(reference[rec["step"] - 1]["loss"], rel=1e-4)
