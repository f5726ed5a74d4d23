"""What `smplan whatif` says beside its numbers: of which peak an MFU is, how many GPUs a profile's
nodes hold, the checkpoint interval a run used, what a sample is, and plan's sac note."""

from __future__ import annotations

import json
import re

import pytest

from smplan import report
from smplan.cli.main import cli

TINY = "examples/gpt.py:tiny"


def whatif(cli_runner, tmp_path, *args):
    out = tmp_path / "r"
    result = cli_runner.invoke(cli, ["whatif", TINY, "--jobs", "1", "--seeds", "3", "-o", str(out), *args])
    assert result.exit_code == 0, result.output
    return result, report.load(out / "points.json"), (out / "index.html").read_text()


def table_header(output: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.startswith("#  point"))
    return re.split(r"\s{2,}", line.strip())


def test_an_fp8_points_mfu_is_said_to_be_of_the_fp8_peak(cli_runner, tmp_path):
    """H100 fp8 read 43% MFU against bf16's 59% while 1.5x faster: plan says of which peak, so must whatif."""
    result, record, page = whatif(cli_runner, tmp_path, "--hw", "h100x8", "--plan", "dp=8,mbs=1",
                                  "--vary", "dtype=bf16,fp8")
    bf16, fp8 = record["points"]
    assert fp8["plan"]["dtype"] == "fp8" and bf16["plan"]["dtype"] == "bf16"
    notes = [line for line in result.output.splitlines() if "fp8 peak" in line]
    assert len(notes) == 1 and notes[0].startswith(f"note: the MFU of fp8 point #{fp8['id']} is of the GPU's fp8 peak")
    # the fp8 point's table cell, and the recommended point's MFU when it is that one; not the bf16 point's
    assert page.count(" of the fp8 peak</") == 1 + (record["recommended"] == fp8["id"])
    assert record["notes"] == [notes[0]]  # in points.json, and so on the page
    plain, _, _ = whatif(cli_runner, tmp_path / "b", "--hw", "h100x8", "--plan", "dp=8", "--vary", "mbs=1,2")
    assert "fp8 peak" not in plain.output


def test_a_gpu_comparison_says_the_points_run_on_different_gpu_counts(cli_runner, tmp_path):
    """--nodes 1 is 8 H100s but 4 GB200s (a tray): the heading and a note say so."""
    result, record, page = whatif(cli_runner, tmp_path, "--hw", "h100x8", "--nodes", "1",
                                  "--vary", "hw=h100x8,gb200nvl72", "--plan", "mbs=1")
    assert [p["num_gpus"] for p in record["points"]] == [8, 4]
    heading = record["question"]["text"]
    assert "on 1 node of each hw profile (its own GPUs per node)" in heading and "on h100x8 x 1" not in heading
    assert heading in result.output and heading in page
    note = next(line for line in result.output.splitlines() if line.startswith("note: nodes are each profile's own"))
    assert "h100x8 8, gb200nvl72 4" in note and "different GPU counts" in note
    # equal GPU counts (8 of each): nothing to say
    same, _, _ = whatif(cli_runner, tmp_path / "s", "--hw", "h100x8", "--vary", "hw=h100x8,a100x8", "--plan", "mbs=1")
    assert "nodes are each profile's own" not in same.output


def test_the_table_shows_the_checkpoint_interval_each_run_used(cli_runner, tmp_path):
    result, record, page = whatif(cli_runner, tmp_path, "--hw", "a100x8", "--plan", "dp=8,mbs=1", "--tokens", "1e10",
                                  "--vary", "reliability.gpu_mtbf_hours=500,50000")
    assert "ckpt min" in table_header(result.output)
    rows = [line for line in result.output.splitlines() if line.startswith(("0 ", "1 "))]
    for row, p in zip(rows, record["points"], strict=True):
        assert float(row.split()[-1]) == pytest.approx(p["run"]["checkpoint_interval_min"], rel=0.05, abs=0.05)
    assert "<th>checkpoint every (min)</th>" in page
    timeless, _, _ = whatif(cli_runner, tmp_path / "t", "--hw", "a100x8", "--vary", "mbs=1,2", "--plan", "dp=8")
    assert "ckpt min" not in timeless.output


def test_without_a_run_the_recommendation_says_how_it_prices_a_token(cli_runner, tmp_path):
    result, record, _ = whatif(cli_runner, tmp_path, "--hw", "a100x8", "--vary", "mbs=1,2", "--plan", "dp=8",
                               "--global-batch", "16")
    assert all(p["feasible"] for p in record["points"])
    assert "lowest cost per token of a step (step time x GPUs x price per GPU-hour" in record["recommendation"]
    rec = record["points"][record["recommended"]]["figures"]
    per_token = [p["figures"]["usd_per_step"] / (p["figures"]["tokens_per_s"] * p["figures"]["step_time_s"])
                 for p in record["points"]]
    assert rec["usd_per_step"] / (rec["tokens_per_s"] * rec["step_time_s"]) == min(per_token)


