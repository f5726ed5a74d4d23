"""`--stack NAME|PATH` through the CLI: listing, one-line errors, predictions, the plan file's
stack, the stack's overlap_dp default and `calibrate --stack-output`."""

import json

import pytest
from smplan.hwprofiles import DEFAULT_STACK, bundled_stacks, load_stack
from smplan.planner import Plan, PlanError

from smplan.cli.main import cli
from tests.cli.conftest import fake_runs
from tests.conftest import EXAMPLES

GPT = f"{EXAMPLES / 'gpt.py'}:tiny"
INLINE = "tp=2,pp=2,dp=2,mbs=1,gbs=16"


def _stack_file(tmp_path, name="slow", host=50000.0, overlap=True):
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nhost_overhead_us_per_layer = {host}\nelementwise_fusion = 1.0\n'
                    f"overlap_grad_reduce = {'true' if overlap else 'false'}\n")
    return path


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def _simulate(cli_runner, *args) -> dict:
    result = cli_runner.invoke(cli, ["simulate", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_stack_list_and_show(cli_runner):
    result = cli_runner.invoke(cli, ["stack", "list"])
    assert result.exit_code == 0, result.output
    for name in bundled_stacks():
        assert name in result.output
    assert f"{DEFAULT_STACK} (default)" in result.output
    data = json.loads(cli_runner.invoke(cli, ["stack", "list", "--json"]).stdout)
    assert data["default"] == DEFAULT_STACK and [s["name"] for s in data["stacks"]] == bundled_stacks()
    shown = cli_runner.invoke(cli, ["stack", "show", "torchtitan"])
    assert shown.exit_code == 0 and "overlap_grad_reduce = True" in shown.output and "torchtitan.toml" in shown.output
    assert "megatron-core" in cli_runner.invoke(cli, ["plan", "--help"]).output  # --help names the bundled stacks


@pytest.mark.parametrize("command", [
    ["plan", GPT, "--hw", "a100x8"],
    ["simulate", GPT, "--hw", "a100x8", "--plan", INLINE],
    ["reliability", GPT, "--hw", "a100x8", "--plan", INLINE, "--days", "1"],
    ["whatif", GPT, "--hw", "a100x8", "--plan", INLINE, "--jobs", "1"],
    ["hw", "show", "a100x8"],
    ["stack", "show"],
])
def test_unknown_stack_is_one_line_exit_2(cli_runner, command, tmp_path):
    args = command + (["nope"] if command[-1] == "show" and command[0] == "stack" else ["--stack", "nope"])
    if command[0] == "whatif":
        args += ["-o", str(tmp_path / "r")]
    line = _one_error_line(cli_runner.invoke(cli, args))
    assert "unknown stack 'nope'" in line and "torchtitan" in line


def test_bad_stack_files_are_one_line_exit_2(cli_runner, tmp_path):
    line = _one_error_line(cli_runner.invoke(cli, ["simulate", GPT, "--hw", "a100x8", "--plan", INLINE,
                                                   "--stack", str(tmp_path / "absent.toml")]))
    assert "does not exist" in line
    bad = tmp_path / "bad.toml"
    bad.write_text("host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\nspeed = 2\n")
    line = _one_error_line(cli_runner.invoke(cli, ["plan", GPT, "--hw", "a100x8", "--stack", str(bad)]))
    assert "unknown key 'speed'" in line and "valid keys: name, description" in line


@pytest.mark.parametrize("setting, expected", [
    ("efficiency.tp_comm_overlap=2", "efficiency.tp_comm_overlap must be in [0, 1]"),
    ("efficiency.ep_a2a_overlap=-1", "efficiency.ep_a2a_overlap must be in [0, 1]"),
    ("efficiency.zero_collectives=tree", "efficiency.zero_collectives must be one of per_nic, ring"),
    ("efficiency.grad_reduce_dtype=fp16", "efficiency.grad_reduce_dtype must be one of weights, fp32"),
    ("efficiency.pp_send=half", "efficiency.pp_send must be one of full, tp_slice"),
    ("efficiency.sp_saved_input=all", "efficiency.sp_saved_input must be one of shard, gathered"),
    ("efficiency.cross_entropy=fused", "efficiency.cross_entropy must be one of in_place, traced"),
    ("gpu.matmul_ceiling.bf16=1.5", "gpu.matmul_ceiling.bf16 must be in (0, 1]"),
])
def test_new_stack_and_hardware_keys_out_of_range_are_one_line_exit_2(cli_runner, setting, expected):
    line = _one_error_line(cli_runner.invoke(cli, ["simulate", GPT, "--hw", "h100x8", "--plan", INLINE,
                                                   "--hw-set", setting]))
    assert expected in line


def test_stack_changes_the_prediction_and_hw_set_still_wins(cli_runner, tmp_path):
    slow = str(_stack_file(tmp_path))
    base = _simulate(cli_runner, GPT, "--hw", "a100x8", "--plan", INLINE)
    named = _simulate(cli_runner, GPT, "--hw", "a100x8", "--plan", INLINE, "--stack", DEFAULT_STACK)
    slowed = _simulate(cli_runner, GPT, "--hw", "a100x8", "--plan", INLINE, "--stack", slow)
    assert named["step_time_s"] == base["step_time_s"]
    assert slowed["step_time_s"] > 2 * base["step_time_s"]  # 50 ms per layer pass on a tiny model
    assert base["plan"]["stack"] == DEFAULT_STACK and slowed["plan"]["stack"] == slow
    host = load_stack().host_overhead_us_per_layer
    undone = _simulate(cli_runner, GPT, "--hw", "a100x8", "--plan", INLINE, "--stack", slow,
                       "--hw-set", f"efficiency.host_overhead_us_per_layer={host}")
    assert undone["step_time_s"] == pytest.approx(base["step_time_s"], rel=1e-12)


def test_plan_file_records_the_stack_and_simulate_reads_it_back(cli_runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _stack_file(tmp_path)
    out = tmp_path / "plan.json"
    result = cli_runner.invoke(cli, ["plan", GPT, "--hw", "a100x8", "--stack", "slow.toml", "--top", "1",
                                     "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    saved = Plan.load(out)
    assert saved.stack == str(tmp_path / "slow.toml")  # a path made absolute, as --hw's
    predicted = json.loads(result.stdout)["plans"][0]["step_time_s"]
    again = _simulate(cli_runner, str(out), "--no-contention")
    assert again["plan"]["stack"] == saved.stack
    assert again["step_time_s"] == pytest.approx(predicted, rel=1e-9)
    swapped = _simulate(cli_runner, str(out), "--no-contention", "--stack", DEFAULT_STACK)  # --stack wins
    assert swapped["plan"]["stack"] == DEFAULT_STACK and swapped["step_time_s"] < predicted / 2


def test_plan_files_without_a_stack_key_take_the_default(tmp_path):
    plan = Plan(model=GPT, hw="a100x8", nodes=1, dp=8, global_batch=8)
    data = plan.to_dict()
    assert data["stack"] == DEFAULT_STACK
    del data["stack"]
    assert Plan.from_dict(data).stack == DEFAULT_STACK
    for bad in ("", 3):
        with pytest.raises(PlanError, match="stack: got .* expected non-empty text"):
            Plan.from_dict({**plan.to_dict(), "stack": bad})


def test_the_stack_gives_overlap_dp_its_default(cli_runner, tmp_path):
    eager = str(_stack_file(tmp_path, "no-overlap", host=1075.0, overlap=False))
    result = cli_runner.invoke(cli, ["plan", GPT, "--hw", "a100x8", "--stack", eager, "--top", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert {p["overlap_dp"] for p in json.loads(result.stdout)["plans"]} == {False}
    fixed = cli_runner.invoke(cli, ["plan", GPT, "--hw", "a100x8", "--stack", eager, "--top", "2",
                                    "--fix", "overlap_dp=1", "--json"])
    assert {p["overlap_dp"] for p in json.loads(fixed.stdout)["plans"]} == {True}  # --fix wins
    assert _simulate(cli_runner, GPT, "--hw", "a100x8", "--plan", INLINE, "--stack", eager)["plan"]["overlap_dp"] is False
    assert _simulate(cli_runner, GPT, "--hw", "a100x8", "--plan", INLINE + ",overlap_dp=1",
                     "--stack", eager)["plan"]["overlap_dp"] is True
    plain = cli_runner.invoke(cli, ["plan", GPT, "--hw", "a100x8", "--top", "1", "--json"])
    assert json.loads(plain.stdout)["plans"][0]["overlap_dp"] is load_stack().overlap_grad_reduce


def test_hw_show_applies_the_stack(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["hw", "show", "a100x8", "--stack", str(_stack_file(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["efficiency"]["host_overhead_us_per_layer"] == 50000.0


def test_whatif_records_and_applies_the_stack(cli_runner, tmp_path):
    from smplan import report

    slow = str(_stack_file(tmp_path))
    figures = {}
    for name, extra in (("base", []), ("slow", ["--stack", slow])):
        out = tmp_path / name
        result = cli_runner.invoke(cli, ["whatif", GPT, "--hw", "a100x8", "--plan", INLINE, "--jobs", "1",
                                         "--seeds", "2", "-o", str(out), *extra])
        assert result.exit_code == 0, result.output
        record = report.load(out / "points.json")
        assert record["question"]["stack"] == (slow if extra else None)
        (point,) = record["points"]
        assert point["plan"]["stack"] == (slow if extra else DEFAULT_STACK)
        figures[name] = point["figures"]["step_time_s"]
    assert figures["slow"] > 2 * figures["base"]


def test_whatif_varies_the_stack(cli_runner, tmp_path):
    """--vary stack=A,B: one point per stack, each planned and simulated under its own stack."""
    from smplan import report

    slow = str(_stack_file(tmp_path))
    out = tmp_path / "sweep"
    result = cli_runner.invoke(cli, ["whatif", GPT, "--hw", "a100x8", "--plan", INLINE, "--jobs", "1", "--seeds", "2",
                                     "--vary", f"stack=megatron-core,{slow}", "-o", str(out)])
    assert result.exit_code == 0, result.output
    base, slowed = report.load(out / "points.json")["points"]
    assert (base["plan"]["stack"], slowed["plan"]["stack"]) == (DEFAULT_STACK, slow)
    assert slowed["figures"]["step_time_s"] > 2 * base["figures"]["step_time_s"]
    line = _one_error_line(cli_runner.invoke(cli, ["whatif", GPT, "--hw", "a100x8", "--plan", INLINE,
                                                   "--vary", "stack=megatron-core,nope"]))
    assert "--vary stack: unknown stack 'nope'" in line


def test_calibrate_writes_the_fitted_stack_keys(cli_runner, probed, tmp_path, monkeypatch):
    """Measured 1.5x the prediction under torchtitan: the fitted host overhead lands in a stack
    file that --stack loads; the values it does not fit come from torchtitan."""
    from smplan.calibrate import local_cluster

    fake_runs(monkeypatch, GPT, local_cluster(str(probed), 2, stack="torchtitan"), 1.5)
    out = tmp_path / "mystack.toml"
    args = ["calibrate", GPT, "--hw", str(probed), "--stack", "torchtitan", "--plans", "3",
            "--stack-output", str(out), "--runs-dir", str(tmp_path / "runs")]
    result = cli_runner.invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["stack_output"] == str(out) and report["output"] is None
    stack, base = load_stack(str(out)), load_stack("torchtitan")
    fitted = report["efficiency_after"]["host_overhead_us_per_layer"]
    assert stack.name == "mystack" and stack.host_overhead_us_per_layer == pytest.approx(fitted, rel=1e-5)
    assert fitted != base.host_overhead_us_per_layer
    assert (stack.elementwise_fusion, stack.overlap_grad_reduce) == (base.elementwise_fusion, base.overlap_grad_reduce)
    assert "fitted by smplan calibrate" in out.read_text() and "from bundled stack 'torchtitan'" in out.read_text()
    # an existing file is kept without --force, and refused before any plan runs
    monkeypatch.setattr("smplan.calibrate.run.run_plan", lambda *a: pytest.fail("a plan ran"))
    before = out.read_text()
    line = _one_error_line(cli_runner.invoke(cli, args))
    assert "--force" in line and "--stack-output" in line and out.read_text() == before


def test_a_stack_calibrated_under_the_default_keeps_the_probed_values_the_fit_ran_with(
        cli_runner, probed, tmp_path, monkeypatch):
    """Under the default stack a probed profile keeps its own fusion and overlaps (0: smplan
    execute's eager runs); the stack file written next to the fitted host time must hold those,
    not megatron-core's, or --stack would price the machine with overlaps it never had."""
    from smplan.hwprofiles import load_cluster

    from smplan.calibrate import local_cluster

    cluster = local_cluster(str(probed), 2)
    assert cluster.efficiency.tp_comm_overlap == 0.0 != load_stack(DEFAULT_STACK).tp_comm_overlap
    fake_runs(monkeypatch, GPT, cluster, 1.5)
    out = tmp_path / "mine.toml"
    result = cli_runner.invoke(cli, ["calibrate", GPT, "--hw", str(probed), "--plans", "3", "--stack-output",
                                     str(out), "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    stack = load_stack(str(out))
    for key in ("elementwise_fusion", "tp_comm_overlap", "ep_a2a_overlap"):
        assert getattr(stack, key) == getattr(cluster.efficiency, key), key
    assert "as the fit ran: the hardware profile's own value" in out.read_text()
    under = load_cluster(str(probed), stack=str(out)).efficiency
    assert (under.elementwise_fusion, under.tp_comm_overlap) == (0.0, 0.0)


def test_a_stack_that_replaces_a_files_own_value_says_so(cli_runner, tmp_path):
    """A calibrated profile states its fitted host time; another stack replaces it (by design),
    and says so; the default stack keeps it, and says so too."""
    from smplan.hwprofiles.loader import PROFILE_DIR

    mine = tmp_path / "cal.toml"
    mine.write_text((PROFILE_DIR / "h100x8.toml").read_text() + "\n[efficiency]\nhost_overhead_us_per_layer = 5000.0\n")
    other = cli_runner.invoke(cli, ["plan", "examples/gpt.py:tiny", "--hw", str(mine), "--stack", "torchtitan", "--top", "1"])
    assert other.exit_code == 0, other.output
    assert (f"note: --stack torchtitan replaces {mine}'s host_overhead_us_per_layer=5000.0 with its own "
            "(host_overhead_us_per_layer=1075.0)") in other.output
    default = cli_runner.invoke(cli, ["plan", "examples/gpt.py:tiny", "--hw", str(mine), "--top", "1"])
    assert default.exit_code == 0 and "--stack torchtitan replaces" not in default.output
    # the default keeps it, and says so: the output is headed "stack megatron-core" (a review
    # planned on a calibrated file's fp32 reduce and flash2 under that heading)
    assert (f"note: {mine}'s [efficiency] sets host_overhead_us_per_layer=5000.0, which the default stack "
            "megatron-core keeps over its own (host_overhead_us_per_layer=1075.0)") in default.output


def test_stack_show_marks_the_values_a_file_leaves_to_the_defaults(cli_runner, tmp_path):
    mine = tmp_path / "min.toml"
    mine.write_text("host_overhead_us_per_layer = 1075.0\nelementwise_fusion = 1.0\noverlap_grad_reduce = true\n")
    shown = cli_runner.invoke(cli, ["stack", "show", str(mine)])
    assert shown.exit_code == 0, shown.output
    assert "  host_overhead_us_per_layer = 1075.0\n" in shown.output
    assert "attention_kernel = flash2  (not in the file: the default)" in shown.output
    assert "(not in the file" not in cli_runner.invoke(cli, ["stack", "show", "megatron-core"]).output
