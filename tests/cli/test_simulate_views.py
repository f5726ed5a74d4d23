"""`smplan simulate`'s text, JSON and help agree with the simulation: the breakdown's rows, the
per-stage shares, and what --no-contention promises."""

import json

import pytest

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

MOE = str(EXAMPLES / "moe.py") + ":tiny"


def _breakdown_rows(output: str) -> dict[str, float]:
    rows = {}
    for line in output.split("breakdown (critical stage)")[1].splitlines()[3:]:
        if not line.strip() or line.startswith("note:"):
            return rows
        rows[line.split()[0]] = float(line.split()[1])
    return rows


@pytest.mark.parametrize("degrees,shown,left_out", [
    ("dp=4,ep=4,mbs=1,gbs=8", "ep_all_to_all", ("cp_comm_exposed", "pp_p2p", "tp_comm")),
    ("dp=2,cp=2,mbs=1,gbs=8", "cp_comm_exposed", ("ep_all_to_all", "pp_p2p", "tp_comm")),
])
def test_breakdown_text_leaves_out_rows_the_plan_cannot_have(cli_runner, degrees, shown, left_out):
    args = ["simulate", MOE, "--hw", "h100x8", "--plan", degrees]
    text = cli_runner.invoke(cli, args)
    assert text.exit_code == 0, text.output
    rows = _breakdown_rows(text.output)
    assert shown in rows and not set(left_out) & set(rows)
    data = json.loads(cli_runner.invoke(cli, [*args, "--json"]).output)
    assert {"ep_all_to_all", "cp_comm_exposed", "pp_p2p", "tp_comm"} <= set(data["breakdown"])  # JSON keys stay
    assert sum(rows.values()) == pytest.approx(data["step_time_s"], rel=1e-2)  # nothing that holds time left out


def test_per_stage_shares_count_exposed_collectives_as_waits_not_compute(cli_runner):
    """An ep plan's exposed all-to-alls are the table's comm wait, as in the breakdown."""
    args = ["simulate", MOE, "--hw", "h100x8", "--plan", "dp=4,ep=4,mbs=1,gbs=8", "--hw-set",
            "efficiency.ep_a2a_overlap=0"]
    data = json.loads(cli_runner.invoke(cli, [*args, "--json"]).output)
    row, step = data["stage_utilisation"][0], data["step_time_s"]
    assert data["breakdown"]["ep_all_to_all"] > 0
    assert row["comm_wait"] * step == pytest.approx(data["breakdown"]["ep_all_to_all"] + data["breakdown"]["cp_comm_exposed"])
    assert row["compute"] + row["comm_wait"] + row["optimizer"] + row["idle"] == pytest.approx(1.0)
    text = cli_runner.invoke(cli, args).output
    assert "comm wait" in text and f"{100 * row['comm_wait']:.1f}%" in text.split("per-stage time")[1]


def test_no_contention_help_says_where_it_equals_the_closed_form(cli_runner):
    result = cli_runner.invoke(cli, ["simulate", "--help"])
    flat = " ".join(result.output.split())
    assert "(equals the closed form)" not in flat
    assert "pp=1" in flat and "identical stages" in flat and "interleaved" in flat


def test_interleaved_overlapped_dp_reduces_each_chunk_after_its_own_last_backward():
    """Uniform interleaved chunks (p=4, v=2, m=8, t_f + t_b = 3.9 s per device) with 4 s of
    overlapped DP per device, 2 s per chunk: the pipeline is Narayanan et al. SC21's
    (m + (p-1)/v)(t_f + t_b) = 37.05 s; each chunk's reduction starts at its own last backward
    (Megatron-Core's grad_sync_func per chunk), so only the first chunk's sticks out, 2 - 1.3 s.
    The closed form counts the same (it overlapped all 4 s with one micro-batch's backward, 2.6 s:
    1.4 s exposed)."""
    from smplan.planner import estimate_from_costs
    from smplan.simulator import simulate_step

    from tests.simulator.helpers import cluster, layout, uniform_costs

    costs = uniform_costs("interleaved", 4, 8, 2, tf=1.3, tb=2.6, dp_s=4.0)
    off = simulate_step(costs, layout(4), cluster(), contention=False)
    assert off.step_time_s == pytest.approx((8 + 3 / 2) * 3.9 + 0.7)
    assert estimate_from_costs(costs).step_time_s == pytest.approx((8 + 3 / 2) * 3.9 + 0.7)
    same = simulate_step(uniform_costs("interleaved", 4, 8, 2, tf=1.3, tb=2.6, dp_s=4.0, overlap=False), layout(4),
                         cluster(), contention=False)
    assert same.step_time_s == pytest.approx(same.closed_form_step_time_s)  # not overlapped: equal
