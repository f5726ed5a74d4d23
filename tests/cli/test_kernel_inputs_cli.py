"""Wrong inputs to the kernel-cost and stack keys end in one line and exit code 2: an unknown
attention kernel (--hw-set or a stack file), a hardware file's [gpu.attention] rate out of range,
a plan file naming a stack that does not exist (the plan file is left as it was)."""

import json

from smplan.hwprofiles.loader import PROFILE_DIR

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

GPT = f"{EXAMPLES / 'gpt.py'}:tiny"
INLINE = "dp=2,mbs=1,gbs=4"


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_unknown_attention_kernel_in_hw_set(cli_runner):
    line = _one_error_line(cli_runner.invoke(cli, ["simulate", GPT, "--hw", "a100x8", "--plan", INLINE,
                                                   "--hw-set", "efficiency.attention_kernel=flash9"]))
    assert "attention_kernel must be one of flash1, flash2, cudnn, got 'flash9'" in line


def test_unknown_attention_kernel_in_a_stack_file(cli_runner, tmp_path):
    stack = tmp_path / "fa9.toml"
    stack.write_text('host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\n'
                     'attention_kernel = "fa9"\n')
    line = _one_error_line(cli_runner.invoke(cli, ["plan", GPT, "--hw", "a100x8", "--stack", str(stack)]))
    assert "'attention_kernel' must be one of flash1, flash2, cudnn, got 'fa9'" in line


def test_attention_rate_out_of_range_in_a_hardware_file(cli_runner, tmp_path):
    hw = tmp_path / "hw.toml"
    hw.write_text((PROFILE_DIR / "l40sx8.toml").read_text() + "\n[gpu.attention]\nflash2 = 2\n")  # l40s states none
    line = _one_error_line(cli_runner.invoke(cli, ["simulate", GPT, "--hw", str(hw), "--plan", INLINE]))
    assert "gpu.attention.flash2 must be in (0, 1], got 2.0" in line


def test_plan_file_naming_an_unknown_stack(cli_runner, tmp_path):
    out = tmp_path / "plan.json"
    assert cli_runner.invoke(cli, ["plan", GPT, "--hw", "a100x8", "--top", "1", "-o", str(out)]).exit_code == 0
    data = json.loads(out.read_text())
    data["stack"] = "nope"
    out.write_text(json.dumps(data))
    before = out.read_text()
    line = _one_error_line(cli_runner.invoke(cli, ["simulate", str(out)]))
    assert "unknown stack 'nope'" in line and out.read_text() == before
