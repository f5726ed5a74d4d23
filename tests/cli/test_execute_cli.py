"""`smplan execute`: mismatches are one line and exit 2 before any process starts (the Slurm
launcher's own cases: test_execute_slurm.py)."""

from __future__ import annotations

import json
import subprocess

import pytest
from smplan.executor.run import resolve_plan

from smplan.cli.main import cli
from tests.conftest import EXAMPLES
from tests.own_models import MHA_MODEL, OWN_MODEL

GPT = f"{EXAMPLES / 'gpt.py'}:tiny"  # 4 blocks, 4 heads, seq 16


def _invoke(cli_runner, *args):
    return cli_runner.invoke(cli, ["execute", *args])


@pytest.mark.parametrize(
    ("plan", "extra", "needle"),
    [
        ("tp=3,mbs=1,gbs=4", (), "tp=3 does not divide the model's 4 heads"),
        ("pp=8,mbs=1,gbs=8", (), "at least 8 blocks"),
        ("dp=2,mbs=1,gbs=4", ("--nproc-per-node", "4"), "needs dp*tp*pp=2*1*1=2 processes but 4"),
        ("pp=2,mbs=1,gbs=1", (), "1 micro-batches cannot fill 2 pipeline stages"),
        ("tp=2,sp=1,mbs=1,gbs=2", ("--arg", "seq_len=15"), "does not divide it"),
        ("cp=2,mbs=1,gbs=2", ("--arg", "seq_len=14"), "cp=2 needs seq_len divisible by 2*cp=4"),
        ("cp=2,tp=4,sp=1,mbs=1,gbs=2", ("--arg", "seq_len=12", "--nproc-per-node", "8"),
         "splits each cp rank's 6 tokens (seq_len / cp) over tp=4"),
        ("cp=2,dp=2,mbs=1,gbs=2", ("--nproc-per-node", "2"), "dp*tp*pp*cp=4 GPUs but the cluster has 2"),
        ("dtype=fp8,fp8_scaling=block,dp=2,mbs=1,gbs=2", (), "fp8_scaling=block has no torchao float8 training recipe"),
    ],
)
def test_mismatch_is_one_line_exit_2(cli_runner, tmp_path, plan, extra, needle):
    out = tmp_path / "run"
    result = _invoke(cli_runner, plan, "--model", GPT, "--out", str(out), *extra)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.output
    assert not out.exists(), "nothing may start (or be written) for a rejected plan"


