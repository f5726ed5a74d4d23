"""fp8_scaling=block (MXFP8: a scale per 32 elements) next to per-tensor FP8: plan key, schema,
cast traffic, weight copies, the CLI's one-line errors."""

import json

import pytest
from smplan.hwprofiles import load_cluster
from smplan.planner import Plan, PlanError, estimate, plan_costs, profile_model
from smplan.planner.memory_model import (
    FP8_BLOCK_WEIGHT_BYTES_PER_PARAM,
    FP8_WEIGHT_COPY_BYTES_PER_PARAM,
)
from smplan.planner.pass_model import FP8_BLOCK_SCALE_BYTES_PER_ELEMENT
from smplan.planner.plan import plan_from_inline

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

B200 = load_cluster("b200x8")
PROF = profile_model(f"{EXAMPLES / 'gpt.py'}:llama3_8b", args={"layers": 2}, seq_len=2048)


def _plan(text):
    return plan_from_inline(text, model=PROF.model, hw="b200x8", nodes=1, gpus_per_node=8, num_blocks=PROF.num_blocks)


def test_block_scaling_costs_its_scales_and_two_weight_copies():
    tensor, block = _plan("dp=8,dtype=fp8,mbs=8,gbs=64"), _plan("dp=8,dtype=fp8,fp8_scaling=block,mbs=8,gbs=64")
    a, b = plan_costs(tensor, PROF, B200).stages[0], plan_costs(block, PROF, B200).stages[0]
    assert b.forward_s > a.forward_s and b.backward_s > a.backward_s  # the scales' HBM traffic
    assert (b.forward_s - a.forward_s) / a.forward_s < FP8_BLOCK_SCALE_BYTES_PER_ELEMENT  # a few per mille
    block_params = PROF.blocks[0].params * PROF.num_blocks
    extra = b.memory.weights_bytes - a.memory.weights_bytes
    # the row-wise and column-wise copies with their scales, less per-tensor's one copy and amax histories
    assert extra < block_params * (FP8_BLOCK_WEIGHT_BYTES_PER_PARAM - FP8_WEIGHT_COPY_BYTES_PER_PARAM)
    assert extra > 0.9 * block_params * (FP8_BLOCK_WEIGHT_BYTES_PER_PARAM - FP8_WEIGHT_COPY_BYTES_PER_PARAM)


def test_block_scaling_needs_fp8_and_a_known_value():
    with pytest.raises(PlanError, match="fp8_scaling=block scales FP8 tensors; it needs dtype=fp8"):
        _plan("dp=8,fp8_scaling=block")
    with pytest.raises(PlanError, match="fp8_scaling must be one of tensor, block"):
        _plan("dp=8,dtype=fp8,fp8_scaling=mx")


def test_plan_files_keep_the_scaling_and_old_files_read_as_per_tensor(tmp_path):
    block = _plan("dp=8,dtype=fp8,fp8_scaling=block,mbs=8,gbs=64")
    path = tmp_path / "plan.json"
    block.save(path)
    assert Plan.load(path).fp8_scaling == "block"
    data = json.loads(path.read_text())
    del data["fp8_scaling"]
    path.write_text(json.dumps(data))
    assert Plan.load(path).fp8_scaling == "tensor"
    data["fp8_scaling"] = "blocks"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="fp8_scaling"):
        Plan.load(path)
    assert estimate(block, PROF, B200).step_time_s > estimate(_plan("dp=8,dtype=fp8,mbs=8,gbs=64"), PROF, B200).step_time_s


@pytest.mark.parametrize("inline, expected", [
    ("dp=8,mbs=1,gbs=8,fp8_scaling=block", "fp8_scaling=block scales FP8 tensors; it needs dtype=fp8"),
    ("dp=8,mbs=1,gbs=8,dtype=fp8,fp8_scaling=32", "fp8_scaling must be one of tensor, block"),
])
def test_the_cli_refuses_a_wrong_scaling_in_one_line(cli_runner, inline, expected):
    result = cli_runner.invoke(cli, ["simulate", f"{EXAMPLES / 'gpt.py'}:tiny", "--hw", "b200x8", "--plan", inline])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.output


def test_plan_fix_block_scaling_reports_it(cli_runner):
    result = cli_runner.invoke(cli, ["plan", f"{EXAMPLES / 'gpt.py'}:tiny", "--hw", "b200x8", "--dtype", "fp8",
                                     "--fix", "fp8_scaling=block", "--json", "--top", "1"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["plans"][0]["fp8_scaling"] == "block"


def test_block_scaling_needs_tensor_cores_that_take_it(cli_runner):
    """MXFP8 runs on Blackwell's tensor cores (gpu.block_scaled_fp8); on an H100 it is refused in
    one line by plan and simulate, and --hw-set can state the capability."""
    assert load_cluster("h100x8").gpu.block_scaled_fp8 is False
    assert all(load_cluster(hw).gpu.block_scaled_fp8 for hw in ("b200x8", "b300x8", "gb200nvl72", "gb300nvl72"))
    tiny = f"{EXAMPLES / 'gpt.py'}:tiny"
    for args in (["simulate", tiny, "--hw", "h100x8", "--plan", "dp=8,mbs=1,gbs=8,dtype=fp8,fp8_scaling=block"],
                 ["plan", tiny, "--hw", "h100x8", "--dtype", "fp8", "--fix", "fp8_scaling=block"]):
        result = cli_runner.invoke(cli, args)
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and "needs tensor cores that take block-scaled FP8" in lines[0], result.output
    stated = cli_runner.invoke(cli, ["simulate", tiny, "--hw", "h100x8", "--hw-set", "gpu.block_scaled_fp8=true",
                                     "--plan", "dp=8,mbs=1,gbs=8,dtype=fp8,fp8_scaling=block", "--json"])
    assert stated.exit_code == 0, stated.output
    bad = cli_runner.invoke(cli, ["simulate", tiny, "--hw", "h100x8", "--hw-set", "gpu.block_scaled_fp8=2",
                                  "--plan", "dp=8,mbs=1,gbs=8"])
    assert bad.exit_code == 2 and "must be true or false" in bad.output


def test_whatif_varies_the_scaling_and_its_report_replays_it():
    from smplan.whatif.grid import VaryError, _value
    from smplan.whatif.point import plan_inline, plan_label

    assert _value("fp8_scaling", "plan", "block") == "block" and _value("dtype", "plan", "fp8") == "fp8"
    with pytest.raises(VaryError, match="one of tensor, block"):
        _value("fp8_scaling", "plan", "mx")
    block = _plan("dp=8,dtype=fp8,fp8_scaling=block,mbs=8,gbs=64")
    assert "dtype=fp8" in plan_inline(block) and "fp8_scaling=block" in plan_inline(block)
    assert "mxfp8" in plan_label(block)


@pytest.mark.parametrize("change, expected", [
    ({"fp8_scaling": "blocks"}, "fp8_scaling"),
    ({"dtype": "bf16"}, "fp8_scaling=block scales FP8 tensors; it needs dtype=fp8"),
])
def test_a_plan_file_with_a_wrong_scaling_is_one_line_and_kept(cli_runner, tmp_path, change, expected):
    plan = plan_from_inline("dp=8,mbs=1,gbs=8,dtype=fp8,fp8_scaling=block", model=f"{EXAMPLES / 'gpt.py'}:tiny",
                            hw="b200x8", nodes=1, gpus_per_node=8, num_blocks=2)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(dict(plan.to_dict(), **change)))
    before = path.read_text()
    result = cli_runner.invoke(cli, ["simulate", str(path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.output
    assert path.read_text() == before
