"""`smplan plan` through CliRunner on the tiny GPT preset."""

import json

import pytest
from smplan.planner import TIE_SHARE

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

TINY = "examples/gpt.py:tiny"


def _lines(output):
    """Output lines less the progress line of a first profiling run (stderr)."""
    return [line for line in output.splitlines() if line.strip() and not line.startswith("profiling ")]


def test_plan_table(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--top", "3"])
    assert result.exit_code == 0, result.output
    for column in ("dp", "tp", "pp", "mbs", "zero", "recompute", "schedule", "step s", "tokens/s", "MFU", "mem GiB"):
        assert column in result.output


def test_a_model_without_token_sequences_counts_samples(cli_runner):
    """examples/mlp.py's samples are feature vectors: no tokens/s, no per-token FLOPs."""
    planned = cli_runner.invoke(cli, ["plan", "examples/mlp.py", "--hw", "a100x8", "--top", "1"])
    assert planned.exit_code == 0, planned.output
    assert "samples/s" in planned.output and "$/1M samples" in planned.output and "tokens/s" not in planned.output
    profiled = cli_runner.invoke(cli, ["profile", "examples/mlp.py"])
    assert "seq_len=none (a sample is not a token sequence)" in profiled.output
    assert "per token" not in profiled.output


def test_plan_json_names(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--global-batch", "16", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["plans"]
    best = data["plans"][0]
    for key in ("dp", "tp", "pp", "micro_batch", "global_batch", "schedule", "zero", "recompute", "stage_blocks",
                "step_time_s", "tokens_per_s", "mfu", "peak_memory_gib"):
        assert key in best
    times = [p["step_time_s"] for p in data["plans"]]
    # sorted, but for ties (a tie puts the plan recomputing less, with more memory free, first)
    assert all(a <= b * (1 + TIE_SHARE) for a, b in zip(times, times[1:], strict=False)) and best["global_batch"] == 16


def test_plan_output_and_no_overwrite(cli_runner, tmp_path):
    out = tmp_path / "plan.json"
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "-o", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads(out.read_text())
    assert saved["version"] == 2 and saved["predicted"]["step_time_s"] > 0
    again = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "-o", str(out)])
    assert again.exit_code == 2 and "--force" in again.output
    forced = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "-o", str(out), "--force"])
    assert forced.exit_code == 0, forced.output


def test_plan_fix_and_explain(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "tp=2", "--explain", "--json"])
    assert result.exit_code == 0, result.output
    assert all(p["tp"] == 2 for p in json.loads(result.stdout)["plans"])
    text = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--explain", "--top", "3"])
    # each runner-up says where its time went, or that it ties with the best
    said = [line for line in text.output.splitlines() if "step time (" in line or "ties with the best" in line]
    assert text.exit_code == 0 and len(said) == 2, text.output


def test_infeasible_requests_one_line_exit_2(cli_runner):
    cases = [
        ["--fix", "tp=16"],
        ["--fix", "tp=3"],
        ["--global-batch", "7", "--fix", "dp=2"],
        ["--fix", "pp=9"],
    ]
    for extra in cases:
        result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", *extra])
        assert result.exit_code == 2, (extra, result.output)
        lines = _lines(result.output)
        assert len(lines) == 1 and lines[0].startswith("error:"), (extra, result.output)
        assert "Traceback" not in result.output


def test_model_too_big_names_nearest_change(cli_runner):
    result = cli_runner.invoke(cli, ["plan", "examples/gpt.py:gpt3_175b", "--hw", "a100x8", "--nodes", "1",
                                     "--global-batch", "8"])
    assert result.exit_code == 2, result.output
    lines = _lines(result.output)
    assert len(lines) == 1 and "smallest change" in lines[0] and "--nodes" in lines[0]


