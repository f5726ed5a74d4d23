"""Plan keys ep, cp, capacity_factor and dtype=fp8: parsing, schema, checks, round trip."""

import json

import pytest
from smplan.hwprofiles import load_cluster
from smplan.planner import Plan, PlanError, profile_model
from smplan.planner.cost_model import check_plan
from smplan.planner.plan import parse_inline, plan_from_inline

BASE = {"model": "examples/moe.py:tiny", "hw": "h100x8", "nodes": 1, "dp": 2, "tp": 2, "pp": 1,
        "micro_batch": 1, "global_batch": 4}


def test_world_size_counts_cp_and_edp_folds():
    plan = Plan(**{**BASE, "ep": 4, "cp": 2})
    assert plan.world_size == 8
    assert plan.edp == 2  # ep x edp = tp x cp x dp = 8


def test_round_trip_keeps_the_new_keys():
    plan = Plan(**{**BASE, "ep": 2, "cp": 2, "dtype": "fp8", "capacity_factor": 1.25})
    again = Plan.from_dict(json.loads(plan.to_json()))
    assert again == plan and again.version == 2


def test_version_1_files_still_read_with_defaults():
    plan = Plan.from_dict({**BASE, "version": 1})
    assert (plan.ep, plan.cp, plan.capacity_factor) == (1, 1, 1.0)


def test_inline_keys():
    keys = parse_inline("ep=4,cp=2,cf=1.5,dtype=fp8")
    assert keys == {"ep": 4, "cp": 2, "capacity_factor": 1.5, "dtype": "fp8"}
    plan = plan_from_inline("tp=2,cp=2,ep=4", model="m", hw="h100x8", nodes=1, gpus_per_node=8, num_blocks=3)
    assert plan.dp == 2 and plan.world_size == 8


@pytest.mark.parametrize("change, says", [
    ({"ep": 3}, "ep=3 must divide tp\\*cp\\*dp=4"),
    ({"ep": 0}, "ep"),
    ({"cp": "2"}, "cp"),
    ({"capacity_factor": 0}, "capacity_factor"),
    ({"capacity_factor": True}, "capacity_factor"),
    ({"dtype": "fp4"}, "dtype"),
])
def test_bad_values_are_one_line(change, says):
    with pytest.raises(PlanError, match=says) as err:
        Plan.from_dict({**BASE, **change})
    assert "\n" not in str(err.value)


def test_schema_lists_each_problem():
    with pytest.raises(PlanError) as err:
        Plan.from_dict({**BASE, "ep": -1, "cp": 1.5})
    assert "ep: got -1" in str(err.value) and "cp: got 1.5" in str(err.value)


def _check(model, seq_len=None, **keys):
    profile = profile_model(model, seq_len=seq_len)
    cluster = load_cluster(keys.pop("hw", "h100x8"), nodes=1)
    plan = Plan(model=model, hw=cluster.name, nodes=1, **{"dp": 2, "tp": 1, "micro_batch": 1, "global_batch": 4, **keys})
    check_plan(plan, profile, cluster)


def test_ep_on_a_dense_model_says_why():
    with pytest.raises(PlanError, match="needs routed experts, but the model has none"):
        _check("examples/gpt.py:tiny", ep=2)


def test_ep_must_divide_the_experts():
    _check("examples/moe.py:tiny", ep=2, dp=4, global_batch=8)  # 4 experts
    with pytest.raises(PlanError, match="does not divide the model's 4 experts"):
        _check("examples/moe.py:tiny", ep=8, dp=8, global_batch=8)


def test_cp_needs_two_cp_dividing_seq_len():
    _check("examples/moe.py:tiny", cp=2)  # seq_len 16
    with pytest.raises(PlanError, match="2\\*cp=8"):
        _check("examples/moe.py:tiny", seq_len=12, cp=4, dp=1, global_batch=1)


def test_fp8_needs_an_fp8_peak():
    _check("examples/moe.py:tiny", dtype="fp8")
    with pytest.raises(PlanError, match="dtype=fp8 needs FP8 tensor cores.*use dtype=bf16 or a GPU with FP8"):
        _check("examples/moe.py:tiny", dtype="fp8", hw="a100x8")


def test_fp8_on_a_probed_cpu_names_its_own_dtype(cli_runner, probed):
    """A probed CPU plans in fp32: its fp8 refusal said "use dtype=bf16" (a review)."""
    from smplan.cli.main import cli

    result = cli_runner.invoke(cli, ["plan", "examples/gpt.py:tiny", "--hw", str(probed), "--dtype", "fp8"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert errors == [result.output.strip().splitlines()[-1]] and "no gpu.peak_tflops.fp8; use dtype=fp32" in errors[0]
