"""Plan files are checked against their schema: one line per problem, unknown keys refused, exit 2."""

import json

import pytest
from smplan.planner import Plan, PlanError
from smplan.planner.plan import parse_inline

from smplan.cli.main import cli

GOOD = {"model": "examples/gpt.py:tiny", "hw": "a100x8", "nodes": 1, "dp": 2, "tp": 1, "pp": 1,
        "micro_batch": 1, "global_batch": 4}


def test_good_plan_loads():
    assert Plan.from_dict(dict(GOOD)).dp == 2


@pytest.mark.parametrize("change, says", [
    ({"model": None}, "model"),
    ({"hw": 123}, "hw"),
    ({"dp": "2"}, "dp"),
    ({"overlap_dp": {}}, "overlap_dp"),
    ({"overlap_dp": "no"}, "overlap_dp"),
    ({"tp": 1.5}, "tp"),
    ({"dpp": 2}, "dpp"),
])
def test_bad_values_are_named(change, says):
    with pytest.raises(PlanError, match=says):
        Plan.from_dict({**GOOD, **change})


def test_missing_dp_is_an_error_not_a_default():
    data = dict(GOOD)
    del data["dp"]
    with pytest.raises(PlanError, match="dp"):
        Plan.from_dict(data)


def test_duplicate_inline_key():
    with pytest.raises(PlanError, match="twice"):
        parse_inline("tp=2,tp=4")


@pytest.mark.parametrize("change", [{"model": None}, {"hw": 123}, {"overlap_dp": "no"}, {"zz": 1}])
def test_simulate_of_a_bad_plan_file_is_exit_2_without_traceback(cli_runner, tmp_path, change):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**GOOD, **change}))
    result = cli_runner.invoke(cli, ["simulate", str(path)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)
