"""Review findings on hardware and stack files given by hand: errors that say what to do,
`hw show` / `stack show` / `stack --help` that say what each key holds."""

import re

import click
import pytest
from smplan.hwprofiles.loader import PROFILE_DIR
from smplan.hwprofiles.stack import STACK_DIR

from smplan.cli.main import cli

TINY = "examples/gpt.py:tiny"


def _one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def _files(tmp_path):
    hw = tmp_path / "my_mi300x.toml"
    hw.write_text((PROFILE_DIR / "mi300xx8.toml").read_text())
    stack = tmp_path / "ours.toml"
    stack.write_text((STACK_DIR / "megatron-core.toml").read_text())
    return str(hw), str(stack)


def test_a_folder_given_as_a_stack_or_a_hardware_profile_is_called_a_folder(cli_runner, tmp_path):
    (tmp_path / "adir.toml").mkdir()
    for args in (["--hw", "mi300xx8", "--stack", str(tmp_path / "adir.toml")], ["--hw", str(tmp_path)],
                 ["--hw", "mi300xx8", "--stack", str(tmp_path)]):
        assert "is a folder; give the .toml file" in _one_line(cli_runner.invoke(cli, ["plan", TINY, *args]))


def test_swapped_files_say_which_option_takes_them(cli_runner, tmp_path):
    hw, stack = _files(tmp_path)
    line = _one_line(cli_runner.invoke(cli, ["plan", TINY, "--hw", stack]))
    assert "looks like a stack file" in line and "pass it with --stack" in line
    line = _one_line(cli_runner.invoke(cli, ["plan", TINY, "--hw", "h100x8", "--stack", hw]))
    assert "looks like a hardware file" in line and "pass it with --hw" in line


def test_a_misspelt_key_in_a_file_gets_did_you_mean(cli_runner, tmp_path):
    hw, stack = _files(tmp_path)
    bad = tmp_path / "typo.toml"
    bad.write_text(open(hw).read().replace("[inter_node]\nbandwidth_gbps", "[inter_node]\nbandwith_gbps"))
    line = _one_line(cli_runner.invoke(cli, ["plan", TINY, "--hw", str(bad)]))
    assert "(did you mean 'inter_node.bandwidth_gbps'?)" in line
    bad.write_text(open(stack).read().replace("tp_comm_overlap", "tp_comm_overlapp"))
    line = _one_line(cli_runner.invoke(cli, ["plan", TINY, "--hw", "h100x8", "--stack", str(bad)]))
    assert "(did you mean 'tp_comm_overlap'?)" in line


def test_a_missing_stack_key_names_the_command_that_shows_one(cli_runner, tmp_path):
    partial = tmp_path / "s_partial.toml"
    partial.write_text("host_overhead_us_per_layer = 1075.0\n")
    line = _one_line(cli_runner.invoke(cli, ["plan", TINY, "--hw", "h100x8", "--stack", str(partial)]))
    assert "`smplan stack show megatron-core`" in line and "hwprofiles/stacks" not in line
    assert cli_runner.invoke(cli, ["stack", "show", "megatron-core"]).exit_code == 0


def test_a_missing_hardware_file_names_another_hw(cli_runner, tmp_path):
    line = _one_line(cli_runner.invoke(cli, ["plan", TINY, "--hw", str(tmp_path / "gone.toml")]))
    assert "does not exist; check the path or give another --hw" in line


def test_stack_help_describes_every_key(cli_runner):
    from smplan.hwprofiles.stack import _KEYS

    text = cli_runner.invoke(cli, ["stack", "--help"]).output
    assert [key for key in _KEYS if key not in ("name", "description") and key not in text] == []


def test_stack_show_names_a_file_once_and_counts_as_whole_numbers(cli_runner, tmp_path):
    _, stack = _files(tmp_path)
    out = cli_runner.invoke(cli, ["stack", "show", stack]).output
    assert f"  from stack file {stack!r}\n" in out and "zero3_max_live_params = 0\n" in out


def test_hw_show_prints_the_fp8_matmul_ceiling_in_use(cli_runner):
    out = cli_runner.invoke(cli, ["hw", "show", "mi300xx8"]).output
    assert "matmul_ceiling.fp8 = 0.511 (not measured: bf16's figure)" in out


@pytest.mark.parametrize("name, warned", [("mi300xx8", True), ("l40sx8", True), ("h100x8", False)])
def test_the_uncalibrated_warning_is_the_same_for_a_bundled_profile_and_its_copy(tmp_path, name, warned):
    from smplan.hwprofiles import checked_on_its_gpu, uncalibrated_warning

    renamed = tmp_path / "mine.toml"
    renamed.write_text((PROFILE_DIR / f"{name}.toml").read_text().replace(f'name = "{name}"', 'name = "mine"'))
    assert (uncalibrated_warning(name) is not None) == warned == (not checked_on_its_gpu(name))
    # a file of one's own with the GPU table of a checked profile is as checked as it is
    assert (uncalibrated_warning(str(renamed)) is not None) == warned


def test_a_bundled_uncalibrated_profile_warns_and_hw_list_says_which(cli_runner, tmp_path, monkeypatch):
    def stop(*args, **kwargs):
        raise click.exceptions.Exit(0)  # the warnings come before the sweep (as before plan's search)

    monkeypatch.setattr("smplan.whatif.run_whatif", stop)
    result = cli_runner.invoke(cli, ["whatif", TINY, "--hw", "mi300xx8", "-o", str(tmp_path / "r")])
    assert result.exit_code == 0 and "warning: mi300xx8 has never been calibrated" in result.stderr, result.output
    listed = {line.split()[0]: line.split()[-1] for line in cli_runner.invoke(cli, ["hw", "list"]).output.splitlines()
              if line[:1].isalnum()}
    assert listed["mi300xx8"] == "no" and listed["h100x8"] == "yes"


def test_docs_hardware_names_every_key():
    from pathlib import Path

    from smplan.hwprofiles import settable_keys
    from smplan.hwprofiles.stack import _KEYS

    text = (Path(__file__).parents[2] / "docs" / "HARDWARE.md").read_text()

    def named(key: str) -> bool:  # `intra_node.fabric`, or `gpu.peak_tflops.{bf16,fp16}`
        prefix, _, leaf = key.rpartition(".")
        return f"`{key}`" in text or re.search(re.escape(f"`{prefix}.{{") + r"[^}]*\b" + leaf + r"\b", text)

    hw = [k for k in settable_keys() if not k.startswith("efficiency.") and not named(k)]
    assert hw == [] and [k for k in _KEYS if f"`{k}`" not in text] == []
    assert "docs/HARDWARE.md" in (Path(__file__).parents[2] / "README.md").read_text()
