"""One pipeline feasibility rule for planner and executor; fixed keys the search honours
(v, mbs, --nodes with --max-nodes) and the messages when they cannot be met."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from smplan.executor import PlanMismatchError, validate_plan
from smplan.hwprofiles import load_cluster
from smplan.planner import NoFeasiblePlan, PlanError, load_model_file, plan_search, profile_model
from smplan.planner.feasibility import default_dtype, pipeline_fill_problem
from smplan.planner.plan import Plan, even_stages

from tests.conftest import EXAMPLES
from tests.planner.gpt_profile_fixture import gpt_profile

GPT = f"{EXAMPLES / 'gpt.py'}:tiny"
MLP = str(EXAMPLES / "mlp.py")
PROF = gpt_profile(layers=6, hidden=2048, heads=16, seq=1024, vocab=32000)


@pytest.mark.parametrize("ref", [GPT, MLP])
@pytest.mark.parametrize(("nodes", "max_nodes", "gbs", "fix"), [
    (1, None, None, None),
    (1, None, 1, None),
    (1, None, 2, None),
    (1, None, 8, "pp=2"),
    (1, None, 16, None),
    (1, None, 16, "pp=4"),
    (2, None, 32, None),
    (1, 2, 8, None),
    (1, None, 24, "schedule=interleaved"),
])
def test_every_plan_the_planner_offers_passes_the_executor(ref, nodes, max_nodes, gbs, fix):
    profile = profile_model(ref)
    cluster = load_cluster("a100x8", nodes=max_nodes or nodes)
    try:
        plans = plan_search(profile, cluster, global_batch=gbs, fix=fix, top=20, max_nodes=max_nodes)
    except NoFeasiblePlan as err:
        assert "\n" not in str(err)
        return
    model_file = load_model_file(ref)
    for plan in plans:
        validate_plan(plan, model_file, world_size=plan.world_size)  # raises PlanMismatchError otherwise
        assert pipeline_fill_problem(plan.pp, plan.schedule, plan.num_microbatches, plan.dp, plan.micro_batch) is None


def test_the_reported_case_offers_no_unfillable_pipeline():
    # gpt tiny on a100x8, global batch 8: the planner used to offer pp=2 with 1 micro-batch
    plans = plan_search(profile_model(GPT), load_cluster("a100x8"), global_batch=8, top=50)
    assert plans and all(p.num_microbatches >= p.pp for p in plans)


@settings(max_examples=400, deadline=None)  # pure arithmetic: cheap
@given(pp=st.integers(1, 8), dp=st.integers(1, 8), mbs=st.integers(1, 8), m=st.integers(1, 16),
       schedule=st.sampled_from(["1f1b", "gpipe", "interleaved"]))
def test_following_the_advice_works(pp, dp, mbs, m, schedule):
    problem = pipeline_fill_problem(pp, schedule, m, dp, mbs)
    if problem is None:
        return
    gbs_options = [int(g) for g in re.findall(r"gbs(?: >=|=| or) ?(\d+)", problem)]
    gbs_options += [int(g) for g in re.findall(r" or (\d+)", problem)]
    assert gbs_options, problem
    for gbs in gbs_options:
        assert gbs % (dp * mbs) == 0, problem
        assert pipeline_fill_problem(pp, schedule, gbs // (dp * mbs), dp, mbs) is None, (problem, gbs)
    smaller = re.search(r", mbs=(\d+)", problem)
    if smaller:
        b = int(smaller.group(1))
        assert pipeline_fill_problem(pp, schedule, m * mbs // b, dp, b) is None, problem


def test_executor_rejects_with_the_shared_rule_and_its_advice_works():
    model_file = load_model_file(GPT)

    def plan(gbs):
        return Plan(model=GPT, hw="a100x8", nodes=1, dp=4, pp=2, micro_batch=2, global_batch=gbs,
                    stages=even_stages(4, 2))

    with pytest.raises(PlanMismatchError) as info:
        validate_plan(plan(8), model_file)
    message = str(info.value)
    assert message == pipeline_fill_problem(2, "1f1b", 1, 4, 2)
    advised = int(re.search(r"gbs >= (\d+)", message).group(1))
    validate_plan(plan(advised), model_file)
    # and the planner, asked for that global batch, offers only runnable plans
    plans = plan_search(profile_model(GPT), load_cluster("a100x8"), global_batch=advised, top=50)
    for p in plans:
        validate_plan(p, model_file, world_size=p.world_size)


def test_fix_v_implies_interleaved():
    plans = plan_search(PROF, load_cluster("a100x8", nodes=2), global_batch=64, fix="v=3", top=5)
    assert plans and all(p.schedule == "interleaved" and p.virtual_stages == 3 for p in plans)
    plans = plan_search(PROF, load_cluster("a100x8", nodes=2), global_batch=64, fix="v=1", top=5)
    assert all(p.virtual_stages == 1 and p.schedule != "interleaved" for p in plans)


@pytest.mark.parametrize(("fix", "needle"), [
    ("v=2,schedule=1f1b", "v=2 needs schedule=interleaved, but schedule=1f1b is fixed"),
    ("v=2,schedule=gpipe", "v=2 needs schedule=interleaved"),
    ("v=4,pp=2", "pp*v=8 model chunks exceed the model's 6 blocks"),
    ("v=5", "v=5 needs pp*v <= the model's 6 blocks"),
    ("v=1,schedule=interleaved", "needs v >= 2"),
    ("mbs=3", "gbs=64 is not a multiple of mbs*dp for any dp (mbs=3"),
    ("mbs=3,pp=2", "choose mbs dividing gbs/dp"),
    ("pp=6,dp=1,tp=2", "must use all 16 GPUs"),
])
def test_fixed_keys_that_cannot_be_met_say_why(fix, needle):
    with pytest.raises(PlanError) as info:
        plan_search(PROF, load_cluster("a100x8", nodes=2), global_batch=64, fix=fix)
    assert needle in str(info.value) and "GiB" not in str(info.value)
    assert "\n" not in str(info.value)


def test_batch_message_advice_works():
    with pytest.raises(NoFeasiblePlan) as info:
        plan_search(PROF, load_cluster("a100x8"), global_batch=8, fix="mbs=3")
    advised = int(re.search(r"--global-batch (\d+)", str(info.value)).group(1))
    assert plan_search(PROF, load_cluster("a100x8"), global_batch=advised, fix="mbs=3", top=1)


def test_unfillable_fixed_pipeline_says_so():
    with pytest.raises(NoFeasiblePlan, match="micro-batches cannot fill 4 pipeline stages; use gbs >= 4 .* or a smaller pp$"):
        plan_search(PROF, load_cluster("a100x8"), global_batch=2, fix="pp=4")


def test_a_pipeline_the_gpu_count_forces_points_at_the_batch_not_at_pp():
    """No pp given: the cluster's size chose it (tp fixed, dp capped by the batch), so "a smaller
    pp" is not the user's to change; a larger global batch is."""
    with pytest.raises(NoFeasiblePlan, match="cannot fill 4 pipeline stages; use gbs >= 4 \\(a multiple of dp\\*mbs=1\\)$"):
        plan_search(PROF, load_cluster("a100x8"), global_batch=1, fix="tp=2")
    advised = plan_search(PROF, load_cluster("a100x8"), global_batch=4, fix="tp=2", top=1)  # the advice holds
    assert advised  # (at gbs=4 dp=4 fills the node: the search needs no pipeline then)


def test_min_nodes_is_the_low_end_of_max_nodes():
    cluster = load_cluster("a100x8", nodes=4)
    plans = plan_search(PROF, cluster, global_batch=64, max_nodes=4, min_nodes=3, top=10)
    assert plans and all(p.nodes >= 3 for p in plans)
    with pytest.raises(PlanError, match="--nodes 5 is more than --max-nodes 4"):
        plan_search(PROF, cluster, global_batch=64, max_nodes=4, min_nodes=5)


def test_default_dtype_follows_the_gpu():
    assert default_dtype(load_cluster("a100x8").gpu.peak_tflops) == "bf16"
    assert default_dtype(load_cluster("v100x8").gpu.peak_tflops) == "fp16"
    # a probed CPU has a bf16 peak, but execute and calibrate run fp32 there
    assert default_dtype(load_cluster("a100x8").gpu.peak_tflops, "cpu") == "fp32"
    no_half = load_cluster("v100x8", overrides={"gpu.peak_tflops.fp16": 0.0}).gpu.peak_tflops
    assert default_dtype(no_half) == "fp32"
