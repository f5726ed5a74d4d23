"""Bad command-line values: one line, exit 2, before any work, nothing overwritten."""

from pathlib import Path

import pytest

from smplan.cli.main import cli

TINY = "examples/gpt.py:tiny"
SIM = ["simulate", TINY, "--hw", "a100x8", "--plan", "dp=2,mbs=1,gbs=8"]


def _error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("extra, says", [
    (["--gantt", "{tmp}/missing/g.png"], "does not exist"),
    (["--gantt", "{tmp}/g.txt"], "unknown image type"),
    (["--trace", "{tmp}/missing/t.json"], "does not exist"),
    (["--ps-servers", "2"], "--dp-pattern ps"),
])
def test_simulate_refuses_before_work(cli_runner, tmp_path, extra, says):
    result = cli_runner.invoke(cli, SIM + [e.format(tmp=tmp_path) for e in extra])
    assert result.exit_code == 2
    assert says in _error_line(result)


@pytest.mark.parametrize("option", ["--trace", "--gantt"])
def test_simulate_does_not_overwrite_without_force(cli_runner, tmp_path, option):
    target = tmp_path / ("t.json" if option == "--trace" else "g.png")
    target.write_text("the user's file")
    result = cli_runner.invoke(cli, SIM + [option, str(target)])
    assert result.exit_code == 2 and "--force" in _error_line(result)
    assert target.read_text() == "the user's file"
    forced = cli_runner.invoke(cli, SIM + [option, str(target), "--force"])
    assert forced.exit_code == 0, forced.output
    assert target.read_bytes() != b"the user's file"


@pytest.mark.parametrize("args", [["--days", "inf"], ["--days", "nan"], ["--days", "0"], ["--days", "-1"],
                                  ["--days", "1e6"], ["--tokens", "1e30"], ["--tokens", "inf"]])
def test_reliability_refuses_unbounded_runs(cli_runner, args):
    result = cli_runner.invoke(cli, ["reliability", TINY, "--hw", "a100x8", "--plan", "dp=2,mbs=1,gbs=8", *args])
    assert result.exit_code == 2
    assert args[0] in _error_line(result)


