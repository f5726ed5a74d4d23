"""Wrong inputs a review found past the one-line rule (a traceback, a hang, a silent no-op):
each is now one line, exit 2, before any work, or a warning where the input may be meant."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from smplan.planner.search_space import _divisors

from smplan.cli import notes
from smplan.cli.main import cli
from tests.monitor.fake_runs import write_run
from tests.own_models import OWN_MODEL

TINY = "examples/gpt.py:tiny"
LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}


def _error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize("change, says", [
    ({"hidden_size": "big"}, "Field 'hidden_size' expected int"),  # transformers 5's strict dataclass
    ({"num_attention_heads": 5}, "not a multiple of the number of attention heads"),
    ({"hidden_size": 0}, "config.json's hidden_size is 0; it must be at least 1"),  # divided by, deep inside
])
def test_a_broken_hf_config_is_one_line(cli_runner, tmp_path, change, says):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **change}))
    assert says in _error_line(cli_runner.invoke(cli, ["plan", f"hf:{tmp_path}", "--hw", "a100x8"]))


@pytest.mark.parametrize("source, says", [
    ("import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--data', required=True)\n"
     "parser.parse_args()\n", "importing it called sys.exit (2), as argparse does"),
    ("import sys\nsys.exit('please run me with python')\n",
     "importing it called sys.exit (please run me with python); a model file must not exit"),  # no argparse named
    ("import sys\n\ndef model():\n    sys.exit(3)\n", "model() called sys.exit (3)"),
])
def test_a_model_file_that_exits_says_so_not_as_smplans_exit(cli_runner, tmp_path, source, says):
    """argparse at import printed its usage as if smplan's own usage error; sys.exit(3) left with no
    word, exit 3. (argparse's own lines still come first: what a file prints is not hidden.)"""
    path = tmp_path / "script.py"
    path.write_text(source)
    result = cli_runner.invoke(cli, ["profile", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert says in result.output.strip().splitlines()[-1]


def test_a_module_named_like_a_hook_other_than_loss_is_not_refused(tmp_path):
    """`from torch.utils import data` in a model file: execute's workers ask for its data() hook."""
    from smplan.planner.model_file import load_model_file

    path = tmp_path / "m.py"
    path.write_text(OWN_MODEL + "\nfrom torch.utils import data  # noqa: E402\n")
    assert load_model_file(str(path)).hook("data") is None


@pytest.mark.parametrize("args, says", [
    (["plan", TINY, "--hw", "a100x8", "--global-batch", str(10**12)], "'--global-batch': 1000000000000 is not in"),
    (["plan", TINY, "--hw", "a100x8", "--nodes", str(10**12)], "'--nodes': 1000000000000 is not in"),
    (["plan", TINY, "--hw", "a100x8", "--seq-len", str(2**25)], "'--seq-len': 33554432 is not in"),
    (["whatif", TINY, "--hw", "a100x8", "--global-batch", str(10**12)], "'--global-batch'"),
])
def test_huge_sizes_are_refused_before_a_search_that_would_hang(cli_runner, args, says):
    assert says in _error_line(cli_runner.invoke(cli, args))


def test_a_sequence_no_gpu_holds_says_so_and_its_suggestion_fits(cli_runner):
    """8M tokens crashed the ILP solver (pulp's HiGHS interface); at 1M the suggested node count,
    found on a lower bound without the recompute buffer, did not fit when tried."""
    def error(result) -> str:  # after the profiling progress line, which a new length prints
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        return result.output.strip().splitlines()[-1]

    far = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--seq-len", str(2**23)])
    assert error(far).startswith("error: no plan fits")
    near = error(cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--seq-len", str(2**20)]))
    nodes = near.rpartition("--nodes ")[2]
    assert nodes.isdigit(), near
    tried = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--seq-len", str(2**20), "--nodes", nodes])
    assert tried.exit_code == 0, tried.output


@pytest.mark.parametrize("loss, says", [
    ("def loss(outputs, targets):\n    return outputs\n", "loss() returned a tensor of shape (1, 8, 64), not one number"),
    ("loss = 3\n", "loss is int, not a function"),
])
def test_a_loss_that_cannot_be_trained_on_is_refused_before_launch(cli_runner, tmp_path, loss, says):
    """Every worker raised in backward (a traceback per rank, exit 1); `loss = 3` trained on the
    default loss without a word."""
    path = tmp_path / "m.py"
    path.write_text(OWN_MODEL + "\n\n" + loss)
    assert says in _error_line(cli_runner.invoke(cli, ["profile", str(path)]))
    run = cli_runner.invoke(cli, ["execute", "dp=2,mbs=1,gbs=2", "--model", str(path), "-o", str(tmp_path / "r")])
    assert says in _error_line(run)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args", [
    ["plan", TINY, "--hw", "a100x8", "-o", ""],
    ["simulate", TINY, "--hw", "a100x8", "--plan", "dp=8", "--trace", ""],
    ["execute", "dp=1", "--model", TINY, "-o", ""],
    ["whatif", TINY, "--vary", "nodes=1,2", "-o", ""],
    ["export", "run", ""],
])
def test_an_empty_output_path_is_refused(cli_runner, args):
    """`-o "$OUT"` with OUT unset: plan wrote nothing without a word, execute ran without a run
    folder, whatif took the current folder."""
    assert "an empty path (an unset shell variable?)" in _error_line(cli_runner.invoke(cli, args))


def test_a_builder_that_fails_at_once_prints_no_progress_line(cli_runner, tmp_path, monkeypatch):
    monkeypatch.setenv("SMPLAN_CACHE_DIR", str(tmp_path))  # not cached: it profiles
    line = _error_line(cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--arg", "kv_heads=3"]))
    assert "must be divisible by kv_heads=3" in line


@pytest.mark.parametrize("ref", ["examples/gpt.py:tiny:x", "examples/gpt.py::tiny"])
def test_two_colons_name_the_builder_not_a_missing_file(cli_runner, ref):
    assert "examples/gpt.py exists but" in _error_line(cli_runner.invoke(cli, ["profile", ref]))


def test_a_host_time_in_nanoseconds_is_warned(cli_runner):
    out = cli_runner.invoke(cli, ["simulate", TINY, "--hw", "a100x8", "--plan", "dp=8",
                                  "--hw-set", "efficiency.host_overhead_us_per_layer=1.075e9"]).output
    assert "host_overhead_us_per_layer = 1.075e+09 looks like another unit" in out


def test_a_metrics_line_without_its_numbers_is_skipped_not_a_keyerror(cli_runner, tmp_path):
    run = write_run(tmp_path / "run", steps=4)
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps({"step": 5, "loss": 1.0}) + "\n")  # edited by hand: no step_time_s
    for args in (["monitor", str(run)], ["report", str(run), "-o", str(tmp_path / "r.html")]):
        result = cli_runner.invoke(cli, args)
        assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert "metrics.jsonl:step 5" in cli_runner.invoke(cli, ["monitor", str(run), "--json"]).output


@given(st.integers(1, 5000))
def test_divisors_in_sqrt_steps_are_every_divisor_in_order(n):
    assert _divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


@given(st.integers(1, 3000), st.sampled_from([1, 2, 8, 24, 64, 96, 1000, 1024]))
def test_the_batch_note_names_the_nearest_batch_with_wider_dp(global_batch, gpus):
    """As the scan of every batch in reach did (its ±5% of 10^12 ran out of memory)."""
    widest = notes._widest_dp(global_batch, gpus)
    reach = max(1, int(notes.BATCH_NOTE_REACH * global_batch))
    scan = sorted(range(max(1, global_batch - reach), global_batch + reach + 1), key=lambda g: abs(g - global_batch))
    want = next((g for g in scan if notes._widest_dp(g, gpus) >= notes.BATCH_NOTE_DP_GAIN * widest), None)
    line = notes.batch_divisors_note(global_batch, gpus)
    assert (line is None) == (want is None)
    if want is not None:
        assert f"--global-batch {want} allows" in line


def test_a_swept_hf_argument_is_checked_with_the_given_ones(cli_runner, tmp_path):
    """8 kv heads against config.json's 4 heads was refused though --arg gave 8 heads."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    result = cli_runner.invoke(cli, ["whatif", f"hf:{tmp_path}", "--hw", "a100x8", "--arg", "num_attention_heads=8",
                                     "--vary", "arg.num_key_value_heads=4,8", "-o", str(tmp_path / "wi")])
    assert result.exit_code == 0, result.output


def test_a_bad_fault_hook_variable_is_named_by_the_variable(cli_runner, tmp_path):
    """$SMPLAN_FAIL_AT_STEP=abc was refused as '--fail-at-step', an option --help does not show."""
    out = tmp_path / "run"
    result = cli_runner.invoke(cli, ["execute", "mbs=1,gbs=1", "--model", TINY, "-o", str(out)],
                               env={"SMPLAN_FAIL_AT_STEP": "abc"})
    assert result.exit_code == 2 and not out.exists(), result.output
    assert "Invalid value for $SMPLAN_FAIL_AT_STEP (a test hook; unset it for a real run)" in _error_line(result)


def test_the_decay_fraction_default_is_the_executors_and_a_bad_value_is_one_line(cli_runner, tmp_path):
    """--decay-fraction's default is read from executor/recipe.py only when click needs it
    (options.LazyConstantOption); --help shows it, and a bad value is still one line, exit 2."""
    from smplan.executor.recipe import DEFAULT_DECAY_FRACTION

    shown = cli_runner.invoke(cli, ["execute", "--help"]).output
    assert f"[default: {DEFAULT_DECAY_FRACTION}]" in " ".join(shown.split())
    out = tmp_path / "run"
    result = cli_runner.invoke(cli, ["execute", "mbs=1,gbs=1", "--model", TINY, "-o", str(out),
                                     "--lr-schedule", "wsd", "--decay-fraction", "abc"])
    assert result.exit_code == 2 and not out.exists(), result.output
    assert "'abc' is not a valid float" in _error_line(result)