def test_the_nodes_named_are_the_fewest_that_fit(cli_runner):
    """Not only doublings: 6 nodes fit here and 5 do not (before, the hint said --nodes 8)."""
    base = ["plan", "examples/gpt.py:llama3_8b", "--arg", "layers=12", "--hw", "a100x8", "--global-batch", "96",
            "--hw-set", "gpu.memory_gib=4", "--top", "1", "--closed-form"]
    said = cli_runner.invoke(cli, [*base, "--nodes", "1"])
    assert said.exit_code == 2 and said.output.rstrip().endswith("the smallest change that fits: --nodes 6"), said.output
    assert cli_runner.invoke(cli, [*base, "--nodes", "6"]).exit_code == 0
    assert cli_runner.invoke(cli, [*base, "--nodes", "5"]).exit_code == 2
    capped = cli_runner.invoke(cli, [*base, "--max-nodes", "2"])  # named as the user searched
    assert capped.output.rstrip().endswith("the smallest change that fits: --max-nodes 6"), capped.output


def test_the_nodes_named_keep_the_users_fixed_dp_or_say_they_drop_it(cli_runner):
    """--fix dp=8: the hint named 5 nodes, found with dp free; at dp=8 those did not fit (nor 6, 7)."""
    base = ["plan", "examples/gpt.py:gpt3_175b", "--hw", "a100x8", "--top", "1", "--closed-form"]
    said = cli_runner.invoke(cli, [*base, "--nodes", "1", "--fix", "dp=8"])
    assert said.exit_code == 2 and said.output.rstrip().endswith("the smallest change that fits: --nodes 8"), said.output
    assert cli_runner.invoke(cli, [*base, "--nodes", "8", "--fix", "dp=8"]).exit_code == 0
    assert cli_runner.invoke(cli, [*base, "--nodes", "7", "--fix", "dp=8"]).exit_code == 2
    # dp, tp and pp all fixed: no node count helps at dp=8, so the hint says it drops the fix
    pinned = cli_runner.invoke(cli, [*base, "--nodes", "1", "--fix", "dp=8,tp=1,pp=1"])
    assert pinned.output.rstrip().endswith("the smallest change that fits: --nodes 6 without --fix dp=8"), pinned.output
    assert cli_runner.invoke(cli, [*base, "--nodes", "6", "--fix", "tp=1,pp=1"]).exit_code == 0


# --- every plan the CLI writes loads back and simulates --------------------------------

