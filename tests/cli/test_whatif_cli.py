"""`smplan whatif` end to end on the tiny GPT: report files, infeasible points, errors."""

from __future__ import annotations

import json

import pytest

from smplan import report
from smplan.cli.main import cli
from tests.report.chart_data import bars, heights, lines

TINY = "examples/gpt.py:tiny"


def run(cli_runner, *args):
    return cli_runner.invoke(cli, ["whatif", TINY, "--jobs", "1", "--seeds", "5", *args])


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from click.testing import CliRunner

    out = tmp_path_factory.mktemp("whatif") / "r"
    result = CliRunner().invoke(cli, ["whatif", TINY, "--jobs", "1", "--seeds", "5", "--vary", "nodes=1,2",
                                      "--vary", "hw=a100x8,h100x8", "--tokens", "1e9", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out, result


def test_sweep_writes_report_with_every_chart(sweep):
    out, result = sweep
    record = report.load(out / "points.json")
    assert len(record["points"]) == 4 and all(p["feasible"] for p in record["points"])
    assert set(record["charts"]) == set(report.CHART_NAMES) - {"versus"}  # no numeric varied setting
    for file in record["charts"].values():
        assert (out / file).is_file()
    assert (out / "index.html").is_file()
    assert "recommended: #" in result.output and f"report: {out / 'index.html'}" in result.output
    rec = record["points"][record["recommended"]]
    assert rec["plan_label"] and rec["run"]["days"] > 0 and 0 < rec["run"]["goodput"] <= 1


def test_points_share_one_global_batch_by_default(sweep):
    # Without --global-batch every point trains the same recipe: the default of the largest
    # point (one sequence per GPU there), so adding nodes is strong scaling.
    out, _ = sweep
    record = report.load(out / "points.json")
    batches = {p["plan"]["global_batch"] for p in record["points"]}
    assert batches == {max(p["num_gpus"] for p in record["points"])}
    assert record["question"]["global_batch"] == batches.pop()


def test_sweep_charts_plot_points_json(sweep):
    out, _ = sweep
    record = report.load(out / "points.json")
    rate = lines(report.draw_chart("scaling", record).axes[0])
    for p in record["points"]:
        x, y = rate[p["group"]]
        assert y[x.index(p["num_gpus"])] == pytest.approx(p["figures"]["tokens_per_s"])
    compute = bars(report.draw_chart("breakdown", record).axes[0])["compute"]
    assert heights(compute) == pytest.approx([p["figures"]["breakdown"]["compute"] for p in record["points"]])


def test_points_that_do_not_fit_are_marked_not_fatal(cli_runner, tmp_path):
    # 1 GiB GPUs cannot hold even the framework reserve: that point is infeasible, not a crash.
    result = run(cli_runner, "--vary", "gpu.memory_gib=1,80", "--tokens", "1e9", "-o", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    record = report.load(tmp_path / "r" / "points.json")
    small, big = record["points"]
    assert not small["feasible"] and small["reason"] and big["feasible"]
    assert "infeasible" in result.output
    assert small["reason"] in (tmp_path / "r" / "index.html").read_text().replace("&#x27;", "'")
    # the table shortens a long reason; the whole of it follows the table
    assert len(small["reason"]) > 90 and f"  #{small['id']} {small['label']}: {small['reason']}" in result.output


def test_a_bug_in_one_point_is_an_internal_error_not_an_infeasible_point(cli_runner, tmp_path, monkeypatch):
    # a plain ValueError (math's "math domain error", numpy's) is a bug, not the user's plan: the
    # point says so and asks for a report, and the other points stay
    import smplan.simulator

    real = smplan.simulator.simulate_plan

    def flaky(plan, profile, cluster, *args, **kwargs):
        if cluster.nodes == 2:
            raise ValueError("math domain error")
        return real(plan, profile, cluster, *args, **kwargs)

    monkeypatch.setattr(smplan.simulator, "simulate_plan", flaky)
    result = run(cli_runner, "--vary", "nodes=1,2", "-o", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    one, two = report.load(tmp_path / "r" / "points.json")["points"]
    assert one["feasible"] and not two["feasible"]
    assert two["reason"] == "internal error (ValueError: math domain error); please report it"


def test_fixed_plan_that_overflows_memory_says_why(cli_runner, tmp_path):
    result = run(cli_runner, "--plan", "tp=1,pp=1", "--vary", "gpu.memory_gib=1,80", "-o", str(tmp_path / "r"),
                 "--format", "svg")
    assert result.exit_code == 0, result.output
    record = report.load(tmp_path / "r" / "points.json")
    small = record["points"][0]
    assert not small["feasible"] and "GiB" in small["reason"]
    assert small["figures"]["memory_breakdown_gib"]  # still drawn, hatched, in the memory chart
    assert "memory" in record["charts"] and record["charts"]["memory"].endswith(".svg")


def test_days_mode_and_plan_dimension(cli_runner, tmp_path):
    result = run(cli_runner, "--vary", "tp=1,2", "--days", "0.5", "-o", str(tmp_path / "r"), "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert [p["plan"]["tp"] for p in record["points"]] == [1, 2]
    for p in record["points"]:
        assert p["run"]["days"] == pytest.approx(0.5) and p["run"]["tokens"] > 0


def test_refuses_non_empty_dir_without_force(cli_runner, tmp_path):
    (tmp_path / "mine.txt").write_text("keep")
    result = run(cli_runner, "--vary", "nodes=1,2", "-o", str(tmp_path))
    assert result.exit_code == 2
    lines_ = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines_) == 1 and "--force" in lines_[0]
    assert (tmp_path / "mine.txt").read_text() == "keep"


@pytest.mark.parametrize("bad", ["nope=1,2", "nodes=0,1", "nodes", "nodes=1,1"])
def test_bad_vary_is_one_line_exit_2(cli_runner, tmp_path, bad):
    result = run(cli_runner, "--vary", bad, "-o", str(tmp_path / "r"))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.output.startswith("error: ")


@pytest.mark.parametrize("key", ["reliability.gpu_mtbf_hours=100,1000", "storage.checkpoint_write_gbps=1,5"])
def test_a_sweep_of_what_only_a_run_reads_needs_a_run(cli_runner, tmp_path, key):
    # without --tokens or --days every point would be the same step: refused, as an interval is
    result = run(cli_runner, "--vary", key, "-o", str(tmp_path / "r"))
    assert result.exit_code == 2 and "changes only a whole run" in result.output and "--tokens or --days" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
    assert run(cli_runner, "--vary", key, "--days", "1", "-o", str(tmp_path / "ok")).exit_code == 0


@pytest.mark.parametrize("bad, rule", [
    (["--hw-set", "efficiency.gemm_tile=-1"], "gemm_tile must not be negative"),
    (["--hw-set", "inter_node.bandwidth_gbps=0"], "bandwidth_gbps must be greater than 0"),
    (["--hw-set", "gpu.foo=1"], "unknown hardware key 'gpu.foo'"),
    (["--plan", "tp=0"], "tp must be a whole number >= 1"),
    (["--plan", "mbs=-2"], "micro_batch must be a whole number >= 1"),
])
def test_bad_fixed_inputs_are_refused_not_swept_as_infeasible(cli_runner, tmp_path, bad, rule):
    # what no point could use is the user's typo: exit 2 and one line, as plan and simulate say it
    result = run(cli_runner, *bad, "-o", str(tmp_path / "r"))
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and rule in result.output and "Traceback" not in result.output
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("bad, rule", [(["--plan", "tp=0"], "tp must be a whole number >= 1"),
                                       (["--vary", "nodez=1,2"], "did you mean nodes?")])
def test_a_typo_is_named_before_a_used_report_folder(cli_runner, tmp_path, bad, rule):
    """A user fixing a typo should not first have to pass --force or pick another -o."""
    used = tmp_path / "r"
    used.mkdir()
    (used / "mine.txt").write_text("keep")
    result = run(cli_runner, *bad, "-o", str(used))
    assert result.exit_code == 2 and rule in result.output and "not empty" not in result.output, result.output
    assert [p.name for p in used.iterdir()] == ["mine.txt"]
    assert "is not empty" in run(cli_runner, "-o", str(used)).output


def test_a_hardware_file_with_a_typo_is_refused(cli_runner, tmp_path):
    from smplan.hwprofiles.loader import PROFILE_DIR

    hw = tmp_path / "typo.toml"
    hw.write_text((PROFILE_DIR / "a100x8.toml").read_text().replace("sm_count =", "sm_cout ="))
    result = run(cli_runner, "--hw", str(hw), "-o", str(tmp_path / "r"))
    assert result.exit_code == 2 and "unknown key 'gpu.sm_cout'" in result.output, result.output


def test_a_bad_fixed_input_is_not_blamed_on_a_sweep(cli_runner, tmp_path):
    result = run(cli_runner, "--hw-set", "gpu.memory_gib=-1", "--vary", "inter_node.bandwidth_gbps=50,100",
                 "-o", str(tmp_path / "r"))
    assert result.exit_code == 2 and "gpu.memory_gib" in result.output and "--vary" not in result.output, result.output


def test_tokens_and_days_together_rejected(cli_runner, tmp_path):
    result = run(cli_runner, "--tokens", "1e9", "--days", "1", "-o", str(tmp_path / "r"))
    assert result.exit_code == 2 and "not both" in result.output


def test_a_plan_file_is_refused_with_the_command_that_sweeps_its_model(cli_runner, tmp_path):
    plan = tmp_path / "p.json"
    made = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--arg", "layers=8", "--hw-set",
                                   "gpu.memory_gib=40", "-o", str(plan)])
    assert made.exit_code == 0, made.output
    result = cli_runner.invoke(cli, ["whatif", str(plan), "--vary", "nodes=1,2", "-o", str(tmp_path / "r")])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "is a plan file" in lines[0]
    assert "smplan whatif examples/gpt.py:tiny --hw a100x8" in lines[0] and "--plan tp=" in lines[0]
    assert "--arg layers=8" in lines[0] and "--hw-set gpu.memory_gib=40" in lines[0]  # the shape it was made for
    assert lines[0].endswith("(to --vary nodes, drop --nodes and dp= from --plan: dp then fills each point's GPUs)")
    assert not (tmp_path / "r").exists()


def test_varying_fp8_scaling_needs_fp8_somewhere(cli_runner, tmp_path):
    refused = cli_runner.invoke(cli, ["whatif", TINY, "--hw", "h100x8", "--vary", "fp8_scaling=tensor,block",
                                      "-o", str(tmp_path / "a")])
    assert refused.exit_code == 2 and "add --dtype fp8, dtype=fp8 to --plan, or --vary dtype=fp8" in refused.output
    assert not (tmp_path / "a").exists()
    from smplan.whatif import Question, parse_vary

    # with dtype varied over fp8 (and bf16 to compare), the question stands
    Question(model=TINY, hw="b200x8", varies=(parse_vary("fp8_scaling=tensor,block"), parse_vary("dtype=bf16,fp8")))
    Question(model=TINY, hw="b200x8", dtype="fp8", varies=(parse_vary("fp8_scaling=tensor,block"),))  # --dtype fp8


def test_a_fixed_stage_split_is_kept_and_not_swept_into_other_chunk_counts(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["whatif", TINY, "--hw", "a100x8", "--plan", "pp=2,dp=4,stages=3:0/1:0",
                                     "--vary", "mbs=1,2", "-o", str(tmp_path / "r"), "--json"])
    assert result.exit_code == 0, result.output
    points = json.loads(result.stdout)["points"]
    assert all(p["plan_inline"].endswith("stages=3:0/1:0") for p in points)
    for vary in ("schedule=1f1b,interleaved", "v=1,2"):
        refused = cli_runner.invoke(cli, ["whatif", TINY, "--hw", "a100x8", "--plan", "pp=2,dp=4,stages=3:0/1:0",
                                          "--vary", vary, "-o", str(tmp_path / "x")])
        assert refused.exit_code == 2 and "drop stages=" in refused.output, refused.output
    assert not (tmp_path / "x").exists()


def test_the_planner_refuses_to_fix_the_stage_split(cli_runner):
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--fix", "stages=2:0/2:0"])
    assert result.exit_code == 2 and result.output.startswith("error: --fix stages= is not a search constraint")
    assert len(result.output.strip().splitlines()) == 1


def test_a_points_label_says_how_many_blocks_recompute():
    """A plan recomputing some of its blocks is not labelled as recomputing all of them."""
    from smplan.planner.plan import Plan, Stage

    from smplan.whatif.point import plan_label

    stages = (Stage(0, 2, "full", 1), Stage(2, 4, "full", 0))
    some = Plan(model="m.py", hw="a100x8", nodes=1, pp=2, micro_batch=1, global_batch=4, stages=stages)
    assert plan_label(some).endswith("recompute=full 1/4")
    every = some.replace(stages=(Stage(0, 2, "full"), Stage(2, 4, "full")))
    assert plan_label(every).endswith("recompute=full")


def test_a_sweep_with_no_feasible_point_writes_its_report_and_exits_2(cli_runner, tmp_path):
    result = run(cli_runner, "--vary", "gpu.memory_gib=0.5,1", "-o", str(tmp_path / "r"))
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1].startswith("error: no feasible point: ")
    assert (tmp_path / "r" / "index.html").is_file() and (tmp_path / "r" / "points.json").is_file()


def test_a_points_checkpoint_time_is_what_reliability_says_for_its_plan(cli_runner, tmp_path):
    # One pricing of a checkpoint for both verbs: the plan's dtype's state bytes (fp32: 12 B a
    # parameter, not bf16's 14) over the plan's nodes, capped by the file system (3 GB/s here,
    # under 2 nodes x 5 GB/s); whatif's goodput must not rest on another one.
    out = tmp_path / "r"
    result = run(cli_runner, "--vary", "nodes=1,2", "--plan", "mbs=1,dtype=fp32", "--tokens", "1e9",
                 "--hw-set", "storage.filesystem_write_gbps=3", "-o", str(out))
    assert result.exit_code == 0, result.output
    points = report.load(out / "points.json")["points"]
    for point in points:
        plan_file = tmp_path / f"plan{point['id']}.json"
        plan_file.write_text(json.dumps(point["plan"]))
        result = cli_runner.invoke(cli, ["reliability", str(plan_file), "--tokens", "1e9", "--seeds", "5", "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["checkpoint_s"] == pytest.approx(point["run"]["checkpoint_save_s"])
        assert data["checkpoint_s"] == pytest.approx(data["checkpoint_bytes"] / min(5e9 * data["nodes"], 3e9))
    assert [p["plan"]["nodes"] for p in points] == [1, 2]


def test_dtype_trains_every_point_in_it(cli_runner, tmp_path):
    """whatif had no --dtype (plan has one): a sweep in fp8 took --vary dtype=fp8 (a review)."""
    result = run(cli_runner, "--hw", "h100x8", "--dtype", "fp8", "--vary", "nodes=1,2", "-o", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    record = report.load(tmp_path / "r" / "points.json")
    assert [p["plan"]["dtype"] for p in record["points"]] == ["fp8", "fp8"]
    assert record["question"]["dtype"] == "fp8" and ", in fp8, as nodes" in record["question"]["text"]


def test_each_point_trains_in_its_gpus_default_dtype_as_plan_picks(cli_runner, tmp_path):
    # a V100 has no bf16 peak: `plan` picks fp16 there, and so must every whatif point (it was
    # bf16 for all, so no V100 point was feasible); an A100 point in the same sweep stays bf16
    result = run(cli_runner, "--vary", "hw=v100x8,a100x8", "-o", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    points = report.load(tmp_path / "r" / "points.json")["points"]
    assert {p["hw"]: p["plan"]["dtype"] for p in points} == {"v100x8": "fp16", "a100x8": "bf16"}
    fixed = run(cli_runner, "--vary", "hw=v100x8,a100x8", "--plan", "dp=8,mbs=1,dtype=fp32", "-o", str(tmp_path / "f"))
    assert fixed.exit_code == 0, fixed.output
    assert {p["plan"]["dtype"] for p in report.load(tmp_path / "f" / "points.json")["points"]} == {"fp32"}


@pytest.mark.parametrize("goal", [["--tokens", "1e9"], ["--days", "2"]])
def test_a_point_that_never_finishes_is_marked_and_the_others_kept(cli_runner, tmp_path, goal):
    # 0.01 h per GPU cannot finish; 2 h can, but a tenth of it (the goodput chart's first MTBF)
    # cannot: that once stopped the whole sweep with `smplan reliability`'s options, no report
    out = tmp_path / "r"
    result = run(cli_runner, "--vary", "reliability.gpu_mtbf_hours=0.01,2", *goal, "-o", str(out))
    assert result.exit_code == 0, result.output
    record = report.load(out / "points.json")
    hopeless, fine = record["points"]
    assert not hopeless["feasible"] and fine["feasible"] and record["recommended"] == fine["id"]
    assert "does not finish" in hopeless["reason"] and "reliability.gpu_mtbf_hours" in hopeless["reason"]
    assert "--mtbf-hours" not in result.output and "--restart-minutes" not in result.output
    curve = record["details"]["goodput"]["vs_mtbf"]
    assert curve["gpu_mtbf_hours"][0] == pytest.approx(0.2) and curve["goodput"][0] is None
    assert all(0 < g <= 1 for g in curve["goodput"][1:])
    assert "goodput" in record["charts"] and (out / "index.html").is_file()


@pytest.mark.parametrize("given", ["missing.json", "plan.json"])
def test_a_plan_file_given_to_plan_says_plan_takes_inline_keys(cli_runner, tmp_path, given):
    plan = tmp_path / given
    if given == "plan.json":
        made = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "-o", str(plan)])
        assert made.exit_code == 0, made.output
    result = run(cli_runner, "--plan", str(plan), "-o", str(tmp_path / "r"))
    assert result.exit_code == 2
    lines_ = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines_) == 1 and lines_[0].startswith("error: --plan takes plan keys inline (e.g. --plan tp=8")
    assert "needs the form key=value" not in lines_[0]
    if given == "plan.json":  # the file's own keys, ready to paste
        assert f"for the plan in {plan} give --plan tp=" in lines_[0]
    else:
        assert "smplan whatif PLAN.json" in lines_[0]
    assert not (tmp_path / "r").exists()


def test_days_mode_table_shows_the_tokens_each_point_trains(cli_runner, tmp_path):
    result = run(cli_runner, "--vary", "tp=1,2", "--days", "0.5", "-o", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if line.startswith("#  point"))
    assert "tokens " in header.replace("tokens/s", "") and " days " not in header
    for p in report.load(tmp_path / "r" / "points.json")["points"]:
        assert f"{p['run']['tokens']:.3g}" in result.output
    assert "<th>tokens</th>" in (tmp_path / "r" / "index.html").read_text()


def test_profiling_a_model_is_announced_before_the_points(cli_runner, tmp_path, monkeypatch):
    # the profile cache is empty in each test (tests/conftest.py): the model is profiled, and
    # an hf: model takes tens of seconds there; `smplan plan` says so, and so must whatif
    monkeypatch.setattr("smplan.progress.PROGRESS_AFTER_S", 0.0)  # said after a second; tiny takes less
    result = run(cli_runner, "--vary", "tp=1,2", "-o", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    lines_ = result.output.splitlines()
    said = next(i for i, line in enumerate(lines_) if line.startswith(f"profiling {TINY} "))
    assert said < next(i for i, line in enumerate(lines_) if " points " in line)


def test_the_question_names_the_global_batch_every_point_shares(cli_runner, tmp_path):
    """Without --global-batch every point takes one sample per GPU of the largest point, so the
    batch depends on the sweep: the question (text and page) says which, and how to set it."""
    out = tmp_path / "wi"
    result = cli_runner.invoke(cli, ["whatif", "examples/gpt.py:tiny", "--hw", "a100x8", "--vary", "nodes=1,2",
                                     "--jobs", "1", "-o", str(out)])  # a step's sweep: no failure simulation
    assert result.exit_code == 0, result.output
    says = "global batch 16 (one per GPU of the largest point; --global-batch sets another)"
    assert says in result.output and says in (out / "index.html").read_text()
    given = cli_runner.invoke(cli, ["whatif", "examples/gpt.py:tiny", "--hw", "a100x8", "--vary", "nodes=1,2",
                                    "--jobs", "1", "--global-batch", "32", "-o", str(tmp_path / "g")])
    assert given.exit_code == 0, given.output
    assert "global batch 32, as nodes" in given.output and "largest point" not in given.output


def test_a_stack_sweep_of_an_moe_model_says_when_it_rests_on_an_unmeasured_moe_host_time(cli_runner, tmp_path):
    from smplan.cli.whatif import moe_host_time_note

    def record(moe: bool, stacks: list[str]) -> dict:
        return {"question": {"vary": {"stack": stacks}}, "points": [{"moe": moe}, {"moe": False}]}

    note = moe_host_time_note(record(True, ["megatron-core", "torchtitan"]))
    assert note == ("note: the stacks' host time per MoE layer differs (megatron-core 3400 us, torchtitan 0 us "
                    "(not measured); `smplan stack show NAME`): on this MoE model their comparison rests on it")
    assert moe_host_time_note(record(False, ["megatron-core", "torchtitan"])) is None  # dense: not a factor
    assert moe_host_time_note(record(True, ["megatron-core"])) is None
    # every routed-expert layer pays it at ep=1 too (a review's hf: MoE model, never offered ep, got no note)
    out = tmp_path / "wi"
    result = cli_runner.invoke(cli, ["whatif", "examples/moe.py:tiny", "--hw", "a100x8", "--plan", "dp=8,mbs=1,gbs=8",
                                     "--vary", "stack=megatron-core,torchtitan", "--jobs", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "on this MoE model their comparison rests on it" in result.output, result.output
    points = json.loads((out / "points.json").read_text())["points"]
    assert all(p["moe"] and p["plan"]["ep"] == 1 for p in points)


def test_a_network_sweep_says_the_price_stays_and_json_names_the_report(cli_runner, tmp_path):
    from smplan.cli.whatif import network_price_note

    out = tmp_path / "wi"
    args = ["whatif", "examples/gpt.py:tiny", "--hw", "a100x8", "--nodes", "2", "--vary",
            "inter_node.bandwidth_gbps=12.5,50", "--tokens", "1e9", "--jobs", "1", "-o", str(out)]
    text = cli_runner.invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "note: every point is billed the profile's price per GPU-hour as inter_node.bandwidth_gbps varies" in text.output
    # the sweep says it started before its first point is done
    assert "0/2 points" in text.output
    as_json = cli_runner.invoke(cli, [*args[:-1], str(tmp_path / "j"), "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)["report"] == str(tmp_path / "j" / "index.html")
    priced = {"question": {"vary": {"inter_node.bandwidth_gbps": [12.5, 50], "cost.usd_per_gpu_hour": [2, 3]}}}
    assert network_price_note(priced) is None
