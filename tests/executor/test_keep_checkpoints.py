"""--keep-checkpoints K: after each save only the newest K step-N checkpoints stay (torchtitan's
keep_latest_k), and a run resumes from the newest as before."""

from __future__ import annotations

from smplan.executor import checkpoint

from tests.executor.runs import metrics, run_execute


def _complete(root, *steps, fingerprint="ours"):
    for step in steps:
        folder = root / f"step-{step}"
        folder.mkdir(parents=True)
        (folder / checkpoint.MARKER).write_text("ok\n")
        (folder / checkpoint.META).write_text(f'{{"fingerprint": "{fingerprint}", "step": {step}}}\n')


def test_prune_keeps_the_newest_of_this_runs_and_leaves_the_rest(tmp_path):
    _complete(tmp_path, 2, 4, 6, 10)
    _complete(tmp_path, 1, 3, fingerprint="another plan")  # a shared --checkpoint-dir, a --force-resume source
    (tmp_path / ".step-12.tmp").mkdir()  # a save still being written (or torn): not ours to judge
    removed = checkpoint.prune(tmp_path, 2, 10, "ours")
    assert sorted(p.name for p in removed) == ["step-2", "step-4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step-12.tmp", "step-1", "step-10", "step-3", "step-6"]
    assert checkpoint.prune(tmp_path, 0, 10, "ours") == [] and checkpoint.prune(tmp_path, 5, 10, "ours") == []


def test_prune_never_removes_the_step_just_saved_for_a_later_one_that_did_not_read_back(tmp_path):
    # step-200 did not read back, the run fell back to step-100 and has saved step-150
    _complete(tmp_path, 100, 150, 200)
    assert [p.name for p in checkpoint.prune(tmp_path, 1, 150, "ours")] == ["step-100"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-150", "step-200"]


def test_a_run_keeps_its_newest_checkpoints_and_resumes_from_them(tmp_path):
    out = tmp_path / "run"
    first = run_execute("dp=2,mbs=1,gbs=2", out, "--steps", "4", "--checkpoint-every", "1", "--keep-checkpoints", "2")
    assert first.returncode == 0, first.stdout
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-3", "step-4"]
    # the continuation keeps checkpointing and pruning as the run was started (neither flag repeated)
    more = run_execute("dp=2,mbs=1,gbs=2", out, "--steps", "6")
    assert more.returncode == 0, more.stdout
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-5", "step-6"]