def _simulates(cli_runner, path):
    from smplan.planner import Plan

    plan = Plan.load(path)
    result = cli_runner.invoke(cli, ["simulate", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plan"] == json.loads(json.dumps(plan.to_dict()))
    return plan


@pytest.mark.parametrize("extra", [
    [],
    ["--hw-set", "inter_node.bandwidth_gbps=50", "--hw-set", "efficiency.memory_reserve_gib=4.5"],
    ["--hw-set", "gpu.name=MyGPU", "--hw-set", "intra_node.latency_us=3"],
    ["--nodes", "1", "--max-nodes", "2", "--global-batch", "16"],
    ["--nodes", "2"],
    ["--fix", "pp=2", "--fix", "v=2", "--global-batch", "16"],
    ["--fix", "pp=2,schedule=gpipe", "--global-batch", "8"],
    ["--fix", "tp=2,sp=1,zero=3,recompute=full,overlap_dp=0", "--dtype", "fp16"],
    ["--arg", "layers=2", "--arg", "hidden=64", "--seq-len", "8"],
    ["--hw", "v100x8"],
])
def test_plan_output_round_trips(cli_runner, tmp_path, extra):
    out = tmp_path / "plan.json"
    args = ["plan", TINY, *([] if "--hw" in extra else ["--hw", "a100x8"]), *extra, "-o", str(out)]
    result = cli_runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    plan = _simulates(cli_runner, out)
    for item in extra:
        if item.startswith("inter_node.bandwidth_gbps"):
            assert plan.hw_overrides["inter_node.bandwidth_gbps"] == 50  # a number, not the text '50'
        if item.startswith("efficiency.memory_reserve_gib"):
            assert plan.hw_overrides["efficiency.memory_reserve_gib"] == 4.5
        if item == "v100x8":
            assert plan.dtype == "fp16"


def test_plan_output_with_a_profile_path_simulates_from_elsewhere(cli_runner, tmp_path, monkeypatch):
    from smplan.hwprofiles.loader import PROFILE_DIR

    hw = tmp_path / "mine.toml"
    hw.write_text((PROFILE_DIR / "a100x8.toml").read_text())
    out = tmp_path / "plan.json"
    model = str(EXAMPLES / "gpt.py") + ":tiny"
    assert cli_runner.invoke(cli, ["plan", model, "--hw", str(hw), "-o", str(out)]).exit_code == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert _simulates(cli_runner, out).hw == str(hw.resolve())


def test_plan_json_and_whatif_points_hold_the_plan_file_a_profile_path_makes(cli_runner, tmp_path):
    # a profile file edited from a bundled one keeps its `name`: a plan that recorded the name
    # simulated on the bundled profile, not on the file (a review's slower network was lost)
    from smplan.hwprofiles.loader import PROFILE_DIR

    hw = tmp_path / "mine.toml"
    hw.write_text((PROFILE_DIR / "a100x8.toml").read_text().replace("bandwidth_gbps = 25.0", "bandwidth_gbps = 2.5"))
    assert "bandwidth_gbps = 2.5" in hw.read_text()
    out = tmp_path / "plan.json"
    args = ["plan", TINY, "--hw", str(hw), "--nodes", "2", "--hw-set", "intra_node.latency_us=3"]
    result = cli_runner.invoke(cli, [*args, "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)["plans"][0]["plan"]
    written = json.loads(out.read_text())  # the object -o writes, its model named from the file's folder
    assert {k: v for k, v in listed.items() if k != "model"} == {k: v for k, v in written.items() if k != "model"}
    assert listed["hw"] == str(hw.resolve()) and listed["hw_overrides"] == {"intra_node.latency_us": 3}
    report = tmp_path / "wf"
    result = cli_runner.invoke(cli, ["whatif", TINY, "--hw", str(hw), "--jobs", "1", "--seeds", "2",
                                     "--vary", "nodes=1,2", "--tokens", "1e8", "-o", str(report)])
    assert result.exit_code == 0, result.output
    for point in json.loads((report / "points.json").read_text())["points"]:
        assert point["plan"]["hw"] == str(hw.resolve())


def test_whatif_point_plans_round_trip(cli_runner, tmp_path):
    out = tmp_path / "wf"
    result = cli_runner.invoke(cli, ["whatif", TINY, "--jobs", "1", "--seeds", "2", "--vary", "nodes=1,2",
                                     "--vary", "inter_node.bandwidth_gbps=25,50", "--hw-set", "intra_node.latency_us=3",
                                     "--tokens", "1e8", "-o", str(out)])
    assert result.exit_code == 0, result.output
    points = json.loads((out / "points.json").read_text())["points"]
    assert len(points) == 4
    for i, point in enumerate(points):
        path = tmp_path / f"point{i}.json"
        path.write_text(json.dumps(point["plan"]))
        plan = _simulates(cli_runner, path)
        assert all(not isinstance(v, str) for v in plan.hw_overrides.values()), plan.hw_overrides


def test_calibration_and_run_config_plans_round_trip(cli_runner, tmp_path):
    from smplan.executor.config import RunConfig
    from smplan.planner import profile_model

    from smplan.calibrate import plans as calibration

    profile = profile_model(TINY)
    for i, choice in enumerate(calibration.choose(4, profile, 3, global_batch=8)):
        plan = calibration.to_plan(choice, profile, model=TINY, model_args={}, hw="a100x8", global_batch=8,
                                   gpus_per_node=4, dtype="fp32")
        path = tmp_path / f"cal{i}.json"
        plan.save(path)
        assert _simulates(cli_runner, path) == plan
        config = RunConfig(plan=plan.to_dict(), model_ref=TINY, out_dir=str(tmp_path))
        config.save(tmp_path / "run_config.json")
        assert RunConfig.load(tmp_path / "run_config.json").plan_obj() == plan


# --- plan's own options -----------------------------------------------------------------

def test_nodes_with_max_nodes_is_the_minimum(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--nodes", "2", "--max-nodes", "4",
                                     "--top", "20", "--json"])
    assert result.exit_code == 0, result.output
    plans = [p["plan"] for p in json.loads(result.stdout)["plans"]]
    assert plans and all(2 <= p["nodes"] <= 4 for p in plans)
    table = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--nodes", "2", "--max-nodes", "4"])
    assert "nodes" in table.output.splitlines()[1] and "2..4 nodes" in table.output
    bad = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--nodes", "8", "--max-nodes", "4"])
    assert bad.exit_code == 2 and _lines(bad.output) == [
        "error: --nodes 8 is more than --max-nodes 4; --nodes is the fewest nodes to search, "
        "so give --nodes <= 4 or a larger --max-nodes"]


def test_v100_plans_in_fp16_by_default(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "v100x8", "--json"])
    assert result.exit_code == 0, result.output
    assert {p["plan"]["dtype"] for p in json.loads(result.stdout)["plans"]} == {"fp16"}
    bf16 = cli_runner.invoke(cli, ["plan", TINY, "--hw", "v100x8", "--dtype", "bf16"])
    assert bf16.exit_code == 2 and "no bf16 peak" in bf16.output


def test_empty_profile_cache_says_it_is_profiling(cli_runner, monkeypatch):
    monkeypatch.setattr("smplan.progress.PROGRESS_AFTER_S", 0.0)  # said after a second; tiny takes less
    first = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--json"])
    assert first.exit_code == 0
    assert f"profiling {TINY} on the meta device" in first.stderr
    json.loads(first.stdout)
    again = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--json"])
    assert "profiling" not in again.stderr  # cached


@pytest.mark.parametrize(("extra", "needle"), [
    (["--fix", "tp=2", "--fix", "tp=4"], "plan key tp is given twice"),
    (["--fix", "tp=2,tp=4"], "plan key tp is given twice"),
    (["--fix", "mbs=2", "--fix", "micro_batch=2"], "plan key mbs (as micro_batch) is given twice"),
    (["--arg", "layers=2", "--arg", "layers=3"], "--arg layers is given twice"),
    (["--fix", "v=2", "--fix", "schedule=1f1b"], "v=2 needs schedule=interleaved"),
    (["--fix", "v=4", "--fix", "pp=2"], "pp*v=8 model chunks exceed the model's 4 blocks"),
    (["--fix", "mbs=3"], "gbs=8 is not a multiple of mbs*dp for any dp"),
    (["--fix", "pp=4", "--global-batch", "2"], "2 micro-batches cannot fill 4 pipeline stages"),
    (["--fix", "tpp=2"], "did you mean tp?"),
    (["--fix", "dtype=fp8", "--dtype", "bf16"], "--dtype bf16 contradicts --fix dtype=fp8; give one"),
])
def test_bad_fixed_keys_one_line(cli_runner, extra, needle):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", *extra])
    assert result.exit_code == 2, result.output
    lines = _lines(result.output)
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], result.output
    assert "GiB" not in lines[0]


def test_fix_v_is_applied(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "v=2", "--global-batch", "16", "--json"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)["plans"]
    assert plans and all(p["schedule"] == "interleaved" and p["virtual_stages"] == 2 for p in plans)


def test_the_plan_predicts_what_simulate_reports_and_ranks_by_it(cli_runner, tmp_path):
    """The search's best plans are simulated and ranked by their simulated step, so the plan
    file's prediction is what `simulate PLAN.json` prints; --closed-form keeps the search's own."""
    import pytest as _pytest

    args = ["plan", "examples/moe.py:mixtral_8x7b", "--hw", "h100x8", "--nodes", "8", "--dtype", "fp8", "--top", "4"]
    path = tmp_path / "p.json"
    ranked = json.loads(cli_runner.invoke(cli, [*args, "--json", "-o", str(path)]).stdout)  # one search, both outputs
    assert ranked["search"]["ranked_by"] == "simulation"
    times = [p["step_time_s"] for p in ranked["plans"]]
    assert times == sorted(times)
    simulated = json.loads(cli_runner.invoke(cli, ["simulate", str(path), "--json"]).stdout)
    assert simulated["step_time_s"] == _pytest.approx(times[0], rel=1e-9)
    closed = json.loads(cli_runner.invoke(cli, [*args, "--json", "--closed-form"]).stdout)
    assert closed["search"]["ranked_by"] == "closed form"
    # this search's closed-form favourite (uneven interleaved chunks) is not what the simulation ranks first
    assert closed["plans"][0]["step_time_s"] != _pytest.approx(times[0], rel=1e-3)


def test_a_plan_too_long_to_simulate_keeps_its_closed_form(cli_runner):
    from smplan.simulator.rank import RANK_MAX_PASSES

    gbs = 8 * (RANK_MAX_PASSES + 1)  # dp=8, mbs=1: one more micro-batch than ranking simulates
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--global-batch", str(gbs), "--fix", "mbs=1,dp=8",
                                     "--json"])
    assert result.exit_code == 0, result.output
    assert "keep the search's closed-form ranking" in result.stderr
    data = json.loads(result.stdout)
    assert data["search"]["ranked_by"] == "closed form"  # never simulated and closed-form figures mixed
    best = data["plans"][0]
    assert best["global_batch"] // (best["dp"] * best["micro_batch"]) == RANK_MAX_PASSES + 1