@pytest.mark.parametrize("lr", ["-1", "0", "nan"])
def test_execute_refuses_a_bad_learning_rate_before_launch(cli_runner, tmp_path, lr):
    result = cli_runner.invoke(cli, ["execute", "dp=2,mbs=1,gbs=4", "--model", TINY, "--lr", lr,
                                     "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "--lr" in _error_line(result)
    assert not (tmp_path / "run").exists()


def test_plan_output_into_a_missing_folder(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "-o", str(tmp_path / "missing" / "p.json")])
    assert result.exit_code == 2
    assert "does not exist" in _error_line(result)


def test_hw_show_refuses_two_profiles(cli_runner):
    result = cli_runner.invoke(cli, ["hw", "show", "a100x8", "--hw", "h100x8"])
    assert result.exit_code == 2
    assert "two profiles" in _error_line(result)
    same = cli_runner.invoke(cli, ["hw", "show", "a100x8", "--hw", "a100x8"])
    assert same.exit_code == 0 and same.output.startswith("a100x8")


def test_hw_list_shows_a_missing_peak_as_a_dash(cli_runner):
    result = cli_runner.invoke(cli, ["hw", "list"])
    v100 = next(line for line in result.output.splitlines() if line.startswith("v100x8"))
    assert " - " in v100


@pytest.mark.parametrize("setting, says", [
    ("efficiency.ep_dispatcher=dedup", "efficiency.ep_dispatcher must be one of all_to_all, node_dedup, got 'dedup'"),
    ("efficiency.ep_dispatcher=3", "'efficiency.ep_dispatcher' must be text, got 3"),
    ("efficiency.host_overhead_us_per_moe_layer=-1", "host_overhead_us_per_moe_layer must not be negative"),
])
def test_bad_moe_stack_settings_are_one_line(cli_runner, setting, says):
    result = cli_runner.invoke(cli, SIM + ["--hw-set", setting])
    assert result.exit_code == 2
    assert says in _error_line(result)


@pytest.mark.parametrize("vary, says", [
    ("hw=a100x8,zz", "unknown hardware profile 'zz'; use one of a100-40gx8, a100x8"),
    ("nodez=1,2", "did you mean nodes?"),
    ("layerz=1,2", "--vary key 'layerz' is unknown"),  # a preset's builder takes **overrides
    ("efficiency.ep_dispatcher=all_to_all,deepep", "must be one of all_to_all, node_dedup, got 'deepep'"),
    ("inter_node.bandwidth_gbps=fast", "'inter_node.bandwidth_gbps' must be a number"),
    # plan values are read as --plan reads them: a typo is an error, not an "infeasible" point
    ("recompute=full,foo", "--vary recompute: recompute must be one of none, selective, sac, full, got 'foo'"),
    ("schedule=1f1b,foo", "schedule must be one of gpipe, 1f1b, interleaved, got 'foo'"),
    ("sp=0,2", "--vary sp: sequence_parallel must be 0 or 1, got '2'"),
    ("overlap_dp=7", "overlap_dp must be 0 or 1"),
    ("zero=1,4", "zero must be 0, 1, 2 or 3, got 4"),
    ("tp=0,2", "tp must be a whole number >= 1, got 0"),
    ("pp=2,4294967296", "pp must be at most 1048576 (a typo guard), got 4294967296"),
    ("mbs=1.5", "micro_batch must be a whole number, got '1.5'"),
    ("cf=nan", "capacity_factor must be a number in [1, 16]"),
    ("cf=0.5", "capacity_factor must be a number in [1, 16], got 0.5; 1.0 is balanced routing"),
    # NaN and infinities: one line, not a traceback from int()
    ("nodes=nan", "--vary nodes values must be finite numbers, got 'nan'"),
    ("nodes=1,,2", "--vary nodes=1,,2 has an empty value between commas"),
    ("arg.layers=abc,2", "--vary arg.layers: examples/gpt.py: --arg layers must be a whole number, got 'abc'"),
    ("tp=inf", "tp must be a whole number, got 'inf'"),
    ("global_batch=1e400", "--vary global_batch values must be finite numbers"),
    ("checkpoint_interval_min=nan", "must be finite numbers"),
    ("inter_node.bandwidth_gbps=inf", "must be finite numbers"),
])
def test_whatif_unknown_vary_values_name_the_valid_ones(cli_runner, tmp_path, vary, says):
    out = tmp_path / "report"
    result = cli_runner.invoke(cli, ["whatif", TINY, "--hw", "a100x8", "--vary", vary, "-o", str(out)])
    assert result.exit_code == 2
    assert says in _error_line(result)
    assert not out.exists()


def test_execute_of_a_model_without_data_is_refused_before_launch(cli_runner, tmp_path):
    model = tmp_path / "seq.py"  # the model itself is the stack of blocks; no batch() or data()
    model.write_text("from torch import nn\n\n\ndef model():\n    return nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])\n")
    result = cli_runner.invoke(cli, ["execute", "dp=2,mbs=1,gbs=2", "--model", str(model), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "defines neither batch(" in _error_line(result)
    assert not (tmp_path / "run").exists()


def test_simulate_of_a_model_on_v100_defaults_to_fp16(cli_runner):
    import json

    result = cli_runner.invoke(cli, ["simulate", TINY, "--hw", "v100x8", "--plan", "dp=8,mbs=1,gbs=8", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plan"]["dtype"] == "fp16"


@pytest.mark.parametrize("args", [["--mtbf-hours", "nan"], ["--restart-minutes", "-1"], ["--checkpoint-minutes", "inf"],
                                  ["--repair-hours", "nan"], ["--weibull-shape", "inf"]])
def test_reliability_refuses_non_finite_failure_settings(cli_runner, args):
    result = cli_runner.invoke(cli, ["reliability", TINY, "--hw", "a100x8", "--plan", "dp=2,mbs=1,gbs=8", "--days", "1",
                                     *args])
    assert result.exit_code == 2
    assert args[0] in _error_line(result)


def test_an_inline_plan_smaller_than_the_nodes_given_is_refused(cli_runner, tmp_path):
    # tp=2,dp=4 is 8 GPUs: on 2 nodes the other 8 would idle while the result said 16
    result = cli_runner.invoke(cli, ["simulate", TINY, "--hw", "a100x8", "--nodes", "2", "--plan", "tp=2,dp=4"])
    assert result.exit_code == 2
    assert "lays out 8 GPUs (1 node of 8); 2 nodes would leave the rest idle: drop dp=" in _error_line(result)
    filled = cli_runner.invoke(cli, ["simulate", TINY, "--hw", "a100x8", "--nodes", "2", "--plan", "tp=2", "--json"])
    assert filled.exit_code == 0 and '"dp": 8' in filled.stdout


def test_whatif_marks_a_size_the_fixed_plan_does_not_fill(cli_runner, tmp_path):
    import json

    result = cli_runner.invoke(cli, ["whatif", TINY, "--hw", "a100x8", "--plan", "tp=2,dp=4", "--vary", "nodes=1,2",
                                     "--json", "-o", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    points = json.loads(result.stdout)["points"]
    assert [p["feasible"] for p in points] == [True, False]
    assert "2 nodes would leave the rest idle: dp= in --plan fixes it; leave dp out" in points[1]["reason"]


def test_whatif_sweeps_zero_0_as_plan_and_simulate_take_it(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["whatif", TINY, "--hw", "a100x8", "--vary", "zero=0,1", "--json",
                                     "-o", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("args", [["--checkpoint-interval-min", "nan"], ["--checkpoint-interval-min", "inf"]])
def test_reliability_refuses_a_non_finite_checkpoint_interval(cli_runner, args):
    result = cli_runner.invoke(cli, ["reliability", TINY, "--hw", "a100x8", "--plan", "dp=2,mbs=1,gbs=8", "--days", "1",
                                     *args])
    assert result.exit_code == 2
    assert "--checkpoint-interval-min must be a finite number of minutes > 0" in _error_line(result)


@pytest.mark.parametrize("size", ["nan", "inf", "0"])
def test_export_refuses_a_shard_size_that_is_no_size(cli_runner, tmp_path, size):
    result = cli_runner.invoke(cli, ["export", str(tmp_path), str(tmp_path / "out"), "--max-shard-gib", size])
    assert result.exit_code == 2
    assert "--max-shard-gib must be" in _error_line(result)


@pytest.mark.parametrize("args", [["--tokens", "inf"], ["--days", "nan"], ["--checkpoint-interval-min", "inf"],
                                  ["--tokens", "1e30"]])
def test_whatif_refuses_non_finite_amounts(cli_runner, tmp_path, args):
    result = cli_runner.invoke(cli, ["whatif", TINY, "--hw", "a100x8", "--vary", "nodes=1,2", *args,
                                     "-o", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert args[0] in _error_line(result)


@pytest.mark.parametrize("args", [["--interval", "inf"], ["--straggler-pct", "nan"]])
def test_monitor_refuses_non_finite_settings(cli_runner, tmp_path, args):
    result = cli_runner.invoke(cli, ["monitor", str(tmp_path), *args])
    assert result.exit_code == 2
    assert args[0] in _error_line(result)


@pytest.mark.parametrize("model, arg", [(TINY, "layers=0"), (TINY, "dropout=1.5"), ("examples/moe.py:tiny", "top_k=0")])
def test_example_models_refuse_impossible_sizes(cli_runner, model, arg):
    result = cli_runner.invoke(cli, ["profile", model, "--arg", arg, "--no-cache"])
    assert result.exit_code == 2
    assert arg.split("=")[0] in _error_line(result)


@pytest.mark.parametrize("args, says", [
    (["plan", TINY, "--hw", "a100x8", "--nodes", "0"], "'--nodes': 0 is not in the range"),
    (["plan", TINY, "--bogus"], "No such option '--bogus'"),
    (["plan"], "Missing argument 'MODEL'"),
    (["nosuch"], "No such command 'nosuch'"),
    (["profile", TINY, "--dtype", "fp7"], "'--dtype'"),
    (["hw", "show", "a100x8", "h100x8"], "unexpected extra argument"),
    (["execute", "dp=2,mbs=1,gbs=2", "--model", TINY, "--keep-checkpoints", "-1"], "'--keep-checkpoints': -1 is not"),
])
def test_click_usage_errors_are_one_line_naming_the_help(cli_runner, args, says):
    result = cli_runner.invoke(cli, args)
    assert result.exit_code == 2
    line = _error_line(result)
    assert line.startswith("error: ") and says in line and "--help'" in line


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("args", [
    ["plan", TINY, "--hw", "a100x8", "-o", "/proc/smplan-test.json"],
    [*SIM, "--gantt", "/proc/smplan-test.png"],
    ["whatif", TINY, "--hw", "a100x8", "--vary", "nodes=1", "-o", "/proc/smplan-test"],
    ["execute", "dp=2,mbs=1,gbs=2", "--model", TINY, "--steps", "1", "--checkpoint-dir", "/proc/smplan-ck",
     "--checkpoint-every", "1"],
])
def test_an_output_nobody_can_write_is_refused_before_any_work(cli_runner, args):
    """/proc takes no new files, not even root's: the folder exists but the write would fail."""
    result = cli_runner.invoke(cli, args)
    assert result.exit_code == 2
    assert "cannot write in /proc (it takes no new files)" in _error_line(result)


def test_simulate_of_a_plan_file_refuses_a_new_shape(cli_runner, tmp_path):
    plan = tmp_path / "p.json"
    assert cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "-o", str(plan)]).exit_code == 0
    for extra in (["--seq-len", "8"], ["--arg", "layers=2"]):
        result = cli_runner.invoke(cli, ["simulate", str(plan), *extra])
        assert result.exit_code == 2
        assert "fixes the model's --arg and --seq-len" in _error_line(result)


def test_plan_refuses_a_bad_grad_compress_in_one_line(cli_runner):
    for value, says in (("zip", "grad_compress must be none, bf16 or powersgd:R"), ("powersgd:0", "powersgd rank")):
        result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", f"grad_compress={value}"])
        assert result.exit_code == 2
        assert says in _error_line(result)


@pytest.mark.parametrize("extra, says", [
    (["--plan", "tp=2", "--vary", "tp=1,2"], "--vary tp and --plan's tp both set it"),
    (["--vary", "nodes=1,2", "--nodes", "4"], "--vary nodes and --nodes"),
    (["--vary", "seq_len=8", "--seq-len", "16"], "--vary seq_len and --seq-len"),
    (["--vary", "arg.layers=2,4", "--arg", "layers=2"], "--vary arg.layers and --arg layers"),
    (["--vary", "inter_node.bandwidth_gbps=10,20", "--hw-set", "inter_node.bandwidth_gbps=5"], "--hw-set"),
    (["--vary", "inter_node.bandwidth_gbps=-1,5"], "must be greater than 0"),
    (["--checkpoint-interval-min", "10"], "add --tokens or --days"),
    (["--vary", "hw=h100x8,l40sx8"], "--hw a100x8 is not among --vary hw's values"),
    (["--dtype", "fp8", "--vary", "dtype=bf16,fp8"], "--vary dtype and --dtype both set it"),
    (["--dtype", "fp8", "--plan", "dp=8,dtype=bf16"], "--dtype and --plan's dtype both set it"),
    (["--dtype", "fp8"], "--dtype fp8 needs FP8 tensor cores, but a100x8 has no gpu.peak_tflops.fp8; use --dtype bf16"),
    (["--plan", "dp=8,dtype=fp8"], "--plan's dtype=fp8 needs FP8 tensor cores"),
    (["--stack", "torchtitan", "--vary", "stack=megatron-core,pytorch-fsdp"], "--stack torchtitan is not among"),
])
def test_whatif_refuses_what_it_would_silently_ignore(cli_runner, tmp_path, extra, says):
    out = tmp_path / "w"
    result = cli_runner.invoke(cli, ["whatif", TINY, "--hw", "a100x8", *extra, "-o", str(out)])
    assert result.exit_code == 2
    assert says in _error_line(result)
    assert not out.exists()


def test_an_empty_builder_name_is_refused(cli_runner):
    result = cli_runner.invoke(cli, ["profile", "examples/gpt.py:"])
    assert result.exit_code == 2 and "names no builder after ':'" in _error_line(result)


def test_layouts_name_cp_and_ep(cli_runner):
    head = cli_runner.invoke(cli, ["simulate", TINY, "--hw", "a100x8", "--plan", "dp=4,cp=2,mbs=1,gbs=4"])
    assert head.exit_code == 0 and "tp=1 pp=1 dp=4 cp=2 on 8 GPUs" in head.output.splitlines()[0]
    moe = cli_runner.invoke(cli, ["plan", "examples/moe.py:tiny", "--hw", "h100x8", "--explain", "--top", "5"])
    explained = [line for line in moe.output.splitlines() if "step time (" in line or "ties with the best" in line]
    assert explained and any(" ep=" in line for line in explained)


@pytest.mark.parametrize("args", [[], ["hw"], ["stack"]])
def test_a_group_alone_shows_its_help_not_an_error(cli_runner, args):
    result = cli_runner.invoke(cli, args)
    assert result.output.startswith("Usage: ") and "error:" not in result.output
    assert "Commands:" in result.output


def test_a_text_hardware_key_can_be_swept():
    from smplan.whatif import parse_vary

    assert parse_vary("efficiency.ep_dispatcher=all_to_all,node_dedup").values == ("all_to_all", "node_dedup")


def test_a_swept_hardware_value_is_held_against_the_given_profile():
    """nvlink_domain_gpus must be a multiple of the profile's GPUs per node: 4 is fine on a
    GB200 NVL72 (4-GPU trays), as it is not on an 8-GPU node."""
    from smplan.whatif import Question, parse_vary

    Question(model=TINY, hw="gb200nvl72", nodes=18, varies=(parse_vary("nvlink_domain_gpus=4,36,72"),))
    with pytest.raises(ValueError, match="nvlink_domain_gpus"):
        Question(model=TINY, hw="a100x8", nodes=2, varies=(parse_vary("nvlink_domain_gpus=4"),))


def test_powersgd_with_tp_or_pp_fixed_is_refused(cli_runner):
    for extra in ("tp=2", "pp=2"):
        result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", f"grad_compress=powersgd:4,{extra}"])
        assert result.exit_code == 2 and "torch DDP's comm hook" in _error_line(result)


def test_an_existing_writable_file_is_replaced_with_force_even_in_a_closed_folder(cli_runner):
    """/dev takes no new files from a user, but /dev/null is writable: --force may replace it."""
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "-o", "/dev/null", "--force"])
    assert result.exit_code == 0, result.output


def test_two_different_sequence_lengths_are_refused(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--seq-len", "32", "--arg", "seq_len=64"])
    assert result.exit_code == 2 and "two sequence lengths" in _error_line(result), result.output
    same = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--seq-len", "32", "--arg", "seq_len=32"])
    assert same.exit_code == 0, same.output


@pytest.mark.parametrize("key", ["v=0", "tp=0", "cp=0", "mbs=0"])
def test_an_inline_count_of_zero_is_one_line_not_a_division_by_zero(cli_runner, key):
    # v=0 used to divide the stage split by zero (ZeroDivisionError) before any check
    result = cli_runner.invoke(cli, ["simulate", TINY, "--hw", "a100x8", "--plan", f"dp=8,{key}"])
    assert result.exit_code == 2 and "must be a whole number >= 1, got 0" in _error_line(result), result.output


def test_execute_names_its_own_options_when_the_processes_do_not_match(cli_runner):
    result = cli_runner.invoke(cli, ["execute", "dp=2,mbs=1,gbs=2", "--model", TINY, "--nproc-per-node", "1"])
    assert result.exit_code == 2 and "--nproc-per-node / --nnodes" in _error_line(result), result.output
    assert "--nodes" not in _error_line(result).replace("--nnodes", "")


def test_a_checkpoint_dir_that_will_stay_empty_says_so(cli_runner, tmp_path):
    # --launcher slurm writes the job script and runs nothing: the note comes before any launch
    args = ["execute", "dp=2,mbs=1,gbs=2", "--model", TINY, "--steps", "2", "--launcher", "slurm",
            "--checkpoint-dir", str(tmp_path / "ck")]
    quiet = cli_runner.invoke(cli, [*args, "--checkpoint-every", "1", "-o", str(tmp_path / "a")])
    assert quiet.exit_code == 0 and "holds no checkpoint" not in quiet.stderr, quiet.output
    noted = cli_runner.invoke(cli, [*args, "-o", str(tmp_path / "b")])
    assert noted.exit_code == 0 and "without --checkpoint-every N this run writes none there" in noted.stderr


def test_calibrate_refuses_one_file_for_both_outputs_before_any_run(cli_runner, tmp_path):
    (tmp_path / "sub").mkdir()  # the same file by another spelling: only resolve() tells
    result = cli_runner.invoke(cli, ["calibrate", TINY, "--hw", "a100x8", "-o", str(tmp_path / "same.toml"),
                                     "--stack-output", f"{tmp_path}/sub/../same.toml"])
    assert result.exit_code == 2
    assert "-o/--output and --stack-output both name" in _error_line(result)
    assert not (tmp_path / "same.toml").exists()


def test_report_names_a_missing_run_directory_as_such(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["report", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "run directory" in _error_line(result) and "does not exist" in _error_line(result)
    assert "-o/--output" not in _error_line(result).split(";")[0]


def test_tp_that_does_not_divide_the_kv_heads_says_kv_heads(cli_runner):
    # examples/gpt.py:tiny has 4 heads; tp=8 cannot split them
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "tp=8"])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]  # after the profiling line
    assert len(errors) == 1 and "4 key/value heads (tp splits attention by them); use tp=4" in errors[0]


@pytest.mark.parametrize("args, says", [
    (["stack", "show", ""], "give a stack name or a path to a .toml file"),
    (["profile", ""], "the model reference is empty"),
    (["export", "{tmp}/metrics.jsonl", "{tmp}/out"], "is a file, not a run directory"),
])
def test_empty_names_and_files_for_folders_are_one_line(cli_runner, tmp_path, args, says):
    (tmp_path / "metrics.jsonl").write_text("")
    result = cli_runner.invoke(cli, [a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2
    assert says in _error_line(result)


def test_a_forward_that_does_not_take_the_batch_says_how_inputs_arrive(cli_runner, tmp_path):
    model = tmp_path / "dictin.py"
    model.write_text(
        "import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))\n\n"
        "    def forward(self, inputs):\n        x = inputs['x']\n        for b in self.blocks:\n"
        "            x = b(x)\n        return x\n\n\ndef model():\n    return Net()\n\n\n"
        "def batch(micro_batch_size, model=None, seed=0):\n"
        "    return {'x': torch.randn(micro_batch_size, 4)}, torch.randn(micro_batch_size, 4)\n")
    result = cli_runner.invoke(cli, ["profile", str(model)])
    assert result.exit_code == 2
    line = [x for x in result.output.splitlines() if x.startswith("error:")][0]
    assert "unexpected keyword argument 'x'" in line and "forward(**inputs) for a dict" in line


@pytest.mark.parametrize("args, says", [
    (["simulate", "hwprofiles/profiles/a100x8.toml"], "is neither a plan file (.json, from smplan plan -o) nor a model"),
    (["simulate", "examples"], "is neither a plan file"),
    (["execute", TINY], "'examples/gpt.py:tiny' is not a plan: give a plan file (smplan plan examples/gpt.py:tiny"),
    (["whatif", TINY, "--hw", "a100x8", "--vary", "nodes=1,2", "--vary", "nodes=4"],
     "--vary nodes is given twice; list all its values in one --vary nodes=V1,V2"),
])
def test_a_target_of_the_wrong_kind_is_named_as_such(cli_runner, tmp_path, args, says):
    result = cli_runner.invoke(cli, [*args, *(["-o", str(tmp_path / "w")] if args[0] == "whatif" else [])])
    assert result.exit_code == 2 and says in _error_line(result)


def test_a_builder_raising_without_arguments_is_not_said_to_reject_them(cli_runner, tmp_path):
    model = tmp_path / "boom.py"
    model.write_text("def model():\n    raise ValueError('boom')\n")
    line = _error_line(cli_runner.invoke(cli, ["profile", str(model)]))
    assert "model() raised ValueError: boom (line 2 of boom.py)" in line and "arguments" not in line


def test_monitor_names_unreadable_metrics(cli_runner, tmp_path):
    (tmp_path / "metrics.jsonl").write_text("garbage\n")
    line = _error_line(cli_runner.invoke(cli, ["monitor", str(tmp_path)]))
    assert "holds no step yet (1 unreadable line(s) in metrics.jsonl)" in line


def test_a_plan_file_whose_degrees_leave_its_nodes_idle_is_refused(cli_runner, tmp_path):
    import json

    plan = tmp_path / "plan.json"
    made = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--nodes", "2", "--fix", "tp=1,pp=1,cp=1",
                                   "--global-batch", "16", "-o", str(plan)])
    assert made.exit_code == 0, made.output
    assert cli_runner.invoke(cli, ["simulate", str(plan)]).exit_code == 0  # the planner's own file fills them
    data = json.loads(plan.read_text())
    data.update(dp=8, global_batch=8)  # hand-edited: one node's worth on the two nodes it names
    data.pop("num_microbatches", None)
    plan.write_text(json.dumps(data))
    for command in (["simulate", str(plan)], ["reliability", str(plan), "--days", "1"]):
        line = _error_line(cli_runner.invoke(cli, command))
        assert "lays out 8 GPUs (1 node of 8); 2 nodes would leave the rest idle: set its nodes" in line, line


def test_a_trailing_comma_in_vary_is_no_empty_value():
    from smplan.whatif import parse_vary

    assert parse_vary("nodes=1,2,").values == (1, 2)


def test_simulate_notes_a_plan_file_whose_recorded_prediction_is_not_its_own(cli_runner, tmp_path):
    import json

    plan = tmp_path / "plan.json"
    assert cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--global-batch", "16", "-o", str(plan)]).exit_code == 0
    assert "records a predicted step" not in cli_runner.invoke(cli, ["simulate", str(plan)]).output
    closed = tmp_path / "closed.json"
    made = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--global-batch", "16", "--closed-form",
                                   "-o", str(closed)])
    assert made.exit_code == 0 and "records a predicted step" not in cli_runner.invoke(cli, ["simulate", str(closed)]).output
    data = json.loads(plan.read_text())
    data["predicted"]["step_time_s"] = 99.0  # hand-edited
    plan.write_text(json.dumps(data))
    result = cli_runner.invoke(cli, ["simulate", str(plan)])
    assert result.exit_code == 0 and f"note: {plan} records a predicted step of 99 s but simulating it gives" in result.output


def test_plan_without_hw_says_it_is_missing(cli_runner):
    """--hw is required by plan: click 8.2+ would take an explicit default=None as a default and
    never report it missing (the command then died on None)."""
    result = cli_runner.invoke(cli, ["plan", TINY])
    assert result.exit_code == 2
    assert _error_line(result).startswith("error: Missing option '--hw'; see '")


def test_a_plan_file_whose_model_is_in_neither_place_names_both(cli_runner, tmp_path):
    """A plan moved without its model file: the error says where it looked and what to do."""
    import json

    path = tmp_path / "p.json"
    assert cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "-o", str(path)]).exit_code == 0
    data = json.loads(path.read_text())
    data["model"] = "nowhere/gpt.py:tiny"
    path.write_text(json.dumps(data))
    line = _error_line(cli_runner.invoke(cli, ["simulate", str(path)]))
    assert line.startswith(f"error: plan file {str(path)!r} names model 'nowhere/gpt.py:tiny', which is neither "
                           f"beside it ({tmp_path / 'nowhere' / 'gpt.py'}) nor below the working directory (")
    assert line.endswith('copy the model file there, or fix its "model" key')
    executed = cli_runner.invoke(cli, ["execute", str(path), "--steps", "1", "--out", str(tmp_path / "run")])
    assert executed.exit_code == 2 and _error_line(executed).endswith('or pass --model PATH (or fix its "model" key)')
    assert not (tmp_path / "run").exists()


def test_execute_names_the_fix_for_a_sequence_length_the_plan_was_not_made_for(cli_runner, tmp_path):
    plan = tmp_path / "p.json"
    made = cli_runner.invoke(cli, ["plan", "examples/gpt.py:tiny", "--hw", "a100x8", "--seq-len", "32", "-o", str(plan)])
    assert made.exit_code == 0, made.output
    out = tmp_path / "run"
    result = cli_runner.invoke(cli, ["execute", str(plan), "--arg", "seq_len=16", "-o", str(out)])
    assert result.exit_code == 2 and not out.exists()
    assert "the plan says seq_len=32 but gpt.py's batches have 16; plan again with --seq-len 16" in result.output


def test_a_plan_file_pointed_at_a_model_without_sequences_is_refused(cli_runner, tmp_path):
    """A plan of gpt.py:tiny edited to name mlp.py: its seq_len and predicted figures are gpt's;
    execute ran it, compared with gpt's figures, and simulate blamed a --seq-len never given."""
    import json
    from pathlib import Path

    plan = tmp_path / "p.json"
    made = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "tp=1,pp=1", "-o", str(plan)])
    assert made.exit_code == 0, made.output
    data = json.loads(plan.read_text())
    data.update(model=str(Path("examples/mlp.py").resolve()), model_args={})
    plan.write_text(json.dumps(data))
    out = tmp_path / "run"
    ran = cli_runner.invoke(cli, ["execute", str(plan), "--steps", "1", "-o", str(out)])
    line = _error_line(ran)
    assert ran.exit_code == 2 and not out.exists(), ran.output
    assert "seq_len=16 but mlp.py takes no seq_len argument" in line and "made for another model" in line
    simulated = cli_runner.invoke(cli, ["simulate", str(plan)])
    line = _error_line(simulated)
    assert simulated.exit_code == 2 and "a plan file's seq_len" in line and "--seq-len 16 given" not in line


def test_a_version_2_plan_file_without_a_layout_key_is_one_line(cli_runner, tmp_path):
    """`plan -o` writes every layout key; one deleted by hand (cp of a cp plan) ran another plan."""
    import json

    plan = tmp_path / "plan.json"
    made = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "tp=1,pp=1", "-o", str(plan)])
    assert made.exit_code == 0, made.output
    data = json.loads(plan.read_text())
    del data["cp"]
    plan.write_text(json.dumps(data))
    before = plan.read_text()
    for command in (["simulate", str(plan)], ["reliability", str(plan), "--days", "1"]):
        result = cli_runner.invoke(cli, command)
        line = _error_line(result)
        assert result.exit_code == 2 and "cp: missing; a version-2 plan file gives every layout key" in line, line
    assert plan.read_text() == before  # the user's file is left as it was