def test_wall_clock_days_past_100_keep_a_decimal(cli_runner, tmp_path):
    """A restart-time sweep moved the cost by 1% while the days read 113 and 114."""
    result, record, _ = whatif(cli_runner, tmp_path, "--hw", "a100x8", "--plan", "dp=8,mbs=1", "--tokens", "1e11",
                               "--vary", "reliability.restart_minutes=5,60")
    column = table_header(result.output).index("days")
    for p in record["points"]:
        row = next(line for line in result.output.splitlines() if line.startswith(f"{p['id']}  "))
        assert p["run"]["days"] > 100 and re.split(r"\s{2,}", row)[column] == f"{p['run']['days']:,.1f}"


def test_a_model_without_sequences_counts_samples_as_plan_does(cli_runner, tmp_path):
    out = tmp_path / "cnn"
    result = cli_runner.invoke(cli, ["whatif", "examples/cnn.py", "--hw", "a100x8", "--plan", "dp=8",
                                     "--vary", "mbs=1,2", "--tokens", "1e9", "--seeds", "3", "--jobs", "1",
                                     "-o", str(out)])
    assert result.exit_code == 0, result.output
    record = report.load(out / "points.json")
    assert record["question"]["unit"] == "sample" and "1e+09 samples" in record["question"]["text"]
    header = table_header(result.output)
    assert "samples/s" in header and not any("token" in h for h in header)
    assert "tokens/s" not in (out / "index.html").read_text()
    gpt, _, _ = whatif(cli_runner, tmp_path, "--hw", "a100x8", "--plan", "dp=8", "--vary", "mbs=1,2")
    assert "tokens/s" in table_header(gpt.output)


def test_plans_sac_note_is_said_for_a_stack_without_sac(cli_runner, tmp_path):
    """plan notes that sac is torchtitan's policy alone; whatif printed no such note."""
    from smplan.cli.notes import sac_stack_note  # the note plan prints, reused

    result, record, _ = whatif(cli_runner, tmp_path, "--hw", "a100x8", "--plan", "dp=8,mbs=1,recompute=sac",
                               "--vary", "stack=megatron-deepspeed,torchtitan")
    notes = [line for line in result.output.splitlines() if "op-level selective checkpointing" in line]
    assert len(notes) == 1 and notes[0].startswith("note (#0): sac is torchtitan's")
    from smplan.whatif.point import plan_from_record

    said = sac_stack_note(plan_from_record(record["points"][0]), "megatron-deepspeed")
    assert said and said.removeprefix("note: ") in notes[0]
    as_json = cli_runner.invoke(cli, ["whatif", TINY, "--jobs", "1", "--hw", "a100x8", "--plan",
                                      "dp=8,mbs=1,recompute=sac", "--vary", "stack=megatron-deepspeed,torchtitan",
                                      "-o", str(tmp_path / "j"), "--json"])
    assert notes[0] in json.loads(as_json.stdout)["notes"]


def test_help_names_the_reliability_keys_and_wall_clock_days(cli_runner):
    text = " ".join(cli_runner.invoke(cli, ["whatif", "--help"]).output.split())
    for key in ("reliability.gpu_mtbf_hours", "reliability.restart_minutes", "storage.checkpoint_write_gbps"):
        assert key in text
    assert "wall-clock days" in text and "`smplan reliability --days`, which is failure-free" in text
    top = cli_runner.invoke(cli, ["--help"]).output
    flow = top[top.index("Typical flow"):]
    assert "smplan whatif " in flow and "smplan reliability " in flow
    # the environment it reads, the executor's fault-injection hooks included (a review found them undocumented)
    assert all(name in top for name in ("SMPLAN_CACHE_DIR", "SMPLAN_VALIDATION_DIR", "SMPLAN_FAIL_AT_STEP"))


def test_an_all_infeasible_sweep_gives_its_reasons_in_the_points_order(cli_runner, tmp_path):
    """The 16-GPU point's reason once came before the 8-GPU one's (sorted as text)."""
    result = cli_runner.invoke(cli, ["whatif", TINY, "--jobs", "1", "--hw", "a100x8", "--hw-set", "gpu.memory_gib=0.5",
                                     "--vary", "nodes=1,2", "-o", str(tmp_path / "r")])
    assert result.exit_code == 2
    error = result.output.strip().splitlines()[-1]
    assert error.startswith("error: no feasible point: ")
    assert 0 < error.index("on 8 GPUs") < error.index("on 16 GPUs")