@pytest.mark.parametrize("name", ["myplan.txt", "myplan"])
def test_a_plan_file_is_named_json_so_simulate_reads_it_back(cli_runner, tmp_path, name):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "-o", str(tmp_path / name)])
    assert result.exit_code == 2 and "myplan.json" in result.output, result.output
    assert not (tmp_path / name).exists()
    upper = tmp_path / "PLAN.JSON"  # the suffix in any case
    assert cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "-o", str(upper)]).exit_code == 0
    replayed = cli_runner.invoke(cli, ["simulate", str(upper)])
    assert replayed.exit_code == 0, replayed.output


def test_fixed_zero3_is_searched_without_pipeline_stages(cli_runner):
    # with pp > 1 ZeRO-2/3 run as ZeRO-1 (feasibility.effective_zero): no plan may carry the label
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "zero=3", "--top", "10", "--json"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)["plans"]
    assert plans and all(p["pp"] == 1 and p["zero"] == 3 for p in plans)
    both = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "zero=3,pp=2"])
    assert both.exit_code == 2 and "runs as ZeRO-1" in both.output and "pp=1" in both.output, both.output
    # without a fixed pp, a shape no pp can make is still the reason given
    shape = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "zero=3,dp=3", "--global-batch", "12"])
    assert shape.exit_code == 2 and "no mesh of 8 GPUs has dp=3" in shape.output, shape.output
    # simulate prices it as ZeRO-1 and says so, as the launch does (a review: it said nothing)
    inline = ["simulate", TINY, "--hw", "a100x8", "--plan", "pp=2,dp=4,zero=3,mbs=1,gbs=8"]
    notes = json.loads(cli_runner.invoke(cli, [*inline, "--json"]).stdout)["notes"]
    assert any(n.startswith("note: zero=3 runs as ZeRO-1 with pipeline stages (pp=2") for n in notes), notes
    assert "runs as ZeRO-1 with pipeline stages" in cli_runner.invoke(cli, inline).output
    flat = ["simulate", TINY, "--hw", "a100x8", "--plan", "dp=8,zero=3,mbs=1,gbs=8", "--json"]
    assert not any("ZeRO-1" in n for n in json.loads(cli_runner.invoke(cli, flat).stdout)["notes"])


