import contextlib
import json
import re

import pytest

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

GPT = f"{EXAMPLES / 'gpt.py'}:tiny"
BASE = ["reliability", GPT, "--hw", "a100x8", "--nodes", "512", "--plan", "dp=4096,mbs=1,gbs=4096"]


def test_reliability_json(cli_runner):
    result = cli_runner.invoke(cli, BASE + ["--days", "10", "--checkpoint-minutes", "5", "--seeds", "20", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in ("goodput_mean", "goodput_p10", "goodput_p50", "goodput_p90", "wall_mean_s", "wall_p10_s",
                "wall_p50_s", "wall_p90_s", "failures_mean", "best_interval_s", "young_interval_s",
                "daly_interval_s", "interval_s"):
        assert key in data
    assert 0 < data["goodput_mean"] < 1
    assert data["best_interval_s"] == pytest.approx(data["daly_interval_s"], rel=0.3)
    # the run's cost at the profile's price, as whatif prices a point (a review: reliability had none)
    assert data["gpu_hours_mean"] == pytest.approx(data["wall_mean_s"] / 3600 * 4096)
    assert data["usd_mean"] == pytest.approx(data["gpu_hours_mean"] * data["usd_per_gpu_hour"]) and data["usd_mean"] > 0
    text = cli_runner.invoke(cli, BASE + ["--days", "10", "--checkpoint-minutes", "5", "--seeds", "20"]).output
    assert f"the mean wall-clock takes {data['gpu_hours_mean']:,.0f} GPU-hours, ${data['usd_mean']:,.0f} at $" in text
    free = cli_runner.invoke(cli, BASE + ["--days", "10", "--checkpoint-minutes", "5", "--seeds", "20",
                                          "--hw-set", "cost.usd_per_gpu_hour=0"])  # a profile without a price
    assert free.exit_code == 0, free.output
    assert re.search(r"the mean wall-clock takes [\d,]+ GPU-hours\n", free.output), free.output


def test_a_model_without_sequences_counts_samples(cli_runner):
    """--tokens of an MLP are samples, as plan and whatif count them; the report said tokens/s."""
    base = ["reliability", f"{EXAMPLES / 'mlp.py'}", "--hw", "a100x8", "--plan", "dp=8,mbs=4,gbs=32",
            "--tokens", "1e9", "--seeds", "5"]
    text = cli_runner.invoke(cli, base)
    assert text.exit_code == 0, text.output
    assert " samples/s, failure-free" in text.output and "tokens/s" not in text.output
    data = json.loads(cli_runner.invoke(cli, base + ["--json"]).output)
    assert data["unit"] == "sample"
    tokens = json.loads(cli_runner.invoke(cli, BASE + ["--days", "1", "--seeds", "5", "--json"]).output)
    assert tokens["unit"] == "token"


def test_a_run_shorter_than_the_interval_says_so_and_names_its_hardware(cli_runner):
    """A review: the run's own length was labelled Daly's, and the header named no hardware."""
    result = cli_runner.invoke(cli, BASE + ["--days", "0.002", "--checkpoint-minutes", "5", "--seeds", "5"])
    assert result.exit_code == 0, result.output
    assert re.search(r"used \(the whole run: shorter than the sweep's or Daly's\) +2\.88\b", result.output), result.output
    assert "so the interval used is Daly's" not in result.output
    assert ": 4096 GPUs (a100x8, stack megatron-core), step " in result.output


def test_reliability_table_tokens_and_options(cli_runner):
    result = cli_runner.invoke(cli, BASE + ["--tokens", "1e10", "--checkpoint-interval-min", "30", "--mtbf-hours", "20000",
                                            "--restart-minutes", "5", "--async-checkpoint", "--spares", "8",
                                            "--weibull-shape", "1.2", "--seeds", "10"])
    assert result.exit_code == 0, result.output
    assert "goodput" in result.output and "Daly" in result.output and "used (given)" in result.output
    # the write time's assumption is printed: every node writes its shard at the profile's rate,
    # up to the file system's ceiling (512 x 5 GB/s is past it)
    assert ("512 nodes writing 5 GB/s each, capped at the file system's 2000 GB/s; --checkpoint-minutes sets it, "
            "async: blocks") in result.output
    given = cli_runner.invoke(cli, BASE + ["--days", "1", "--checkpoint-minutes", "5", "--seeds", "5"])
    assert "checkpoint 5.00 min (" in given.output and "writing" not in given.output


@pytest.mark.parametrize(
    "extra",
    [
        [],  # neither --days nor --tokens
        ["--days", "1", "--tokens", "5"],
        ["--days", "-1"],
        ["--days", "1", "--checkpoint-interval-min", "soon"],
        ["--days", "1", "--checkpoint-interval-min", "0"],
        ["--days", "1", "--mtbf-hours", "0"],
        ["--days", "1", "--weibull-shape", "100"],
        ["--days", "1", "--weibull-shape", "0"],
        ["--days", "1", "--weibull-shape", "nan"],
        # a free checkpoint has no best interval: Young's and Daly's would be 0
        ["--days", "1", "--checkpoint-minutes", "0"],
        # an asynchronous write must end before the next one starts
        ["--days", "1", "--async-checkpoint", "--checkpoint-minutes", "60", "--checkpoint-interval-min", "5"],
    ],
)
def test_reliability_bad_inputs_one_line_exit_2(cli_runner, extra):
    result = cli_runner.invoke(cli, BASE + extra)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output


def test_reliability_missing_plan_file(cli_runner):
    result = cli_runner.invoke(cli, ["reliability", "nope.json", "--days", "1"])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_reliability_warns_of_a_plan_that_does_not_fit(cli_runner):
    """Goodput of a plan that runs out of memory is no run's: the same warning as `simulate`."""
    args = ["reliability", GPT, "--hw", "a100x8", "--hw-set", "gpu.memory_gib=0.01", "--plan",
            "tp=1,pp=1,dp=8,mbs=8,gbs=64", "--tokens", "1e9", "--seeds", "3"]
    text = cli_runner.invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert text.stderr.startswith("warning: the fullest GPU needs") and "run out of memory" in text.stderr
    data = json.loads(cli_runner.invoke(cli, [*args, "--json"]).stdout)
    assert data["fits_memory"] is False and data["peak_memory_gib"] > data["memory_capacity_gib"] > 0
    fits = cli_runner.invoke(cli, ["reliability", GPT, "--hw", "a100x8", "--plan", "dp=8,mbs=1,gbs=8", "--tokens",
                                   "1e9", "--seeds", "3", "--json"])
    assert json.loads(fits.stdout)["fits_memory"] is True and "warning" not in fits.stderr


def test_zero_spares_take_repair_hours_and_are_echoed(cli_runner):
    """--spares 0 is a pool with no spare (every failure waits for its repair), not "no pool": it takes
    --repair-hours, and the text and --json say so, with the wall-clock spent waiting for a spare."""
    args = BASE + ["--days", "10", "--checkpoint-minutes", "5", "--seeds", "10", "--spares", "0", "--repair-hours", "48"]
    text = cli_runner.invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "0 spare nodes, a failed node back after 48 h" in text.output
    assert "waiting for a spare node: " in text.output and "of the wall-clock lost from goodput" in text.output
    # Daly's closed form has no spare pool: its wall-clock is short of the simulated one by the wait
    assert "Daly's formula leaves out the " in text.output and " waiting for a spare node)" in text.output
    data = json.loads(cli_runner.invoke(cli, [*args, "--json"]).stdout)
    assert (data["spares"], data["repair_hours"], data["weibull_shape"]) == (0, 48.0, None)
    assert 0 < data["spare_wait_mean_s"] <= data["failures_mean"] * 48 * 3600  # a failure can cut a wait short
    alone = cli_runner.invoke(cli, BASE + ["--days", "1", "--repair-hours", "48"])  # still needs a pool
    assert alone.exit_code == 2 and "add --spares N" in alone.output


def test_the_failure_model_is_echoed(cli_runner):
    plain = cli_runner.invoke(cli, BASE + ["--days", "1", "--checkpoint-minutes", "5", "--seeds", "5"])
    assert "failures: exponential GPU lifetimes (no ageing); spare nodes never run short" in plain.output
    assert "waiting for a spare" not in plain.output
    args = BASE + ["--days", "1", "--checkpoint-minutes", "5", "--seeds", "5", "--weibull-shape", "0.7", "--spares", "4"]
    text = cli_runner.invoke(cli, args)
    assert "Weibull GPU lifetimes, shape 0.7 (infant mortality), every GPU new at t=0; 4 spare nodes" in text.output
    data = json.loads(cli_runner.invoke(cli, [*args, "--json"]).stdout)
    assert (data["spares"], data["repair_hours"], data["weibull_shape"]) == (4, 24.0, 0.7)
    none = json.loads(cli_runner.invoke(cli, BASE + ["--days", "1", "--seeds", "5", "--json"]).stdout)
    assert (none["spares"], none["repair_hours"], none["weibull_shape"], none["spare_wait_mean_s"]) == (None, None,
                                                                                                      None, 0.0)


def test_help_says_what_days_and_weibull_shape_mean(cli_runner):
    text = " ".join(cli_runner.invoke(cli, ["reliability", "--help"]).output.split())
    assert "--days FLOAT Failure-free training days" in text and "`smplan whatif --days`, which is wall-clock" in text
    assert "every GPU new at t=0" in text and "infant mortality" in text and "wear-out" in text


def test_a_mean_outside_p10_p90_is_explained(cli_runner):
    """A short run: most seeds see no failure, so p10..p90 are all failure-free and the mean lies below."""
    # 4096 GPUs of 122,880 h MTBF fail every 30 h: 0.08 failures in 2.4 h per seed
    args = BASE + ["--days", "0.1", "--mtbf-hours", "122880", "--checkpoint-minutes", "5", "--seeds", "100"]
    text = cli_runner.invoke(cli, args)
    assert text.exit_code == 0, text.output
    data = json.loads(cli_runner.invoke(cli, [*args, "--json"]).stdout)
    assert data["goodput_mean"] < data["goodput_p10"] and 50 < data["seeds_without_failure"] < 100
    notes = [line for line in text.output.splitlines() if line.startswith("note: ") and "no failure" in line]
    assert notes == [f"note: {data['seeds_without_failure']} of 100 seeds see no failure (failures per seed "
                     f"{data['failures_mean']:.2g} on average): the few seeds that fail pull the mean "
                     f"({100 * data['goodput_mean']:.2f}%) below p10"]
    common = cli_runner.invoke(cli, BASE + ["--days", "10", "--checkpoint-minutes", "5", "--seeds", "20"])
    assert "see no failure" not in common.output


@pytest.mark.parametrize("shape", ["0", "-1", "0.05", "11"])
def test_every_weibull_shape_out_of_range_gets_the_range(cli_runner, shape):
    """0 once said "must be greater than 0" while 0.05 got the range: one message for all."""
    result = cli_runner.invoke(cli, BASE + ["--days", "1", "--weibull-shape", shape])
    assert result.exit_code == 2
    assert result.output.startswith("error: --weibull-shape must be between 0.1 and 10, got "), result.output


def test_wall_clock_days_past_100_keep_a_decimal(cli_runner):
    """113.0 113.1 113.3 once printed as "113 113 113": the spread the seeds draw must show."""
    result = cli_runner.invoke(cli, BASE + ["--days", "120", "--checkpoint-minutes", "1", "--seeds", "5"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("wall-clock (days)"))
    values = row.split()[2:]
    assert len(values) == 4 and all(float(v) >= 120 and re.fullmatch(r"[\d,]+\.\d", v) for v in values), row


def test_without_spares_daly_needs_no_excuse(cli_runner):
    result = cli_runner.invoke(cli, BASE + ["--days", "1", "--checkpoint-minutes", "5", "--seeds", "5"])
    assert "Daly's expected wall-clock" in result.output and "leaves out" not in result.output


def test_tokens_train_in_whole_steps_as_whatif_counts_them(cli_runner, tmp_path):
    """`--tokens 1` is one whole step and its checkpoint (reliability once priced a fraction of a
    step: 0.00% goodput, while whatif said 28.5% for the same run)."""
    plan = ["--hw", "a100x8", "--plan", "dp=8,mbs=1,gbs=8", "--tokens", "1", "--seeds", "5"]
    rel = cli_runner.invoke(cli, ["reliability", GPT, *plan, "--json"])
    assert rel.exit_code == 0, rel.output
    data = json.loads(rel.output)
    assert data["work_s"] == pytest.approx(data["step_time_s"])
    # what was run, named as simulate --json names it
    assert data["model"] == GPT and data["hw"] == "a100x8" and data["plan"]["dp"] == 8
    short = json.loads(cli_runner.invoke(cli, ["reliability", GPT, *plan[:-4], "--days", "1e-16", "--json"]).output)
    assert short["work_s"] == pytest.approx(data["step_time_s"])  # --days too: at least one whole step
    wi = cli_runner.invoke(cli, ["whatif", GPT, *plan, "--json", "-o", str(tmp_path / "w")])
    assert wi.exit_code == 0, wi.output
    run = json.loads(wi.stdout)["points"][0]["run"]
    assert run["steps"] == 1 and run["goodput"] == pytest.approx(data["goodput_mean"], rel=1e-6)


def test_a_plan_file_whose_recorded_step_is_not_its_own_is_noted(cli_runner, tmp_path):
    """simulate said so and reliability did not, pricing goodput at another step (a review's finding)."""
    plan = tmp_path / "plan.json"
    assert cli_runner.invoke(cli, ["plan", GPT, "--hw", "a100x8", "--global-batch", "16", "-o", str(plan)]).exit_code == 0
    run = ["reliability", str(plan), "--days", "1", "--seeds", "5"]
    assert "records a predicted step" not in cli_runner.invoke(cli, run).output
    data = json.loads(plan.read_text())
    data["predicted"]["step_time_s"] = 99.0  # hand-edited
    plan.write_text(json.dumps(data))
    result = cli_runner.invoke(cli, run)
    assert result.exit_code == 0 and f"note: {plan} records a predicted step of 99 s but simulating it gives" in result.output


def test_a_long_sweep_says_what_runs_on_stderr(cli_runner, monkeypatch):
    """A review: --seeds 1000 on a long run printed nothing for 2 min 23 s. The word goes to
    stderr (smplan.progress.said_after), so --json's stdout stays one object."""
    said = []

    @contextlib.contextmanager
    def record(say, message):
        said.append(message)
        say(message)
        yield

    monkeypatch.setattr("smplan.cli.reliability.said_after", record)
    result = cli_runner.invoke(cli, BASE + ["--days", "1", "--seeds", "5", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["seeds"] == 5
    assert said == ["simulating a sweep of checkpoint intervals, 5 failure draws each (fewer --seeds is quicker) ..."]
    assert said[0] in result.stderr