def test_tp_without_tp_plan(cli_runner, tmp_path):
    result = _invoke(cli_runner, "tp=2,mbs=1,gbs=2", "--model", str(EXAMPLES / "cnn.py"), "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert "defines no tp_plan" in result.output and len(result.output.strip().splitlines()) == 1


def test_cp_without_context_parallel_hook(cli_runner, tmp_path):
    result = _invoke(cli_runner, "cp=2,mbs=1,gbs=2", "--model", str(EXAMPLES / "mlp.py"), "--out", str(tmp_path / "r"))
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and "cp=2: mlp.py defines no context_parallel(model, sequence) hook" in line, line


def test_plan_file_with_stages_beyond_the_model(cli_runner, tmp_path):
    plan = {"model": GPT, "hw": "local", "nodes": 1, "dp": 1, "tp": 1, "pp": 2, "micro_batch": 1, "global_batch": 4,
            "stages": [{"first_block": 0, "last_block": 3}, {"first_block": 3, "last_block": 6}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    result = _invoke(cli_runner, str(path), "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert "cover blocks [0, 6) but gpt.py has 4 blocks" in result.output


def test_inline_plan_needs_a_model(cli_runner):
    result = _invoke(cli_runner, "dp=2")
    assert result.exit_code == 2 and "needs --model" in result.output


def test_checkpoint_of_another_plan_is_refused(cli_runner, tmp_path):
    ckpt = tmp_path / "ckpt" / "step-4"
    ckpt.mkdir(parents=True)
    (ckpt / "smplan.json").write_text(json.dumps({"fingerprint": "0000", "step": 4}))
    (ckpt / "COMPLETE").write_text("ok\n")
    result = _invoke(cli_runner, "dp=2,mbs=1,gbs=4", "--model", GPT, "--checkpoint-dir", str(tmp_path / "ckpt"),
                     "--checkpoint-every", "2", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert "written by another plan" in result.output and "--force-resume" in result.output


def test_a_refused_resume_says_what_changed(cli_runner, tmp_path):
    # it named two hashes; a checkpoint now keeps its fingerprint's inputs beside it
    from smplan.executor.config import fingerprint, fingerprint_inputs
    from smplan.planner.model_file import load_model_file

    plan, _ = resolve_plan("dp=2,mbs=2,gbs=4", model=GPT)
    sha = load_model_file(GPT).sha256
    ckpt = tmp_path / "ckpt" / "step-4"
    ckpt.mkdir(parents=True)
    (ckpt / "smplan.json").write_text(json.dumps({"fingerprint": fingerprint(plan, sha), "step": 4,
                                                  "fingerprint_inputs": fingerprint_inputs(plan, sha)}))
    (ckpt / "COMPLETE").write_text("ok\n")
    result = _invoke(cli_runner, "dp=2,mbs=1,gbs=4", "--model", GPT, "--checkpoint-dir", str(tmp_path / "ckpt"),
                     "--out", str(tmp_path / "r"))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "(checkpoint -> this run: layout: micro_batch 2 -> 1)" in lines[0] and "fingerprint" not in lines[0]


def test_an_edited_plan_file_is_priced_again_and_another_model_is_not_compared(cli_runner, tmp_path):
    """The recorded prediction of a hand-edited file is not its plan's: execute simulates the
    plan and compares (and sizes Slurm's --time) with that; with --model of another model
    it compares nothing."""
    path, edited = tmp_path / "plan.json", tmp_path / "edited.json"
    # zero=0: a zero=1 plan's run notes it runs as FSDP2's ZeRO-2 (executor.run._zero_note)
    assert cli_runner.invoke(cli, ["plan", GPT, "--hw", "a100x8", "--fix", "dp=8,zero=0", "-o", str(path)]).exit_code == 0
    data = json.loads(path.read_text())
    recorded = data["predicted"]["step_time_s"]
    data["global_batch"] *= 8
    data.pop("num_microbatches")
    edited.write_text(json.dumps(data))
    result = _invoke(cli_runner, str(edited), "--launcher", "slurm", "--out", str(tmp_path / "a"), "--json")
    assert result.exit_code == 0, result.output
    note = f"note: {edited} records a predicted step of {recorded:.4g} s but simulating it gives "
    assert note in result.stderr and "the run is compared with the simulated figures" in result.stderr
    simulated = float(result.stderr.split("simulating it gives ")[1].split(" s")[0])
    assert simulated > 4 * recorded  # 8x the micro-batches
    config = json.loads((tmp_path / "a" / "run_config.json").read_text())
    assert config["plan"]["predicted"]["step_time_s"] == pytest.approx(simulated, rel=1e-3)
    # a profile file that moved away: the figures cannot be checked, and it says so
    data["hw"] = str(tmp_path / "gone.toml")
    edited.write_text(json.dumps(data))
    moved = _invoke(cli_runner, str(edited), "--launcher", "slurm", "--out", str(tmp_path / "m"))
    assert moved.exit_code == 0, moved.output
    assert f"note: {edited}'s predicted figures could not be checked against its plan (" in moved.stderr
    # the file as written: its own figures, no note
    same = _invoke(cli_runner, str(path), "--launcher", "slurm", "--out", str(tmp_path / "b"), "--json")
    assert same.exit_code == 0 and "note:" not in same.stderr
    assert json.loads((tmp_path / "b" / "run_config.json").read_text())["plan"]["predicted"]["step_time_s"] == recorded
    other = _invoke(cli_runner, str(path), "--model", f"{EXAMPLES / 'mlp.py'}", "--launcher", "slurm",
                    "--out", str(tmp_path / "c"))
    assert "build another model than" in other.output
    assert f"not the plan's seq_len={data['seq_len']}" in other.output, other.output  # mlp.py trains at its own
    assert "predicts no step time" in other.output, other.output
    wider = _invoke(cli_runner, str(path), "--arg", "hidden=64", "--launcher", "slurm", "--out", str(tmp_path / "d"))
    assert "build another model than" in wider.output, wider.output
    assert "seq_len" not in wider.output  # the same file: the plan's seq_len stays
    # tiny's own width, given again, builds the same model: its figures stay
    same_args = _invoke(cli_runner, str(path), "--arg", "hidden=32", "--launcher", "slurm", "--out", str(tmp_path / "e"))
    assert same_args.exit_code == 0 and "note:" not in same_args.stderr, same_args.output


def test_a_plan_the_run_refuses_is_one_error_not_a_note_first(cli_runner, tmp_path):
    # the cost model refuses tp=2 on a model with no tp_plan as the run does: it printed "note: ... could not
    # be checked ... the run is compared with them as recorded" before the run's own error (a review's finding)
    path, edited = tmp_path / "plan.json", tmp_path / "edited.json"
    assert cli_runner.invoke(cli, ["plan", str(EXAMPLES / "cnn.py"), "--hw", "a100x8", "-o", str(path)]).exit_code == 0
    data = json.loads(path.read_text())
    data.update(tp=2, dp=data["dp"] // 2)
    data.pop("num_microbatches", None)
    edited.write_text(json.dumps(data))
    result = _invoke(cli_runner, str(edited), "--out", str(tmp_path / "run"))
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == ["error: tp=2 needs tensor parallelism but cnn.py defines no "
                                                  "tp_plan(block); use tp=1"], result.output


def _refused_line(cli_runner, out, files: dict) -> str:
    """`execute -o OUT` into a folder holding `files` (name -> text): exit 2, one line, returned."""
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text)
    result = _invoke(cli_runner, "dp=1,mbs=1,gbs=1", "--model", GPT, "--out", str(out))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def test_a_run_dir_holding_another_run_is_refused(cli_runner, tmp_path):
    # A run directory holds one run: without a checkpoint to continue from, a second run there
    # would erase the first one's steps and pass its summary off as its own.
    out, earlier = tmp_path / "run", '{"step": 1, "loss": 4.2, "step_time_s": 0.1}\n'
    line = _refused_line(cli_runner, out, {"metrics.jsonl": earlier, "summary.json": "{}",
                                           "run_config.json": '{"plan": {}, "fingerprint": "0"}',
                                           "stopped.json": '{"reason": "failed"}'})
    assert "already holds a run (1 steps)" in line and "another -o/--output" in line
    assert (out / "metrics.jsonl").read_text() == earlier and (out / "summary.json").exists()
    assert (out / "stopped.json").exists()  # a refused command changes nothing


def test_a_folder_that_is_not_a_run_keeps_its_files(cli_runner, tmp_path):
    # someone's own summary.json (or a checkpoints folder) in the -o folder: a run would replace it,
    # and a run_config.json that `execute` did not write does not make the folder a run's
    out = tmp_path / "results"
    line = _refused_line(cli_runner, out, {"summary.json": '{"mine": 1}', "notes.txt": "x",
                                           "run_config.json": '{"lr": 0.1}'})
    assert "is not a run directory of `smplan execute` but holds run_config.json, summary.json" in line
    assert "new or empty folder" in line
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "run_config.json", "summary.json"]
    assert (out / "summary.json").read_text() == '{"mine": 1}'


def test_a_run_dir_with_its_own_checkpoint_resumes_without_checkpoint_every(cli_runner, tmp_path):
    """RUN_DIR/checkpoints holds step 4: a second `execute -o RUN_DIR` resumes from it (it used to
    say there was no checkpoint unless --checkpoint-every was given again), and --steps at or
    below 4 is refused instead of starting processes that have nothing to do."""
    from smplan.executor import checkpoint

    out = tmp_path / "run"
    step = out / "checkpoints" / "step-4"
    step.mkdir(parents=True)
    (step / checkpoint.MARKER).write_text("")
    (step / checkpoint.META).write_text(json.dumps({"fingerprint": "another plan"}))
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 4.0, "step_time_s": 0.1}) + "\n"
                                               for i in range(1, 5)))
    found = _invoke(cli_runner, "dp=1,mbs=1,gbs=1", "--model", GPT, "--out", str(out), "--steps", "6")
    assert found.exit_code == 2 and "was written by another plan" in found.output  # it is looked at
    done = _invoke(cli_runner, "dp=1,mbs=1,gbs=1", "--model", GPT, "--out", str(out), "--steps", "3",
                   "--force-resume")
    assert done.exit_code == 2
    assert "is at step 4, so --steps 3 leaves nothing to run" in done.output.strip().splitlines()[-1]


