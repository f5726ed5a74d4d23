"""`smplan calibrate`: one-line rejections, --check writes nothing, a real 2-plan run."""

import json

import pytest
from smplan.hwprofiles import load_cluster
from smplan.hwprofiles.stack import STACK_DIR as STACKS

from smplan.calibrate.measure import Measured
from smplan.cli.main import cli
from tests.cli.conftest import fake_runs

GPT_TINY = "examples/gpt.py:tiny"


def _one_line_exit_2(result):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_missing_hw_file(cli_runner, tmp_path):
    line = _one_line_exit_2(cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(tmp_path / "nope.toml")]))
    assert "does not exist" in line


def test_zero_plans(cli_runner, probed):
    line = _one_line_exit_2(cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), "--plans", "0"]))
    assert "--plans must be at least 1" in line


def test_a_used_runs_dir_is_refused_as_runs_dir(cli_runner, probed, tmp_path):
    (tmp_path / "runs" / "plan1").mkdir(parents=True)
    (tmp_path / "runs" / "plan1" / "metrics.jsonl").write_text('{"step": 1, "loss": 4.0}\n')  # a step, as execute writes
    line = _one_line_exit_2(cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), "--check",
                                                    "--runs-dir", str(tmp_path / "runs")]))
    assert "--runs-dir" in line and "already holds" in line and "-o/--output" not in line


def test_a_run_directory_of_execute_is_refused_as_runs_dir(cli_runner, probed, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run_config.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 4.0}\n')
    line = _one_line_exit_2(cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), "--check",
                                                    "--runs-dir", str(run)]))
    assert "is the run directory of `smplan execute`" in line and "run_config.json, metrics.jsonl" in line
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "run_config.json"]


def test_a_gpu_profile_is_not_calibrated_from_runs_on_cpu(cli_runner, tmp_path, monkeypatch):
    # the fitted factors would be this CPU's, written into a file that still names A100s
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # a CPU machine, even on a GPU host
    line = _one_line_exit_2(cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", "a100x8", "--plans", "1",
                                                    "-o", str(tmp_path / "a100cal.toml")]))
    assert "which has no GPU, but a100x8 describes A100" in line and "smplan hw probe" in line
    assert not (tmp_path / "a100cal.toml").exists()


def test_refuses_to_overwrite_before_running_anything(cli_runner, probed, tmp_path, monkeypatch):
    def ran(*_, **__):
        raise AssertionError("a plan ran before the refusal")

    monkeypatch.setattr("smplan.calibrate.run.run_plan", ran)
    out = tmp_path / "cal.toml"
    out.write_text("keep me")
    line = _one_line_exit_2(cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), "-o", str(out)]))
    assert "--force" in line and out.read_text() == "keep me"


def test_check_reports_and_writes_nothing(cli_runner, probed, tmp_path, monkeypatch):
    from smplan.calibrate import local_cluster

    fake_runs(monkeypatch, GPT_TINY, local_cluster(str(probed), 2), 1.5)
    out = tmp_path / "cal.toml"
    result = cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), "--plans", "3", "--check",
                                     "-o", str(out), "--runs-dir", str(tmp_path / "runs"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert not out.exists() and report["output"] is None and report["efficiency_after"] is None
    assert len(report["plans"]) == 3 and report["calibrated"] == []
    for row in report["plans"]:
        assert row["ratio_predicted_over_measured"] == pytest.approx(1 / 1.5, rel=1e-6)


def test_two_plans_end_to_end(cli_runner, probed, tmp_path):
    """Real runs: 2 plans x 2 steps on 2 gloo processes; the output profile loads."""
    out = tmp_path / "cal.toml"
    result = cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), "--plans", "2", "--steps", "2",
                                     "--nproc-per-node", "2", "--global-batch", "4", "-o", str(out),
                                     "--runs-dir", str(tmp_path / "runs"), "--json"])
    report = json.loads(result.stdout)
    # the exit code, the file and the object agree: a fit not kept writes no -o and exits 2 after
    # the object, so `calibrate -o X && plan --hw X` stops
    assert (result.exit_code == 0) == report["fit_kept"] == out.exists(), result.output
    assert result.exit_code in (0, 2)
    assert len(report["plans"]) == 2 and not report["failed"]
    assert all(row["measured_s"] > 0 for row in report["plans"])
    assert report["fit_loss_after"] <= report["fit_loss_before"]
    if not report["fit_kept"]:  # real runs: the fit may miss them by more (median) than the profile did
        assert report["median_ape_after"] > report["median_ape_before"] and report["kept_input"]
        assert not out.exists() and report["output"] is None
        return
    cluster = load_cluster(str(out))  # loads and passes validation
    assert cluster.efficiency.matmul_max == pytest.approx(report["efficiency_after"]["matmul_max"], rel=1e-5)
    assert cluster.gpu.peak_tflops.fp32 == 0.15  # the rest of the profile is untouched


