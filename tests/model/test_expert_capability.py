"""The ep capability rule (smplan.model.capabilities.expert_bank_problem): the planner offers
expert parallelism only for banks the executor can shard, and says why not otherwise."""

import json
from pathlib import Path

import torch
from smplan.hwprofiles import load_cluster
from smplan.planner import PlanError, profile_model
from smplan.planner.search_space import enumerate_candidates, validate_constraints
from torch import nn

from smplan.cli.main import cli
from smplan.model import expert_bank_problem, expert_banks

LISTED = str(Path(__file__).with_name("listed_experts.py"))
MOE = "examples/moe.py:tiny"


def _run(model, x):
    return model(x)


class KeyedBank(nn.Module):
    """Batched weights, but a Hugging Face-style forward: (tokens, expert ids), not one buffer."""

    def __init__(self):
        super().__init__()
        self.num_experts, self.top_k = 4, 2
        self.w = nn.Parameter(torch.empty(4, 8, 8, device="meta"))

    def forward(self, x, ids):
        return torch.bmm(x.unsqueeze(0).expand(4, -1, -1), self.w).sum(0)


class Keyed(nn.Module):
    def __init__(self):
        super().__init__()
        self.bank = KeyedBank()

    def forward(self, x):
        return self.bank(x, None)


def test_examples_moe_banks_can_be_split():
    from smplan.planner import load_model_file

    mf = load_model_file(MOE)
    meta = mf.build({}, device="meta")
    inputs, _ = mf.hook("batch")(2, model=meta)
    assert [name for name, _ in expert_banks(meta)] == [f"blocks.{i}.mlp.experts" for i in range(3)]
    assert expert_bank_problem(meta, inputs.to("meta"), _run) is None
    assert "ep" not in profile_model(MOE, cache=False).unsupported


def test_a_bank_whose_forward_takes_token_ids_is_refused():
    why = expert_bank_problem(Keyed(), torch.empty(3, 8, device="meta"), _run)
    assert why.startswith("expert bank bank's forward takes ([3, 8], NoneType) and returns [3, 8], not one "
                          "[num_experts=4, slots, hidden] buffer"), why


def test_a_model_without_banks_has_no_ep_problem():
    assert expert_bank_problem(nn.Linear(4, 4, device="meta"), torch.empty(2, 4, device="meta"), _run) is None


def test_the_planner_offers_no_ep_for_listed_experts_and_says_why(cli_runner):
    profile = profile_model(LISTED, cache=False)
    assert profile.num_experts == 2
    assert profile.unsupported["ep"].startswith("expert bank blocks.0.bank holds experts.0.weight of shape (8, 8)")
    cluster = load_cluster("h100x8", nodes=1)
    fixed = validate_constraints(profile, cluster, None, 8, None, None, "bf16")
    assert {c.ep for c in enumerate_candidates(profile, cluster, fixed, None)} == {1}
    try:
        validate_constraints(profile, cluster, {"ep": 2}, 8, None, None, "bf16")
        raise AssertionError("ep=2 was accepted")
    except PlanError as err:
        assert str(err).startswith("ep=2: expert bank blocks.0.bank holds")
    explained = cli_runner.invoke(cli, ["plan", LISTED, "--hw", "h100x8", "--nodes", "1", "--explain"])
    assert "ep not offered: expert bank blocks.0.bank" in explained.stdout, explained.output


def test_the_planner_offers_ep_for_examples_moe(cli_runner):
    result = cli_runner.invoke(cli, ["plan", MOE, "--hw", "h100x8", "--nodes", "1", "--top", "40", "--json"])
    assert result.exit_code == 0, result.output
    assert {p["ep"] for p in json.loads(result.stdout)["plans"]} > {1}


class _Router(nn.Linear):  # transformers 5's top-k routers: a Linear that states num_experts and top_k
    def __init__(self):
        super().__init__(8, 4, bias=False)
        self.num_experts, self.top_k = 4, 2


class _Experts(nn.Module):  # the bank beside it states num_experts only
    def __init__(self):
        super().__init__()
        self.num_experts = 4
        self.w = nn.Parameter(torch.empty(4, 8, 8))


class _MoeBlock(nn.Module):  # PhimoeSparseMoeBlock / Llama4TextMoe: the block states both as well
    def __init__(self):
        super().__init__()
        self.num_experts, self.top_k = 4, 2
        self.router, self.experts, self.shared = _Router(), _Experts(), nn.Linear(8, 8)


def test_the_bank_is_the_one_beside_its_router_not_the_block_around_them():
    from smplan.model import find_expert_banks

    banks = find_expert_banks(nn.ModuleDict({"moe": _MoeBlock()}))
    assert [(b.name, b.num_experts, b.top_k) for b in banks] == [("moe.experts", 4, 2)]
    assert len(banks[0].routers) == 1 and isinstance(banks[0].routers[0], _Router)  # listed once
