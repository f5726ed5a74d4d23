"""--keep-checkpoints K: after each save only the newest K step-N checkpoints stay (torchtitan's
keep_latest_k), and a run resumes from the newest as before."""

from __future__ import annotations

from smplan.executor import checkpoint

from tests.executor.runs import metrics, run_execute


def _complete(root, *steps):
    for step in steps:
        folder = root / f"step-{step}"
        folder.mkdir(parents=True)
        (folder / checkpoint.MARKER).write_text("ok\n")
        (folder / checkpoint.META).write_text("{}\n")


def test_prune_keeps_the_newest_complete_ones_and_leaves_an_unfinished_save(tmp_path):
    _complete(tmp_path, 2, 4, 6, 10)
    (tmp_path / ".step-12.tmp").mkdir()  # a save still being written (or torn): not ours to judge
    removed = checkpoint.prune(tmp_path, 2)
    assert sorted(p.name for p in removed) == ["step-2", "step-4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step-12.tmp", "step-10", "step-6"]
    assert checkpoint.prune(tmp_path, 0) == [] and checkpoint.prune(tmp_path, 5) == []


def test_a_run_keeps_its_newest_checkpoints_and_resumes_from_them(tmp_path):
    out = tmp_path / "run"
    first = run_execute("dp=2,mbs=1,gbs=2", out, "--steps", "4", "--checkpoint-every", "1", "--keep-checkpoints", "2")
    assert first.returncode == 0, first.stdout
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-3", "step-4"]
    more = run_execute("dp=2,mbs=1,gbs=2", out, "--steps", "6", "--checkpoint-every", "1", "--keep-checkpoints", "2")
    assert more.returncode == 0, more.stdout
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-5", "step-6"]