def test_days_shorter_than_a_step_are_each_points_reason_not_a_traceback(cli_runner, tmp_path):
    """`--days` under one step and its checkpoint divided by zero tokens in the recommendation."""
    out = tmp_path / "r"
    result = cli_runner.invoke(cli, ["whatif", TINY, "--jobs", "1", "--seeds", "3", "--hw", "a100x8",
                                     "--plan", "dp=8,mbs=1", "--days", "1e-9", "-o", str(out)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "no whole step ends within 1e-09 days: one step (" in result.output
    assert not report.load(out / "points.json")["points"][0]["feasible"]


def test_a_sweep_of_model_sizes_says_its_points_are_different_models(cli_runner, tmp_path):
    # a smaller model trains the most tokens: the pick said only that, as if the points were comparable
    # (a review's finding)
    _, record, _ = whatif(cli_runner, tmp_path, "--hw", "a100x8", "--vary", "arg.layers=2,4", "--days", "1")
    assert record["recommendation"].startswith("The points build different models (arg.layers varies), whose "
                                               "tokens are not worth the same"), record["recommendation"]
    _, same, _ = whatif(cli_runner, tmp_path / "same", "--hw", "a100x8", "--vary", "nodes=1,2", "--days", "1")
    assert "different models" not in same["recommendation"]
    # an argument that leaves the model's work per token as it is (the attention kernel) compares like for like
    _, kernel, _ = whatif(cli_runner, tmp_path / "kernel", "--hw", "a100x8", "--vary", "arg.attention=sdpa,explicit",
                          "--days", "1")
    assert "different models" not in kernel["recommendation"], kernel["recommendation"]


def test_a_sweep_of_conditions_has_a_best_case_not_a_recommendation(cli_runner, tmp_path):
    """A GPU's MTBF is not the user's to choose: "recommended: mtbf=50000" read as advice."""
    from smplan.report.points import picked_word

    result, record, page = whatif(cli_runner, tmp_path, "--hw", "a100x8", "--plan", "dp=8,mbs=1", "--tokens", "1e10",
                                  "--vary", "reliability.gpu_mtbf_hours=5,50000")
    assert picked_word(record) == "best case" and "\nbest case: #" in result.output and "recommended:" not in result.output
    low, high = sorted(record["points"], key=lambda p: p["run"]["goodput"])
    assert f"Goodput runs from {low['run']['goodput']:.1%} (#{low['id']}" in record["recommendation"]
    assert "<h2>Best case</h2>" in page and "the recommended plan" not in page and '">best case' in page
    chosen, record, _ = whatif(cli_runner, tmp_path / "c", "--hw", "a100x8", "--plan", "dp=8,mbs=1", "--tokens", "1e10",
                               "--vary", "storage.checkpoint_write_gbps=1,5")  # storage is bought: a choice
    assert picked_word(record) == "recommended" and "recommended: #" in chosen.output


def test_a_price_sweep_charts_the_cost_of_a_token(cli_runner, tmp_path):
    from smplan.report.points import usd_per_million, versus_metric

    _, record, _ = whatif(cli_runner, tmp_path, "--hw", "a100x8", "--plan", "dp=8,mbs=1",
                          "--vary", "cost.usd_per_gpu_hour=2,4")
    assert versus_metric("cost.usd_per_gpu_hour", record["points"]) == "usd_per_mtok"
    cheap, dear = sorted(record["points"], key=lambda p: p["settings"]["cost.usd_per_gpu_hour"])
    assert usd_per_million(dear) == pytest.approx(2 * usd_per_million(cheap))
    ax = report.draw_chart("versus", record).axes[0]
    assert ax.get_ylabel() == "USD per million tokens" and "USD per GPU-hour" in ax.get_xlabel()


def test_whatif_help_states_the_recommendation_rule(cli_runner):
    from smplan.whatif.sweep import NEAR_BEST

    text = " ".join(cli_runner.invoke(cli, ["whatif", "--help"]).output.split())
    assert f"within {NEAR_BEST:g}x of the best" in text and "cost.usd_per_gpu_hour" in text
    assert "smplan reliability" in " ".join(cli_runner.invoke(cli, ["simulate", "--help"]).output.split())


def test_tokens_trained_print_with_the_digits_that_tell_points_apart():
    from smplan.cli.whatif import distinct_digits

    assert distinct_digits([2.461e12, 2.4635e12, 2.4642e12]) == 5 and distinct_digits([1e12, 2e12]) == 3
    assert distinct_digits([1.0, 1.0]) == 3