def test_json_mode_prints_one_object_and_progress_goes_to_stderr(tmp_path):
    import shutil

    out = tmp_path / "run"
    proc = subprocess.run([shutil.which("smplan") or "smplan", "execute", "dp=2,mbs=1,gbs=2", "--model", GPT,
                           "--steps", "2", "-o", str(out), "--json"],
                          capture_output=True, text=True, timeout=300, env={**__import__("os").environ,
                                                                           "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout)  # exactly one object
    assert record["run_dir"] == str(out.resolve())
    assert "starting 2 processes" in proc.stderr and "step 2/2" in proc.stderr


MOE = f"{EXAMPLES / 'moe.py'}:tiny"  # 4 experts per bank, top 2

LISTED = str(EXAMPLES.parent / 'tests' / 'model' / 'listed_experts.py')  # experts in a ModuleList


@pytest.mark.parametrize(
    ("plan", "needle"),
    [
        ("ep=3,dp=3,mbs=1,gbs=3", "ep=3 does not divide the model's 4 experts per MoE block"),
        ("ep=2,dp=3,mbs=1,gbs=3", "ep=2 must divide tp*cp*dp=3 (the expert grid ep x edp folds into it); use ep=1, or dp=4"),
    ],
)
def test_bad_expert_parallel_layouts_are_one_line(cli_runner, tmp_path, plan, needle):
    result = _invoke(cli_runner, plan, "--model", MOE, "-o", str(tmp_path / "r"))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and needle in lines[0], result.output
    assert not (tmp_path / "r").exists()


def test_expert_bank_that_cannot_be_split_is_refused_with_the_planners_reason(cli_runner, tmp_path):
    result = _invoke(cli_runner, "ep=2,dp=2,mbs=1,gbs=2", "--model", LISTED, "-o", str(tmp_path / "r"))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "ep=2: expert bank blocks.0.bank holds experts.0.weight of shape (8, 8)" in lines[0]
    profiled = cli_runner.invoke(cli, ["plan", LISTED, "--hw", "h100x8", "--nodes", "1", "--fix", "ep=2"])
    assert profiled.exit_code == 2 and "expert bank blocks.0.bank holds experts.0.weight" in profiled.output


@pytest.mark.parametrize("ratio, noted", [(1.2, False), (0.8, False), (3.6, True), (0.5, True)])
def test_a_step_far_from_its_prediction_points_to_calibrate(capsys, tmp_path, monkeypatch, ratio, noted):
    from smplan.planner.plan import Plan

    from smplan.cli.execute import _echo_summary

    monkeypatch.chdir(tmp_path)
    (tmp_path / "myhw.toml").write_text("")  # the suggested command names a profile that exists

    summary = {"measured": {"step_time_s": 0.05 * ratio, "tokens_per_s": 1.0, "peak_memory_gib": 0.3,
                            "final_loss": 4.0},
               "predicted": {"step_time_s": 0.05, "tokens_per_s": 1.0, "peak_memory_gib": 2.0},
               "ratio_measured_over_predicted": {"step_time_s": ratio}, "plan": {"dtype": "fp32"}}
    _echo_summary({**summary, "device": "cpu"}, Plan(model="examples/gpt.py:tiny", hw="myhw.toml", nodes=1,
                                                     model_args={"layers": 2}))
    out = capsys.readouterr().out
    assert (f"the step took {ratio:.2f}x its prediction on this machine; `smplan calibrate examples/gpt.py:tiny "
            "--arg layers=2 --hw myhw.toml -o cal.toml`" in out) is noted
    # a GPU profile's plan run on this CPU: its prediction is for the GPU, nothing to calibrate here
    _echo_summary({**summary, "device": "cpu"}, Plan(model="examples/gpt.py:tiny", hw="a100x8", nodes=1))
    out = capsys.readouterr().out
    assert "smplan calibrate" not in out
    assert "(predicted for 1 GPU of a100x8; this run is on CPU, so the ratios do not test the prediction)" in out
    # the plan's --hw-set values go along; a profile that does not load is not suggested
    _echo_summary({**summary, "device": "cpu"}, Plan(model="m.py", hw="myhw.toml", nodes=1,
                                                     hw_overrides={"gpus_per_node": 2}))
    assert ("`smplan calibrate m.py --hw-set gpus_per_node=2 --hw myhw.toml -o cal.toml`"
            in capsys.readouterr().out) is noted
    _echo_summary({**summary, "device": "cpu"}, Plan(model="m.py", hw="a100x9", nodes=1))
    assert "smplan calibrate" not in capsys.readouterr().out
    # calibrate refuses to overwrite its -o: the suggestion names a file that is not there yet
    (tmp_path / "cal.toml").write_text("")
    _echo_summary({**summary, "device": "cpu"}, Plan(model="m.py", hw="cal.toml", nodes=1))
    assert ("--hw cal.toml -o cal-2.toml`" in capsys.readouterr().out) is noted


def test_lr_scaling_without_a_reference_batch_is_refused(cli_runner, tmp_path):
    result = _invoke(cli_runner, "mbs=1,gbs=1", "--model", GPT, "--lr-scaling", "linear", "--steps", "1",
                     "--out", str(tmp_path / "run"))
    assert result.exit_code == 2 and "add --reference-batch B, or drop --lr-scaling" in result.output
    assert not (tmp_path / "run").exists()


def test_a_run_dir_in_use_by_another_launch_is_refused(cli_runner, tmp_path):
    """Two launches into one folder would both resume from its checkpoint and append to one
    metrics.jsonl: the second is refused, naming the first, while the first holds the lock."""
    import os
    from pathlib import Path

    from smplan.executor import PlanMismatchError
    from smplan.executor.run_lock import LOCK_FILE, holding_run_dir

    out = tmp_path / "run"
    with holding_run_dir(out):
        refused = _invoke(cli_runner, "dp=1,mbs=1,gbs=1", "--model", GPT, "--out", str(out))
        assert refused.exit_code == 2, refused.output
        assert f"{out} is in use by another `smplan execute` (pid {os.getpid()} on" in refused.output
        assert "pass another -o/--output" in refused.output
        # nor is a Slurm script written under a running launch (it would rewrite run_config.json)
        slurm = _invoke(cli_runner, "dp=1,mbs=1,gbs=1", "--model", GPT, "--launcher", "slurm", "--out", str(out))
        assert slurm.exit_code == 2 and "in use by another" in slurm.output
    # refused before it wrote anything: a folder made only for the lock is not left behind
    assert not out.exists()
    # a launch refused at the same moment as the one that made the folder (it, too, found none)
    # never removes it: only the holder of the lock cleans up
    with holding_run_dir(out):
        real_exists = Path.exists
        Path.exists = lambda self: False if self == out else real_exists(self)
        try:
            with pytest.raises(PlanMismatchError, match="in use by another"), holding_run_dir(out):
                pass
        finally:
            Path.exists = real_exists
        assert (out / LOCK_FILE).is_file()
    assert not out.exists()
    bad = _invoke(cli_runner, "tp=3,mbs=1,gbs=4", "--model", GPT, "--out", str(out))
    assert bad.exit_code == 2 and not out.exists()
    # an existing folder keeps nothing of a launch: its lock file goes as the launch ends
    out.mkdir()
    with holding_run_dir(out):
        assert (out / LOCK_FILE).read_text().startswith(f"pid {os.getpid()} on ")
    assert out.is_dir() and not any(out.iterdir())


def test_a_checkpoint_dir_in_use_by_another_launch_is_refused(cli_runner, tmp_path):
    """Two runs saving into one checkpoint folder, started close together, got past every check
    made at launch: the second resumed from the first's newest step and replaced its next (review).
    The folder a run saves into is held as -o is: a shared --checkpoint-dir, and another run's own
    RUN_DIR/checkpoints; a run that only resumes from it may go beside its writer."""
    from smplan.executor.run_lock import CHECKPOINT_LOCK_FILE, LOCK_FILE, holding_run_dir

    for i, shared in enumerate((tmp_path / "ckpt", tmp_path / "a" / "checkpoints")):
        with holding_run_dir(shared, "--checkpoint-dir", CHECKPOINT_LOCK_FILE):
            refused = _invoke(cli_runner, "dp=1,mbs=1,gbs=1", "--model", GPT, "--out", str(tmp_path / "b"),
                              "--checkpoint-dir", str(shared), "--checkpoint-every", "1", "--steps", "1")
            assert refused.exit_code == 2, refused.output
            assert f"{shared} is in use by another `smplan execute`" in refused.output
            assert "pass another --checkpoint-dir" in refused.output and "Traceback" not in refused.output
            reads = _invoke(cli_runner, "dp=1,mbs=1,gbs=1", "--model", GPT, "--out", str(tmp_path / f"c{i}"),
                            "--checkpoint-dir", str(shared), "--steps", "1")  # saves nothing there
            assert reads.exit_code == 0, reads.output
        assert not shared.exists() and not (tmp_path / "b").exists()
    # a run whose --checkpoint-dir is its own -o folder holds both locks (a review's refused itself)
    both = tmp_path / "both"
    for steps in ("2", "4"):  # the second continues the first
        ran = _invoke(cli_runner, "dp=1,mbs=1,gbs=1", "--model", GPT, "--out", str(both), "--checkpoint-dir",
                      str(both), "--checkpoint-every", "2", "--steps", steps)
        assert ran.exit_code == 0, ran.output
    assert not (both / LOCK_FILE).exists() and not (both / CHECKPOINT_LOCK_FILE).exists()


def test_a_one_step_summary_says_it_is_the_warm_up_step(capsys):
    from smplan.planner.plan import Plan

    from smplan.cli.execute import _echo_summary

    summary = {"measured": {"step_time_s": 0.5, "tokens_per_s": 1.0, "peak_memory_gib": 0.3, "final_loss": 4.0},
               "steps": 1, "device": "cpu", "plan": {"dtype": "fp32"}, "note": "no prediction"}
    _echo_summary(summary, Plan(model="m.py", hw="local", nodes=1))
    assert "over the run's 1 step, which warms up" in capsys.readouterr().out


def test_a_gpu_run_in_another_dtype_does_not_say_the_plan_applies_on_a_gpu(capsys):
    from smplan.planner.plan import Plan

    from smplan.cli.execute import _echo_summary

    summary = {"measured": {"step_time_s": 0.5, "tokens_per_s": 1.0, "peak_memory_gib": 0.3, "final_loss": 4.0},
               "steps": 3, "plan": {"dtype": "fp8"}, "note": "no prediction", "compute_dtype": "bf16"}
    _echo_summary({**summary, "device": "cuda"}, Plan(model="m.py", hw="local", nodes=1))
    assert "(ran in bf16: not the plan's fp8)" in capsys.readouterr().out
    _echo_summary({**summary, "plan": {"dtype": "bf16"}, "device": "cpu", "compute_dtype": "fp32"},
                  Plan(model="m.py", hw="local", nodes=1))
    assert "(ran in fp32: the plan's bf16 applies on a GPU)" in capsys.readouterr().out
    # fp8 runs on CPU too: a CPU run that stayed in fp32 converted no linear (its fp8 line says why)
    _echo_summary({**summary, "device": "cpu", "compute_dtype": "fp32"}, Plan(model="m.py", hw="local", nodes=1))
    assert "(ran in fp32: not the plan's fp8)" in capsys.readouterr().out


def test_summary_figures_read_without_exponents():
    from smplan.cli.execute import _figure

    assert _figure(11770.4) == "11,770" and _figure(0.01234567) == "0.01235" and _figure(2880.0) == "2,880"


def test_a_model_without_config_gets_its_heads_from_its_attention_calls(cli_runner, tmp_path):
    # it planned and launched tp=8 on 4 heads, and every rank failed in a view()
    path = tmp_path / "mine.py"
    path.write_text(OWN_MODEL)
    planned = cli_runner.invoke(cli, ["plan", str(path), "--hw", "a100x8", "--fix", "tp=8"])
    assert planned.exit_code == 2 and "tp=8 does not divide the model's 4 key/value heads" in planned.output
    out = tmp_path / "run"
    result = _invoke(cli_runner, "tp=8,mbs=1,gbs=1", "--model", str(path), "--out", str(out))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "tp=8 does not divide the model's 4 kv heads; use tp in {1, 2, 4}" in lines[0] and not out.exists()


def test_a_tp_plan_on_a_module_never_called_is_refused_before_launch(cli_runner, tmp_path):
    path = tmp_path / "mha.py"
    path.write_text(MHA_MODEL)
    out = tmp_path / "run"
    result = _invoke(cli_runner, "tp=2,mbs=1,gbs=1", "--model", str(path), "--out", str(out))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and not out.exists(), result.output
    assert lines[0].startswith("error: tp=2: tp_plan() shards attn.out_proj, which the forward never calls")


TUPLE_MODEL = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.norm(x)), None  # a tuple the model's forward does not unpack


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def model():
    return Net()


def batch(micro_batch_size, model=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(micro_batch_size, 16, generator=gen), torch.randint(0, 16, (micro_batch_size,), generator=gen)
'''


def test_a_forward_that_fails_on_meta_is_refused_in_profiles_line_before_launch(cli_runner, tmp_path):
    # it launched, and every rank printed ~75 lines of traceback; profile refused it in one line
    path = tmp_path / "tuple_block.py"
    path.write_text(TUPLE_MODEL)
    profiled = cli_runner.invoke(cli, ["profile", str(path)])
    assert profiled.exit_code == 2, profiled.output
    out = tmp_path / "run"
    result = _invoke(cli_runner, "dp=1,mbs=2,gbs=8", "--model", str(path), "--out", str(out))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and not out.exists(), result.output
    assert lines == profiled.output.strip().splitlines(), (lines, profiled.output)
    assert "forward raised TypeError" in lines[0] and "must be Tensor, not tuple" in lines[0], lines[0]


def test_a_forward_only_the_meta_device_cannot_run_is_left_to_the_run(tmp_path):
    # .item() raises on meta, not on data: an inline plan of such a model trained before the check,
    # and so did tp=2 (its heads and tp_plan checks ask the same profile); so does a data()-only file
    from smplan.executor.validate import meta_profile, validate_plan
    from smplan.planner.model_file import ModelFileError, load_model_file
    from smplan.planner.plan import Plan

    mlp = (EXAMPLES / "mlp.py").read_text()
    item = tmp_path / "item.py"
    item.write_text(mlp.replace("        return self.head(x) if self.head is not None else x",
                                "        x = x * (x.abs().max().item() < 1e9)\n"
                                "        return self.head(x) if self.head is not None else x"))
    only_data = tmp_path / "only_data.py"
    only_data.write_text(mlp.replace("def batch(", "def data(rank, world):\n    while True:\n"
                                     "        yield torch.randn(2, 16), torch.randint(0, 8, (2,))\n\n\ndef _batch("))
    for path in (item, only_data):
        model_file = load_model_file(str(path))
        assert meta_profile(Plan(model=str(path), hw="local", nodes=1), model_file) is None
        plan, _ = resolve_plan("tp=2,mbs=2,gbs=2", model=str(path))
        validate_plan(plan, model_file)  # no error
    (tmp_path / "tuple.py").write_text(TUPLE_MODEL)
    with pytest.raises(ModelFileError, match="must be Tensor, not tuple"):
        meta_profile(Plan(model=str(tmp_path / "tuple.py"), hw="local", nodes=1),
                     load_model_file(str(tmp_path / "tuple.py")))