def test_fixed_zero1_under_an_fsdp_stack_is_searched_with_pipeline_stages(cli_runner):
    # FSDP has no ZeRO-1: without pp it runs as ZeRO-2 (smplan execute's FSDP2 too; a review's finding)
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--stack", "torchtitan", "--fix", "zero=1",
                                     "--top", "10", "--json"])
    assert result.exit_code == 0, result.output
    assert all(p["pp"] > 1 for p in json.loads(result.stdout)["plans"] if p["zero"] == 1)
    flat = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--stack", "torchtitan", "--fix", "zero=1,pp=1"])
    assert flat.exit_code == 2 and "would run as ZeRO-2; fix zero=2" in flat.output, flat.output
    assert cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "zero=1,pp=1"]).exit_code == 0  # Megatron's
    alone = ["plan", TINY, "--hw", "gb200nvl72", "--nodes", "1", "--stack", "torchtitan", "--fix", "zero=1,pp=1,tp=4"]
    assert cli_runner.invoke(cli, alone).exit_code == 0  # 4 GPUs, all tp: nothing to shard
    # simulate prices such a plan as written, and says what plan said (it said nothing: a review)
    inline = ["simulate", TINY, "--hw", "a100x8", "--plan", "dp=8,zero=1,mbs=1,gbs=8", "--json"]
    notes = json.loads(cli_runner.invoke(cli, [*inline, "--stack", "torchtitan"]).stdout)["notes"]
    assert any("would run as ZeRO-2; this simulates ZeRO-1 as written" in note for note in notes), notes
    assert not any("ZeRO-2" in note for note in json.loads(cli_runner.invoke(cli, inline).stdout)["notes"])