def test_a_failed_run_is_reported_and_the_rest_still_fit(cli_runner, probed, tmp_path, monkeypatch):
    from smplan.planner import estimate, profile_model

    from smplan.calibrate import local_cluster

    cluster = local_cluster(str(probed), 2)

    def fake_run(plan, label, model_file, steps, nproc, run_dir):
        if plan.pp > 1 and plan.micro_batch == 2:
            return Measured(plan, label, None, str(run_dir), "rank 1 exited with code 1")
        profile = profile_model(GPT_TINY, dtype=plan.dtype)
        return Measured(plan, label, 2.0 * estimate(plan, profile, cluster).step_time_s, str(run_dir))

    monkeypatch.setattr("smplan.calibrate.run.run_plan", fake_run)
    out = tmp_path / "cal.toml"
    result = cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), "--plans", "4", "-o", str(out),
                                     "--runs-dir", str(tmp_path / "runs"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [f["plan"].startswith("dp=1,tp=1,pp=2,mbs=2") for f in report["failed"]] == [True]
    assert len(report["plans"]) == 3 and load_cluster(str(out)).name == "local"
    assert report["median_ape_before"] > 0.4 and report["median_ape_after"] < 0.1  # 2x slower: the fit follows


def test_every_run_failing_is_one_line(cli_runner, probed, tmp_path, monkeypatch):
    monkeypatch.setattr("smplan.calibrate.run.run_plan",
                        lambda plan, label, mf, steps, nproc, run_dir: Measured(plan, label, None, str(run_dir), "x"))
    result = cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), "--plans", "1",
                                     "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    note, *progress, line = result.output.strip().splitlines()  # no -o's note, a progress line per plan, the error
    assert note.startswith("note: no -o given")
    assert len(progress) == 1 and "FAILED" in progress[0]
    assert line.startswith("error: every run failed")


def test_explicit_plan_of_the_wrong_size_is_refused_before_any_run(cli_runner, probed):
    line = _one_line_exit_2(cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), "--nproc", "2",
                                                    "--plan", "dp=2", "--plan", "dp=4,mbs=1"]))
    assert "--plan dp=4" in line and "--nproc-per-node is 2" in line


def test_a_plan_that_does_not_divide_the_global_batch_names_calibrates_option(cli_runner, probed, tmp_path, monkeypatch):
    """The planner's line said "use gbs=6 or 12", a key --plan refuses: the option is --global-batch."""
    from smplan.calibrate import local_cluster

    args = ["calibrate", GPT_TINY, "--hw", str(probed), "--plan", "dp=2,mbs=3", "--check"]
    line = _one_line_exit_2(cli_runner.invoke(cli, args))
    assert "dp*mbs=6 does not divide the global batch 8; use --global-batch 6 or 12" in line and "gbs" not in line
    line = _one_line_exit_2(cli_runner.invoke(cli, [*args[:-3], "--plan", "pp=2,mbs=8", "--check"]))
    assert "cannot fill 2 pipeline stages; use --global-batch 16 or more" in line and "gbs" not in line
    _runs_off_by(monkeypatch, local_cluster(str(probed), 2), [1.0])
    followed = cli_runner.invoke(cli, [*args, "--global-batch", "6", "--runs-dir", str(tmp_path / "runs")])
    assert followed.exit_code == 0, followed.output


def test_plan_keys_calibration_cannot_honour_are_one_line(cli_runner, probed):
    line = _one_line_exit_2(cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed),
                                                    "--plan", "dp=2,zero=1,sp=1"]))
    assert "zero, sp" in line and "dp, tp, pp, mbs, recompute" in line


def test_a_plan_the_executor_rejects_is_refused_before_any_run(cli_runner, probed, tmp_path, monkeypatch):
    """tp=2 does not divide fc1's 99 features: the cost model takes the plan, the executor would not."""
    model = tmp_path / "odd_mlp.py"
    model.write_text(open("examples/mlp.py").read().replace("4 * width", "3 * width"))
    monkeypatch.setattr("smplan.calibrate.run.run_plan",
                        lambda *args: pytest.fail("a plan ran before every plan was validated"))
    line = _one_line_exit_2(cli_runner.invoke(cli, [
        "calibrate", str(model), "--arg", "width=33", "--hw", str(probed), "--nproc", "2",
        "--plan", "dp=2", "--plan", "tp=2", "--runs-dir", str(tmp_path / "runs")]))
    assert "plan dp=1,tp=2" in line and "tp=2 does not divide fc1" in line and "nothing was run" in line
    assert not (tmp_path / "runs").exists()


