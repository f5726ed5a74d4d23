"""Choosing the calibration plans: diverse, valid for the model and the process count."""

import dataclasses

import pytest
from smplan.planner import PlanError, profile_model

from smplan.calibrate.plans import batch_problem, candidates, choose, meshes, parse_choice, to_plan

GPT = "examples/gpt.py:tiny"


@pytest.fixture(scope="module")
def profile():
    return profile_model(GPT, dtype="fp32")  # in the session's cache (tests/conftest.py)


def test_first_plan_is_pure_data_parallel_and_the_rest_differ(profile):
    chosen = choose(2, profile, 4)
    assert (chosen[0].dp, chosen[0].tp, chosen[0].pp, chosen[0].recompute) == (2, 1, 1, "none")
    assert len(set(chosen)) == 4
    assert {(c.dp, c.tp, c.pp) for c in chosen} == {(2, 1, 1), (1, 2, 1), (1, 1, 2)}
    assert {c.recompute for c in chosen} == {"none", "full"}  # selective only when asked (see plans.py)


def test_selective_when_asked(profile):
    chosen = choose(2, profile, 6, recompute=("none", "full", "selective"))
    assert "selective" in {c.recompute for c in chosen}


def test_every_candidate_is_a_valid_plan(profile):
    for c in candidates(4, profile, 8):
        plan = to_plan(c, profile, model=GPT, model_args={}, hw="local", global_batch=8, gpus_per_node=4, dtype="fp32")
        assert plan.world_size == 4 and plan.num_microbatches >= plan.pp


def test_no_tensor_parallelism_on_cpu_unless_asked(profile):
    """On CPU a tp plan runs at DTensor's dispatch speed, 7x its prediction (plans.CPU_TP_NOTE)."""
    chosen = choose(2, profile, 3, tensor_parallel=False)
    assert all(c.tp == 1 for c in chosen) and len(set(chosen)) == 3
    assert any(c.tp == 2 for c in choose(2, profile, 3))


def test_no_tensor_parallelism_without_a_tp_plan(profile):
    no_tp = dataclasses.replace(profile, has_tp_plan=False)
    assert all(tp == 1 for _, tp, _ in meshes(4, no_tp))


def test_no_dimension_the_model_cannot_run(profile):
    """A forward that does not skip another stage's layers (profile.unsupported["pp"]) gets no pp
    plan to calibrate on (it was chosen, and calibrate stopped at it); likewise tp."""
    no_pp = dataclasses.replace(profile, unsupported={"pp": "Net.forward does not skip ..."})
    assert {pp for _, _, pp in meshes(4, no_pp)} == {1} and any(tp > 1 for _, tp, _ in meshes(4, no_pp))
    no_tp = dataclasses.replace(profile, unsupported={"tp": "no plan"})
    assert {tp for _, tp, _ in meshes(4, no_tp)} == {1} and any(pp > 1 for _, _, pp in meshes(4, no_tp))


def test_too_many_plans_or_none_is_one_clear_error(profile):
    with pytest.raises(PlanError, match="--plans must be at least 1"):
        choose(2, profile, 0)
    with pytest.raises(PlanError, match="use --plans"):
        choose(2, profile, 1000)


def test_parse_choice_defaults():
    c = parse_choice("dp=2,mbs=4")
    assert (c.dp, c.tp, c.pp, c.micro_batch, c.recompute) == (2, 1, 1, 4, "none")


@pytest.mark.parametrize("text, named", [("dp=2,zero=1", "zero"), ("dp=1,tp=2,sp=1,schedule=interleaved", "sp, schedule"),
                                         ("pp=2,v=2", "v"), ("dp=2,gbs=16", "gbs")])
def test_plan_keys_a_calibration_cannot_honour_are_refused(text, named):
    with pytest.raises(PlanError) as err:
        parse_choice(text)
    message = str(err.value)
    assert f"does not take {named};" in message and "dp, tp, pp, mbs, recompute" in message


def test_a_batch_a_plan_cannot_take_names_global_batch_not_gbs():
    assert batch_problem(parse_choice("dp=2,mbs=4"), 8) is None
    odd = batch_problem(parse_choice("dp=2,mbs=3"), 8)
    assert odd.endswith("dp*mbs=6 does not divide the global batch 8; use --global-batch 6 or 12, or another mbs")
    assert "use --global-batch 4 or more" in batch_problem(parse_choice("pp=2,mbs=2"), 2)  # 1 micro-batch, 2 stages
    assert batch_problem(parse_choice("pp=2,mbs=2"), 4) is None


def test_supported_plan_keys_are_kept():
    c = parse_choice("dp=1,tp=2,pp=1,mbs=2,recompute=full")
    assert (c.dp, c.tp, c.pp, c.micro_batch, c.recompute) == (1, 2, 1, 2, "full")


def test_a_model_without_blocks_is_named_as_such_not_blamed_on_the_batch(profile):
    blockless = dataclasses.replace(profile, blocks=())
    with pytest.raises(PlanError, match="has no repeated blocks") as err:
        choose(2, blockless, 1, global_batch=8)
    assert "global batch" not in str(err.value)
