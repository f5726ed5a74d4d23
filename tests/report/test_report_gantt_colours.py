"""One colour means one thing in the what-if report's Gantt, its breakdown, and `smplan simulate --gantt`."""

from __future__ import annotations

import copy

from matplotlib.colors import to_hex
from smplan.simulator import GANTT_COLOURS, GANTT_LABELS

from smplan import report
from smplan.report.style import COLORS

from .chart_data import bars
from .synthetic import synthetic_record

# what-if task kind -> the simulator's event it comes from (smplan.whatif.details.EVENT_KINDS)
KIND_EVENT = {"forward": "F", "backward": "B", "recompute": "R", "send": "send-act", "dp_comm": "dp-reduce",
              "optimizer": "optimizer", "ep_comm": "ep-a2a", "cp_comm": "cp-comm"}


def _gantt_with_every_kind() -> dict:
    record = synthetic_record()
    tasks = record["details"]["gantt"]["tasks"]
    for i, kind in enumerate(("recompute", "send", "optimizer", "ep_comm", "cp_comm")):
        tasks.append({"stage": 0, "kind": kind, "microbatch": None, "start_s": 0.1 * i, "end_s": 0.1 * i + 0.05})
    return copy.deepcopy(record)


def test_each_gantt_kind_takes_the_simulators_colour_and_label():
    # purple was DP comm in `simulate --gantt` and the optimizer here; recompute was a light blue
    # beside forward's blue
    ax = report.draw_chart("gantt", _gantt_with_every_kind()).axes[0]
    drawn = bars(ax)
    assert set(drawn) == set(KIND_EVENT)
    for kind, event in KIND_EVENT.items():
        assert to_hex(drawn[kind].patches[0].get_facecolor()) == GANTT_COLOURS[event], kind
    labels = {c.patches[0].get_gid(): c.get_label() for c in ax.containers}
    for kind in ("forward", "backward", "recompute", "optimizer", "ep_comm", "cp_comm"):
        assert labels[kind] == GANTT_LABELS[KIND_EVENT[kind]]
    assert labels["dp_comm"].startswith("DP") and labels["send"].startswith("send")
    assert GANTT_COLOURS["R"] != GANTT_COLOURS["F"]


def test_the_breakdown_draws_what_the_gantt_draws_in_the_same_colour():
    shared = {"recompute": "R", "dp_comm_exposed": "dp-reduce", "pp_p2p": "send-act", "ep_all_to_all": "ep-a2a",
              "cp_comm_exposed": "cp-comm", "optimizer": "optimizer"}
    for kind, event in shared.items():
        assert COLORS[kind] == GANTT_COLOURS[event], kind
    others = {c for k, c in COLORS.items() if k not in shared and k not in ("dp_comm", "weights", "gradients",
                                                                              "activations", "buffers", "reserve")}
    assert not others & set(GANTT_COLOURS.values())  # TP comm, bubble...: no colour the Gantt gives another thing


def test_a_simulator_event_passed_on_by_its_own_name_keeps_its_colour_and_label():
    from smplan.report.detail import gantt_style

    assert gantt_style("send-grad") == (GANTT_COLOURS["send-grad"], GANTT_LABELS["send-grad"])
    assert gantt_style("something_new", 2)[1] == "something new"


def test_a_pass_waiting_for_its_collectives_is_hatched_as_simulate_draws_it():
    record = synthetic_record()
    record["details"]["gantt"]["tasks"].append(
        {"stage": 0, "kind": "zero-wait", "microbatch": None, "start_s": 0.1, "end_s": 0.2})
    drawn = bars(report.draw_chart("gantt", copy.deepcopy(record)).axes[0])
    patch = drawn["zero-wait"].patches[0]
    assert patch.get_hatch() == "////" and to_hex(patch.get_edgecolor()) == GANTT_COLOURS["zero-wait"]
    assert to_hex(patch.get_facecolor()) == "#ffffff"
    assert drawn["forward"].patches[0].get_hatch() is None  # the passes stay solid