def test_a_plan_this_machine_cannot_hold_is_refused_before_any_run(cli_runner, probed, tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("smplan.executor.run.available_host_bytes", lambda: 1024)
    monkeypatch.setattr("smplan.calibrate.run.run_plan",
                        lambda *args: pytest.fail("a plan ran before every plan was checked"))
    line = _one_line_exit_2(cli_runner.invoke(cli, [
        "calibrate", GPT_TINY, "--hw", str(probed), "--nproc", "2", "--plan", "dp=2",
        "--runs-dir", str(tmp_path / "runs")]))
    assert "on CPU this run needs at least" in line and "nothing was run" in line
    assert not (tmp_path / "runs").exists()


def test_hw_set_values_are_written_into_the_calibrated_profile(cli_runner, probed, tmp_path, monkeypatch):
    from smplan.planner import profile_model

    from smplan.calibrate import local_cluster

    hw_set = ["inter_node.bandwidth_gbps=7.5", "intra_node.bandwidth_gbps=3", "gpu.memory_gib=6"]
    cluster = local_cluster(str(probed), 2, hw_set)

    ran = []
    fake_runs(monkeypatch, GPT_TINY, cluster, 1.3, ran)
    out = tmp_path / "cal.toml"
    args = ["calibrate", GPT_TINY, "--hw", str(probed), "--plans", "3", "-o", str(out),
            "--runs-dir", str(tmp_path / "runs"), "--json"]
    for item in hw_set:
        args += ["--hw-set", item]
    result = cli_runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    saved = load_cluster(str(out))
    assert saved.inter_node.bandwidth_gbps == 7.5 and saved.intra_node.bandwidth_gbps == 3.0
    assert saved.gpu.memory_gib == 6.0 and saved.gpu.peak_tflops.fp32 == 0.15  # the rest untouched
    assert saved.efficiency.matmul_max == pytest.approx(report["efficiency_after"]["matmul_max"], rel=1e-5)
    text = out.read_text()
    assert "bandwidth_gbps = 7.5  # set by --hw-set" in text and "--hw-set inter_node.bandwidth_gbps=7.5" in text
    # the saved profile predicts what the fit predicted: it is the profile that was fitted
    from smplan.calibrate import predict

    saved_local = saved.with_overrides({"nodes": 1, "gpus_per_node": 2})
    profile = profile_model(GPT_TINY, dtype=ran[0].dtype)
    assert predict(ran, profile, saved_local) == pytest.approx([r["predicted_s"] for r in report["calibrated"]],
                                                               rel=1e-4)


def test_a_model_without_blocks_is_named_before_any_run(cli_runner, probed, tmp_path):
    # no mesh places such a model: the line names the model, not the global batch
    (tmp_path / "flat.py").write_text(
        "import torch\nfrom torch import nn\n\n\ndef build():\n    return nn.Linear(8, 8)\n\n\n"
        "def batch(micro_batch_size, model=None, seed=0):\n    x = torch.randn(micro_batch_size, 8)\n    return x, x\n\n\n"
        "def loss(out, y):\n    return ((out - y) ** 2).mean()\n")
    line = _one_line_exit_2(cli_runner.invoke(cli, ["calibrate", f"{tmp_path / 'flat.py'}:build", "--hw", str(probed),
                                                    "--check", "--runs-dir", str(tmp_path / "runs")]))
    assert "has no repeated blocks" in line and "global batch" not in line
    assert not (tmp_path / "runs").exists()


def _runs_off_by(monkeypatch, cluster, factors):
    """calibrate's runs replaced by measurements factors[i] x the cost model's step of the i-th plan run."""
    from smplan.planner import estimate, profile_model

    ran = []

    def run(plan, label, model_file, steps, nproc, run_dir):
        ran.append(label)
        profile = profile_model(plan.model, plan.model_args, dtype=plan.dtype)
        return Measured(plan, label, factors[(len(ran) - 1) % len(factors)] * estimate(plan, profile, cluster).step_time_s, str(run_dir))

    monkeypatch.setattr("smplan.calibrate.run.run_plan", run)
    return ran


def test_a_fit_worse_than_the_input_is_not_written(cli_runner, probed, tmp_path, monkeypatch):
    """Two plans as predicted, one 20x slower: least squares on log ratios moves every plan to
    meet the outlier halfway, so the median |error| grows; the input's factors are kept."""
    from smplan.calibrate import local_cluster

    _runs_off_by(monkeypatch, local_cluster(str(probed), 2), [1.0, 1.0, 20.0])
    out = tmp_path / "cal.toml"
    args = ["calibrate", GPT_TINY, "--hw", str(probed), "--plans", "3", "-o", str(out), "--runs-dir",
            str(tmp_path / "runs")]
    result = cli_runner.invoke(cli, args)
    # -o was asked for and not written: exit 2 (review: 0 let `calibrate -o X && plan --hw X` go on)
    assert result.exit_code == 2, result.output
    assert not out.exists() and "wrote" not in result.output and "warning:" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: kept")]
    assert len(errors) == 1 and f"so nothing was written to {out}" in errors[0], result.output
    assert "fitted (not kept):" in result.output
    again = cli_runner.invoke(cli, [*args[:-1], str(tmp_path / "runs2"), "--json"])
    assert again.exit_code == 2
    report = json.loads(again.stdout)
    assert report["fit_kept"] is False and report["output"] is None and not out.exists()
    assert report["median_ape_after"] > report["median_ape_before"]


def test_without_output_it_says_so_before_the_first_run(cli_runner, probed, tmp_path, monkeypatch):
    from smplan.calibrate import local_cluster

    ran = _runs_off_by(monkeypatch, local_cluster(str(probed), 2), [1.3] * 3)
    result = cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), "--plans", "1", "--runs-dir",
                                     str(tmp_path / "runs"), "--json"])
    assert result.exit_code == 0, result.output
    first, second = result.stderr.splitlines()[:2]
    assert first.startswith("note: no -o given") and "nothing written" in first and second.startswith("[1/1]")
    assert ran and json.loads(result.stdout)["output"] is None
    with_output = cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), "--plans", "1", "--runs-dir",
                                          str(tmp_path / "runs2"), "-o", str(tmp_path / "cal.toml")])
    assert with_output.exit_code == 0 and "no -o given" not in with_output.output


