"""A NaN loss stops the run at its step, before the update, on every rank (Megatron-LM's
--check-for-nan-in-loss-and-grad): one line, exit 1, stopped.json, earlier checkpoints kept."""

from __future__ import annotations

import json
import textwrap

from smplan.executor.recipe import Recipe
from smplan.executor.train import non_finite_line

from tests.executor.runs import metrics, run_execute

NAN_AT_STEP = 3
# Global micro-batch 1 of step 3 (dp rank 1's only one under dp=2, mbs=1, gbs=2) holds a NaN,
# so only that rank's loss is NaN; the seed encodes (step, index) as executor/data.py draws it.
NAN_MODEL = textwrap.dedent(f'''
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x


    def model():
        return Net()


    def batch(micro_batch_size, model=None, seed=0):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(micro_batch_size, 8, generator=gen)
        if seed == {NAN_AT_STEP} * 1_048_576 + 1:
            x[0, 0] = float("nan")
        return x, torch.randint(0, 8, (micro_batch_size,), generator=gen)
''')


def test_a_nan_loss_on_one_rank_stops_every_rank_before_the_step(tmp_path):
    (tmp_path / "nan_model.py").write_text(NAN_MODEL)
    out = tmp_path / "run"
    result = run_execute("dp=2,mbs=1,gbs=2", out, "--steps", "4", "--checkpoint-every", "2", "--json",
                         model=str(tmp_path / "nan_model.py"))
    assert result.returncode == 1, result.stdout
    lines = [line for line in result.stdout.splitlines() if "NaN or infinite" in line]
    # said once (the launcher's report), not also by rank 0's own stderr under the agent's "[default_role0]:"
    assert len(lines) == 2 and f"step {NAN_AT_STEP}: the loss is NaN or infinite" in lines[1], result.stdout
    said = json.loads(result.stdout[result.stdout.index("\n{\n"):result.stdout.index("\n}\n") + 2])  # --json's object
    assert said["status"] == "failed" and said["run_dir"] == str(out) and said["exit_code"] == 1
    assert lines[0] == f'  "reason": {json.dumps(said["reason"])},' and "[default_role" not in result.stdout
    assert "--lr" in lines[0] and "the checkpoint of step 2 is kept" in lines[0], lines[0]
    assert "Traceback" not in result.stdout, result.stdout
    assert [r["step"] for r in metrics(out)] == [1, 2]
    steps = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
    assert steps == ["step-2"], steps  # none of the NaN step, the earlier ones kept
    stopped = json.loads((out / "stopped.json").read_text())
    assert stopped["reason"] == "failed" and f"step {NAN_AT_STEP}: the loss is NaN" in stopped["detail"], stopped


def test_a_restart_after_a_nan_stop_is_not_run(tmp_path):
    """--max-restarts would resume the same checkpoint and data and hit the same NaN once per
    restart; the restarts stop at once, with the first attempt's line."""
    (tmp_path / "nan_model.py").write_text(NAN_MODEL)
    out = tmp_path / "run"
    result = run_execute("dp=2,mbs=1,gbs=2", out, "--steps", "4", "--checkpoint-every", "2", "--max-restarts", "1",
                         model=str(tmp_path / "nan_model.py"))
    assert result.returncode == 1, result.stdout
    assert "restart 1 not run (it would resume the same weights and data" in result.stdout, result.stdout
    assert f"step {NAN_AT_STEP}: the loss is NaN" in result.stdout, result.stdout
    assert list((out / "elastic").glob("*/attempt_1")), "the agent restarted the group once"
    assert [r["step"] for r in metrics(out)] == [1, 2]  # the restart ran no step


def test_the_line_names_the_step_and_the_fixes_that_apply():
    line = non_finite_line(7, False, float("inf"), Recipe(lr=3e-4, warmup_steps=0, grad_clip=0.0))
    assert line.startswith("step 7: the gradient norm is inf, so the run stopped before applying that step")
    assert "a lower --lr (this run's peak lr is 0.0003)" in line and "--warmup-steps N" in line
    assert "--grad-clip 1.0" in line and "checkpoint" not in line and "\n" not in line
    line = non_finite_line(7, True, float("nan"), Recipe(warmup_steps=10), checkpoint_step=5)
    fixes, kept = line.split("; the checkpoint of step 5 is kept")
    assert "the loss is NaN or infinite (gradient norm nan)" in fixes and "--warmup-steps" not in fixes
    assert "--grad-clip" not in fixes and kept == " (resuming it with another --lr, --warmup-steps or --grad-clip " \
        "needs --force-resume)"