def test_a_degree_no_mesh_has_is_named_before_the_batch(cli_runner):
    # "--global-batch 6 or 9" for dp=3 on 8 GPUs led to a second error, "no mesh has dp=3" (a review's finding)
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "dp=3"])
    assert result.exit_code == 2 and "no mesh of 8 GPUs has dp=3" in result.output, result.output
    assert "global batch" not in result.output


def test_json_keeps_the_explanation(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--top", "3", "--json", "--explain"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["explain"]) == len(data["plans"]) - 1 and all(isinstance(x, str) for x in data["explain"])
    assert isinstance(data["not_offered"], dict)
    plain = json.loads(cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--top", "3", "--json"]).stdout)
    assert "explain" not in plain


def test_title_names_the_gpus_per_node_a_hw_set_gives(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--nodes", "4", "--hw-set", "gpus_per_node=2"])
    assert result.exit_code == 0, result.output
    assert "on 8 GPUs (4x a100x8 with 2 GPUs each)" in result.stdout.splitlines()[0]
    plain = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--nodes", "2"])
    assert "on 16 GPUs (2x a100x8)," in plain.stdout.splitlines()[0]


def test_a_probed_cpu_is_planned_in_fp32_as_execute_runs_there(cli_runner, probed, tmp_path):
    out = tmp_path / "plan.json"
    result = cli_runner.invoke(cli, ["plan", "examples/gpt.py:tiny", "--hw", str(probed), "--global-batch", "4",
                                     "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["dtype"] == "fp32"
    simulated = cli_runner.invoke(cli, ["simulate", "examples/gpt.py:tiny", "--hw", str(probed), "--plan",
                                        "dp=2,mbs=1,gbs=4", "--json"])
    assert json.loads(simulated.output)["plan"]["dtype"] == "fp32"


def test_the_host_time_note_on_a_probed_cpu_speaks_of_calibrate_not_cuda_graphs(cli_runner, probed):
    """examples/gpt.py:tiny on a CPU profile is host-bound: the note names where its host time
    comes from (a GPU stack's) and what fits it, with no GPU advice."""
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", str(probed), "--top", "1"])
    assert result.exit_code == 0, result.output
    note = next(line for line in result.output.splitlines() if line.startswith("note:"))
    assert "of the step is the host's time per layer pass" in note and "`smplan calibrate` fits it" in note
    assert "CUDA" not in note and "GPU waits" not in note
    gpu = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--top", "1"])
    assert "CUDA graphs" in gpu.output


def test_a_capacity_factor_below_one_is_refused(cli_runner):
    # it priced the busiest expert below the average one: a 6.84 s plan at 80% MFU for Mixtral
    result = cli_runner.invoke(cli, ["plan", "examples/moe.py:tiny", "--hw", "h100x8", "--fix", "cf=0.5"])
    lines = _lines(result.output)
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "capacity_factor must be a number in [1, 16], got 0.5; 1.0 is balanced routing" in lines[0]


def test_explain_says_cp_is_left_out_below_long_sequences_and_how_to_price_it(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--explain"])
    assert result.exit_code == 0, result.output
    assert "  cp not searched: searched from 8192-token sequences on, where long-context recipes start it; " \
           "--fix cp=2 prices it at" in result.output
    fixed = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--explain", "--fix", "cp=2"])
    assert fixed.exit_code == 0, fixed.output
    assert "cp not searched" not in fixed.output and " cp=2 " in fixed.output.replace("  ", " ")


def test_an_mfu_above_the_gemm_ceiling_says_what_the_gpus_execute(cli_runner):
    # 64k tokens: causal attention's masked half is most of the model FLOPs the MFU counts
    args = ["--arg", "layers=2", "--arg", "hidden=1024", "--arg", "heads=8", "--arg", "seq_len=65536",
            "--arg", "vocab=1024", "--arg", "attention=sdpa"]
    result = cli_runner.invoke(cli, ["plan", f"{EXAMPLES}/gpt.py:model", *args, "--hw", "h100x8", "--global-batch", "8"])
    assert result.exit_code == 0, result.output
    note = [line for line in result.output.splitlines() if line.startswith("note: MFU")]
    assert note and "counts causal attention's masked half as work" in note[0], result.output
    executed = float(note[0].split("execute ")[1].split(" TFLOP/s")[0])
    assert executed < 0.65 * 989  # under the H100's bf16 GEMM ceiling (hwprofiles.perf.matmul_efficiency)
    # a short sequence's MFU is under the ceiling: no note
    short = cli_runner.invoke(cli, ["plan", f"{EXAMPLES}/gpt.py:tiny", "--hw", "h100x8"])
    assert "note: MFU" not in short.output



def test_simulate_and_whatif_say_it_of_an_mfu_above_the_gemm_ceiling(cli_runner, tmp_path):
    # only `plan` said it (a review's finding)
    args = ["--arg", "layers=2", "--arg", "hidden=1024", "--arg", "heads=8", "--arg", "seq_len=65536",
            "--arg", "vocab=1024", "--arg", "attention=sdpa", "--hw", "h100x8"]
    model = f"{EXAMPLES}/gpt.py:model"
    simulated = cli_runner.invoke(cli, ["simulate", model, *args, "--plan", "dp=8,mbs=1,gbs=8", "--json"])
    assert any(n.startswith("note: MFU") for n in json.loads(simulated.stdout)["notes"]), simulated.output
    swept = cli_runner.invoke(cli, ["whatif", model, *args, "--plan", "dp=8,mbs=1,gbs=8", "--vary", "nodes=1",
                                    "--seeds", "2", "--jobs", "1", "-o", str(tmp_path / "w"), "--json"])
    assert swept.exit_code == 0, swept.output
    assert any(n.startswith("note (#0): MFU counts causal attention's masked half") for n in
               json.loads(swept.stdout)["notes"]), swept.output

def test_a_global_batch_with_few_divisors_names_a_nearby_one():
    from smplan.cli.notes import batch_divisors_note

    note = batch_divisors_note(97, 64)  # prime: dp=1 (97 does not divide the GPUs)
    assert note == ("note: global batch 97 allows dp of at most 1 on 64 GPUs (dp divides the batch and the GPUs); "
                    "--global-batch 96 allows dp=32")  # dp divides the 64 GPUs too
    assert batch_divisors_note(63, 64).endswith("--global-batch 64 allows dp=64")  # 63 = 7 x 9: dp=1 on 64
    assert batch_divisors_note(1023, 1024).endswith("--global-batch 1024 allows dp=1024")
    assert batch_divisors_note(96, 64) is None and batch_divisors_note(128, 64) is None
    assert batch_divisors_note(7, 8).endswith("--global-batch 8 allows dp=8")


def test_plan_prints_the_batch_note(cli_runner):
    model = ["examples/gpt.py:model", "--arg", "layers=8", "--arg", "hidden=512", "--arg", "heads=8"]
    result = cli_runner.invoke(cli, ["plan", *model, "--hw", "a100x8", "--nodes", "2", "--global-batch", "17"])
    assert result.exit_code == 0, result.output
    assert ("note: global batch 17 allows dp of at most 1 on 16 GPUs (dp divides the batch and the GPUs); --global-batch 16 "
            "allows dp=16") in result.output, result.output


def test_sac_under_a_stack_without_op_level_checkpointing_says_what_is_nearest(cli_runner):
    args = ["plan", TINY, "--hw", "a100x8", "--fix", "recompute=sac"]
    default = cli_runner.invoke(cli, args)
    assert default.exit_code == 0, default.output
    assert "note: sac is torchtitan's op-level selective checkpointing" in default.output
    assert "megatron-core has no such policy: its nearest is --recompute-granularity selective" in default.output
    titan = cli_runner.invoke(cli, [*args, "--stack", "torchtitan"])
    assert titan.exit_code == 0 and "note: sac is" not in titan.output, titan.output


@pytest.mark.parametrize("hw, nodes, says", [
    ("h100x8", "2", "tp=16 must divide the 8 GPUs of a node (tensor parallelism stays on the node's NVLink); use tp=8"),
    ("l40sx8", "2", "tp=16 must divide the 8 GPUs of a node (tensor parallelism stays on the node's PCIe); use tp=8"),
    # the 72-GPU NVLink domain holds tp=16; 8 is the recipes' cap, not the node's size
    ("gb200nvl72", "18", "tp=16 must divide 8: in gb200nvl72's 72-GPU NVLink domain tp is a power of two up to 8"),
])
def test_a_tp_past_the_domain_says_whether_the_node_or_the_recipes_cap_it(cli_runner, hw, nodes, says):
    result = cli_runner.invoke(cli, ["plan", "examples/gpt.py:tiny", "--hw", hw, "--nodes", nodes, "--fix", "tp=16"])
    assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output


def test_an_arg_typo_is_the_only_line(cli_runner):
    """It came after a "profiling ... on the meta device" progress line."""
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--arg", "layer=2"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        result.output.strip()] and "takes no argument 'layer' (did you mean 'layers'?)" in result.output


def test_explain_prices_the_layout_keys_of_fix_against_the_best_without_them(cli_runner):
    # a fixed cp=8 at 1,024 tokens was 26% slower than the search's own pick, and --explain never said so
    # (a review's finding); keys that set what is trained (dtype) stay fixed
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "pp=2,dtype=bf16", "--explain"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if "without --fix" in x)
    assert line.strip().startswith("without --fix pp=2: -") and "% step time (tp=" in line and " pp=1 " in line, line
    as_json = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "pp=2", "--explain", "--json"])
    assert any(x.startswith("without --fix pp=2: ") for x in json.loads(as_json.stdout)["explain"])
    numerics = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "dtype=bf16", "--explain"])
    assert numerics.exit_code == 0 and "without --fix" not in numerics.output