def test_a_calibrated_host_time_is_not_called_the_stacks(cli_runner, probed, tmp_path):
    """`plan --hw cal.toml` printed 'the stack's figure for a GPU cluster' beside the fitted host time."""
    import dataclasses

    from smplan.hwprofiles.profile_file import with_efficiency, write_profile

    fitted = dataclasses.replace(load_cluster(str(probed)).efficiency, host_overhead_us_per_layer=1526.99)
    cal = write_profile(with_efficiency(probed.read_text(), fitted, ["calibrated in a test"]), tmp_path / "cal.toml")

    def note(*args):
        result = cli_runner.invoke(cli, ["plan", GPT_TINY, "--top", "1", *args])
        assert result.exit_code == 0, result.output
        return next(line for line in result.output.splitlines() if line.startswith("note:") and "per layer pass" in line)

    calibrated = note("--hw", str(cal))
    assert "1526.99 us per layer pass" in calibrated and "stack's" not in calibrated
    assert "smplan calibrate` fits it" not in calibrated
    uncalibrated = note("--hw", str(probed))  # the stack's 1075 us: calibrate fits it
    assert "1075 us per layer pass, the stack's figure for a GPU cluster" in uncalibrated
    replaced = note("--hw", str(cal), "--stack", "torchtitan")  # another stack replaces the file's fit
    assert "1075 us per layer pass, the stack's figure" in replaced
    overridden = note("--hw", str(probed), "--hw-set", "efficiency.host_overhead_us_per_layer=2000")
    assert "2000 us per layer pass" in overridden and "stack's" not in overridden
    # a --stack file (calibrate's --stack-output) states its own host time, even one equal to a bundled
    # stack's: the note sent the user back to `smplan calibrate`, which had just written it
    stack_file = tmp_path / "calstack.toml"
    stack_file.write_text((STACKS / "megatron-core.toml").read_text())
    from_file = note("--hw", str(probed), "--stack", str(stack_file))
    assert "1075 us per layer pass" in from_file and "stack's" not in from_file
    assert "smplan calibrate` fits it" not in from_file and "a --stack file or --hw-set sets it" in from_file