def test_a_misspelt_hf_config_field_is_named_with_the_nearest(cli_runner, tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             vocab_size=128, intermediate_size=128,
                             max_position_embeddings=32).save_pretrained(tmp_path / "llama")
    result = cli_runner.invoke(cli, ["profile", f"hf:{tmp_path / 'llama'}", "--arg", "num_hiden_layers=1"])
    line = _error_line(result)
    assert result.exit_code == 2
    assert "config.json has no field 'num_hiden_layers' (did you mean 'num_hidden_layers'?)" in line, line


def test_executing_tp_on_an_hf_config_without_a_tp_plan_names_base_model_tp_plan(cli_runner, tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=32).save_pretrained(
        tmp_path / "gpt2")
    out = tmp_path / "run"
    result = cli_runner.invoke(cli, ["execute", "tp=2,mbs=1,gbs=2", "--model", f"hf:{tmp_path / 'gpt2'}",
                                     "--launcher", "slurm", "-o", str(out)])
    line = _error_line(result)
    assert result.exit_code == 2 and "tp=2 needs tensor parallelism but hf:gpt2's config" in line, line
    assert "base_model_tp_plan" in line and not out.exists()


def test_an_arg_without_a_value_names_its_own_key(cli_runner):
    """`--arg num_hidden_layers` (no value) was told "e.g. --arg layers=24", a key hf: configs lack."""
    result = cli_runner.invoke(cli, ["profile", TINY, "--arg", "hidden"])
    line = _error_line(result)
    assert result.exit_code == 2 and "--arg 'hidden' needs the form key=value, e.g. --arg hidden=VALUE" in line, line


ABS_TINY = str(Path(__file__).resolve().parents[2] / "examples" / "gpt.py") + ":tiny"


@pytest.mark.parametrize("verb", [["simulate", ABS_TINY, "--hw", "a100x8", "--plan"],
                                  ["execute", "--model", ABS_TINY, "-o", "x"]])
def test_a_plan_with_spaces_between_keys_says_commas(cli_runner, verb, tmp_path, monkeypatch):
    """"dp=2 mbs=2 gbs=8" was told "dp must be a whole number, got '2 mbs=2 gbs=8'" (a review)."""
    monkeypatch.chdir(tmp_path)
    args = [*verb, "dp=2 mbs=2 gbs=8"] if verb[0] == "simulate" else ["execute", "dp=2 mbs=2 gbs=8", *verb[1:]]
    result = cli_runner.invoke(cli, args)
    line = _error_line(result)
    assert result.exit_code == 2 and "plan keys are separated by commas, not spaces: 'dp=2,mbs=2,gbs=8'" in line, line
    assert not (tmp_path / "x").exists()
