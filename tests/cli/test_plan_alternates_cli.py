"""A faster network never makes `plan` pick a slower plan: the search keeps each layout's
runner-up schedules (another v, ZeRO stage or recompute kind) near its best closed form, and
the ranking simulates them too (planner.search.ALTERNATE_SHARE)."""

from __future__ import annotations

import json

from smplan.hwprofiles import load_cluster
from smplan.planner import profile_model
from smplan.planner.search import ALTERNATE_SHARE, ALTERNATES_PER_MESH, MAX_ALTERNATES, search

from smplan.cli.main import cli

# A review's case: llama3_8b on two 4-GPU L40S nodes. At 50 GB/s the closed form put v=8, 6, 7, 5
# and 4 of dp=4 pp=2 within 0.5%, kept v=8 (4.66 s simulated), and the pick (4.65 s) was slower
# than the 25 GB/s pick (v=4) run on the faster network (4.55 s).
ARGS = ["plan", "examples/gpt.py:llama3_8b", "--hw", "l40sx8", "--hw-set", "gpus_per_node=4", "--nodes", "2",
        "--global-batch", "32", "--seq-len", "4096"]


def _plan(cli_runner, bandwidth_gbps: int, *extra: str) -> dict:
    result = cli_runner.invoke(cli, [*ARGS, "--hw-set", f"inter_node.bandwidth_gbps={bandwidth_gbps}", "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _pick(cli_runner, bandwidth_gbps: int, *extra: str) -> dict:
    return _plan(cli_runner, bandwidth_gbps, *extra)["plans"][0]


def test_a_faster_network_never_picks_a_slower_plan(cli_runner, tmp_path):
    slow_pick = tmp_path / "slow.json"
    _pick(cli_runner, 25, "-o", str(slow_pick))
    record = _plan(cli_runner, 50)
    fast = record["plans"][0]
    assert record["search"]["runner_ups_simulated"] > 0
    layouts = [tuple(p[k] for k in ("dp", "tp", "pp", "cp", "ep", "micro_batch")) for p in record["plans"]]
    assert len(layouts) == len(set(layouts))  # a layout's runner-ups never take a second row
    rerun = cli_runner.invoke(cli, ["simulate", str(slow_pick), "--hw-set", "inter_node.bandwidth_gbps=50", "--json"])
    assert rerun.exit_code == 0, rerun.output
    assert fast["step_time_s"] <= json.loads(rerun.stdout)["step_time_s"] * (1 + 1e-9)
    # and no slower than the layout and v the review found, which the search now hands over
    found = _pick(cli_runner, 50, "--fix", "dp=4,pp=2,v=4,mbs=1")
    assert fast["step_time_s"] <= found["step_time_s"] * (1 + 1e-9)


def test_the_search_hands_over_runner_ups_of_its_layouts_near_the_best():
    profile = profile_model("examples/gpt.py:llama3_8b", seq_len=4096)
    cluster = load_cluster("l40sx8", nodes=2, overrides={"gpus_per_node": 4, "inter_node.bandwidth_gbps": 50})
    assert not search(profile, cluster, global_batch=32, top=10).alternates  # only for a simulated ranking
    result = search(profile, cluster, global_batch=32, top=10, alternates=True)
    best = result.plans[0].predicted.step_time_s
    layouts = {(p.dp, p.tp, p.pp, p.cp, p.ep, p.micro_batch): p for p in result.plans}
    assert result.alternates and len(result.alternates) <= MAX_ALTERNATES
    per_layout: dict = {}
    for alt in result.alternates:
        layout = (alt.dp, alt.tp, alt.pp, alt.cp, alt.ep, alt.micro_batch)
        assert layout in layouts  # a runner-up of a layout the search returns...
        assert alt.replace(predicted=None) != layouts[layout].replace(predicted=None)  # ...not its best again
        assert layouts[layout].predicted.step_time_s <= alt.predicted.step_time_s <= best * (1 + ALTERNATE_SHARE)
        per_layout[layout] = per_layout.get(layout, 0) + 1
    assert max(per_layout.values()) <= ALTERNATES_PER_MESH
    # the review's v=4: the closed form now replays the schedule and puts it ahead of v=8 (it had it
    # 0.5% behind v=8, which simulated 2.3% slower); v=3 has come 0.2% ahead of it since each chunk's
    # blocks are counted at the device's peak (memory_model.block_flights), not spread evenly
    assert result.plans[0].pp == 2 and result.plans[0].virtual_stages in (3, 4)  # not v=8