def test_a_fit_to_plans_of_one_layout_says_what_it_did_not_cover(cli_runner, probed, tmp_path, monkeypatch):
    """Plans of dp=2 alone fit the factors to that layout: the small error says nothing of tp or pp."""
    from smplan.calibrate import local_cluster

    _runs_off_by(monkeypatch, local_cluster(str(probed), 2), [1.3, 1.5])
    args = ["calibrate", GPT_TINY, "--hw", str(probed), "--plan", "dp=2,mbs=4", "--plan", "dp=2,mbs=2,recompute=full"]
    result = cli_runner.invoke(cli, [*args, "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: every plan fitted")]
    assert len(notes) == 1 and "runs dp=2,tp=1,pp=1, so the fit is checked on that layout alone" in notes[0], \
        result.output
    assert "no dp=1,tp=1,pp=2, dp=1,tp=2,pp=1 (add them with --plan" in notes[0] and "nor ZeRO/FSDP" in notes[0]
    mixed = cli_runner.invoke(cli, [*args[:-2], "--plan", "tp=2,mbs=2", "--runs-dir", str(tmp_path / "runs2"),
                                    "--json"])
    assert mixed.exit_code == 0 and json.loads(mixed.stdout)["coverage_note"] is None, mixed.output


def test_a_host_time_the_plans_hide_is_not_called_fitted(cli_runner, probed, tmp_path, monkeypatch):
    """hidden=256's GPU work hides the host time (a max, not a sum): the fit kept 1075 from its prior,
    yet printed `1075 -> 1075` and wrote it to the stack file as 'fitted by smplan calibrate'."""
    from smplan.calibrate import local_cluster

    _runs_off_by(monkeypatch, local_cluster(str(probed), 2), [0.78, 0.8, 0.97])
    out, stack = tmp_path / "cal.toml", tmp_path / "calstack.toml"
    args = ["calibrate", "examples/gpt.py", "--arg", "hidden=256", "--arg", "seq_len=128", "--hw", str(probed),
            "-o", str(out), "--stack-output", str(stack)]
    result = cli_runner.invoke(cli, [*args, "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert "efficiency.host_overhead_us_per_layer: not determined by these plans (kept 1075)" in result.output
    assert "efficiency.matmul_half_dim: 40 -> " in result.output  # the runs did set this one
    assert "note: not determined by these plans: host_overhead_us_per_layer" in result.output
    line = next(x for x in stack.read_text().splitlines() if x.startswith("host_overhead_us_per_layer ="))
    assert line.endswith(": not determined by these plans (kept 1075)") and "fitted" not in line
    assert "# not determined by these plans: host_overhead_us_per_layer" in out.read_text()
    report = json.loads(cli_runner.invoke(cli, [*args, "--force", "--runs-dir", str(tmp_path / "runs2"), "--json"]).stdout)
    host = report["factors"]["host_overhead_us_per_layer"]
    assert host["determined"] is False and host["state"] == "not determined by these plans (kept 1075)"
    assert report["factors"]["matmul_half_dim"]["state"] == "fitted"


def test_a_runs_dir_whose_run_folder_holds_other_files_is_refused_before_any_write(cli_runner, probed, tmp_path):
    """calibrate runs plan N in RUNS_DIR/planN: one holding a user's files is refused up front (execute
    would refuse it only after the run's log had been started in it), naming --runs-dir."""
    theirs = tmp_path / "runs" / "plan1"
    theirs.mkdir(parents=True)
    (theirs / "notes.txt").write_text("mine")
    (tmp_path / "runs" / "planning.md").write_text("not a run folder's name")
    line = _one_line_exit_2(cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), "--check",
                                                    "--runs-dir", str(tmp_path / "runs")]))
    assert "--runs-dir" in line and "already holds plan1" in line and "-o/--output" not in line
    assert sorted(p.name for p in theirs.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("option, value, rule", [("--steps", "1", "x>=2"), ("--rounds", "0", "x>=1"),
                                                 ("--nproc-per-node", "0", "x>=1"), ("--plans", "-1", "x>=0")])
def test_counts_show_their_range_in_help_and_refuse_outside_it(cli_runner, probed, option, value, rule):
    assert f"{rule}]" in " ".join(cli_runner.invoke(cli, ["calibrate", "--help"]).output.split())
    line = _one_line_exit_2(cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), option, value]))
    assert option in line and rule in line


def test_on_cpu_the_automatic_pick_leaves_tp_out_and_says_so(cli_runner, probed, tmp_path, monkeypatch):
    """A tp=2 plan ran 7x its prediction on CPU (DTensor dispatch) and the README's calibrate
    command kept nothing (a review); the pick a GPU would run holds one, so the note says why not."""
    from smplan.calibrate import local_cluster

    _runs_off_by(monkeypatch, local_cluster(str(probed), 2), [1.3] * 3)
    result = cli_runner.invoke(cli, ["calibrate", GPT_TINY, "--hw", str(probed), "--runs-dir",
                                     str(tmp_path / "runs"), "--json"])
    assert result.exit_code == 0, result.output
    assert "note: tp plans are not picked on CPU" in result.stderr
    assert all(",tp=1," in row["label"] for row in json.loads(result.stdout)["plans"])
