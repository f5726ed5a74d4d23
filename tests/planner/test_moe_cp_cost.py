"""Cost and memory model of expert parallelism, context parallelism, capacity factor and FP8."""

import pytest
from smplan.hwprofiles import load_cluster
from smplan.hwprofiles.perf import collective_time_s, expert_dispatch_time_s, ring_p2p_time_s
from smplan.hwprofiles.topology import strided_span
from smplan.planner import profile_model
from smplan.planner.cost_model import CostModel, estimate, mesh_key, plan_costs
from smplan.planner.memory_model import state_bytes_per_param
from smplan.planner.plan import plan_from_inline

MOE = "examples/moe.py:mixtral_8x7b"
# The 4-layer test model's MoE blocks are bound by the stack's MoE-layer host time at these
# micro-batches; tests that compare GPU work turn it off.
GPU_BOUND = {"efficiency.host_overhead_us_per_moe_layer": 0.0}
GPT = "examples/gpt.py:llama3_8b"


@pytest.fixture(scope="module")
def moe():
    return profile_model(MOE, args={"layers": 4, "experts": 16}, seq_len=1024)


def _plan(text, profile, nodes=1, seq_len=None):
    return plan_from_inline(text, model=profile.model, hw="h100x8", nodes=nodes, gpus_per_node=8,
                            num_blocks=profile.num_blocks, seq_len=seq_len)


def test_expert_states_are_divided_by_ep_and_sharded_over_edp(moe):
    cl = load_cluster("h100x8", nodes=1)
    block = moe.blocks[0]
    w, g, o = state_bytes_per_param("bf16")
    one = plan_costs(_plan("dp=8,pp=1,mbs=1,gbs=8", moe), moe, cl).stages[0].memory
    ep = plan_costs(_plan("dp=8,pp=1,ep=8,mbs=1,gbs=8", moe), moe, cl).stages[0].memory
    # every MoE block holds 7/8 of its experts fewer
    blocks = moe.num_blocks
    assert one.weights_bytes - ep.weights_bytes == pytest.approx(blocks * block.params_expert * 7 / 8 * w)
    z1 = plan_costs(_plan("dp=8,pp=1,ep=4,mbs=1,gbs=8,zero=1", moe), moe, cl).stages[0].memory
    z0 = plan_costs(_plan("dp=8,pp=1,ep=4,mbs=1,gbs=8,zero=0", moe), moe, cl).stages[0].memory
    # ZeRO-1 shards the expert optimizer states over edp = 8/4 = 2, the dense ones over dp = 8
    dense = sum(p.params_per_gpu(1) for p in moe.parts) - blocks * block.params_expert
    expected = dense * o * (1 - 1 / 8) + blocks * block.params_expert / 4 * o * (1 - 1 / 2)
    assert z0.optimizer_bytes - z1.optimizer_bytes == pytest.approx(expected)


def test_all_to_all_is_four_per_moe_block_over_the_ep_span(moe):
    cl = load_cluster("h100x8", nodes=2, overrides={"efficiency.ep_a2a_overlap": 0.0})  # every all-to-all waits
    plan = _plan("dp=16,ep=16,mbs=1,gbs=16", moe, nodes=2)
    costs = plan_costs(plan, moe, cl).stages[0]
    block = moe.blocks[0]
    span = strided_span(16, 1, 8)
    assert span.crosses_nodes and costs.ep_crosses_node
    one = collective_time_s("all_to_all", block.all_to_all_bytes_per_sample, span, cl)
    assert costs.ep_comm_forward_s == pytest.approx(2 * one * moe.num_blocks)
    assert costs.ep_comm_backward_s == pytest.approx(2 * one * moe.num_blocks)
    inside = plan_costs(_plan("dp=16,ep=8,mbs=1,gbs=16", moe, nodes=2), moe, cl).stages[0]
    assert not inside.ep_crosses_node and inside.ep_comm_forward_s < costs.ep_comm_forward_s
    fig = estimate(plan, moe, cl)
    assert fig.breakdown["ep_all_to_all"] > 0 and sum(fig.breakdown.values()) == pytest.approx(fig.step_time_s)


def test_a_node_dedup_dispatcher_sends_fewer_bytes_across_nodes(moe):
    """efficiency.ep_dispatcher = node_dedup (DeepEP / HybridEP) times each block's dispatch and
    combine with expert_dispatch_time_s; inside a node it changes nothing."""
    off = {"efficiency.ep_a2a_overlap": 0.0}
    plain = load_cluster("h100x8", nodes=2, overrides=off)
    dedup = load_cluster("h100x8", nodes=2, overrides={**off, "efficiency.ep_dispatcher": "node_dedup"})
    plan = _plan("dp=16,ep=16,mbs=1,gbs=16", moe, nodes=2)
    block, span = moe.blocks[0], strided_span(16, 1, 8)
    one = expert_dispatch_time_s(block.all_to_all_bytes_per_sample, span, dedup, block.top_k, block.num_experts)
    costs = plan_costs(plan, moe, dedup).stages[0]
    assert costs.ep_comm_forward_s == pytest.approx(2 * one * moe.num_blocks)
    assert costs.ep_comm_forward_s < plan_costs(plan, moe, plain).stages[0].ep_comm_forward_s
    inside = _plan("dp=16,ep=8,mbs=1,gbs=16", moe, nodes=2)
    assert plan_costs(inside, moe, dedup).stages[0].ep_comm_forward_s == pytest.approx(
        plan_costs(inside, moe, plain).stages[0].ep_comm_forward_s)


def test_a2a_overlap_hides_the_all_to_alls_up_to_the_paired_compute(moe):
    """Megatron-Core's EP A2A overlap: a forward/backward pair takes max(compute, all-to-all)."""
    from smplan.planner.pass_model import pass_times

    block, span, tp = moe.blocks[0], strided_span(16, 1, 8), strided_span(1, 1, 8)
    times = {o: pass_times(block, tp, False, 1, load_cluster("h100x8", nodes=2, overrides={
        "efficiency.ep_a2a_overlap": o, "efficiency.host_overhead_us_per_layer": 0.0,
        "efficiency.host_overhead_us_per_moe_layer": 0.0}), "bf16", ep_span=span)
        for o in (0.0, 0.5, 1.0)}
    raw = times[0.0].ep_forward_s + times[0.0].ep_backward_s
    compute = times[0.0].forward_s + times[0.0].backward_s - raw
    assert raw > 0 and compute > 0
    for o in (0.5, 1.0):
        t = times[o]
        exposed = t.ep_forward_s + t.ep_backward_s
        assert exposed == pytest.approx(raw - min(o * raw, compute), rel=1e-6, abs=1e-12)
        assert t.forward_s + t.backward_s == pytest.approx(compute + exposed, rel=1e-6)  # the rest is unchanged
        # what stays exposed is split as the two passes' all-to-alls are
        assert t.ep_forward_s * times[0.0].ep_backward_s == pytest.approx(t.ep_backward_s * times[0.0].ep_forward_s)
    plan = _plan("dp=16,ep=16,mbs=1,gbs=64", moe, nodes=2)  # 4 micro-batches: each has a partner
    # without host time: this small model's MoE blocks are bound by their launches, which the
    # overlap cannot shorten (test_a_host_bound_moe_block_gains_nothing_from_the_overlap)
    no_host = {"efficiency.host_overhead_us_per_layer": 0.0, "efficiency.host_overhead_us_per_moe_layer": 0.0}
    steps = [estimate(plan, moe, load_cluster("h100x8", nodes=2, overrides={"efficiency.ep_a2a_overlap": o, **no_host}))
             .step_time_s for o in (0.0, 0.5, 1.0)]
    assert steps[0] > steps[1] >= steps[2]


def test_full_recompute_gives_back_the_hidden_all_to_alls_once(moe):
    """Full recompute turns the EP A2A overlap off: a block's forward, recomputed forward and
    backward take what they take without it, also where ZeRO-3's gathers set the forward."""
    from smplan.planner.pass_model import pass_times

    block, span, tp = moe.blocks[0], strided_span(16, 1, 8), strided_span(1, 1, 8)
    no_host = {"efficiency.host_overhead_us_per_layer": 0.0, "efficiency.host_overhead_us_per_moe_layer": 0.0}
    for gather_s in (0.0, 1.0):  # the forward's ZeRO-3 all-gather: none, or longer than the pass
        totals = []
        for o in (0.0, 1.0):
            cl = load_cluster("h100x8", nodes=2, overrides={"efficiency.ep_a2a_overlap": o, **no_host})
            t = pass_times(block, tp, False, 1, cl, "bf16", (gather_s, 0.0, True), ep_span=span)
            totals.append(t.forward_s + t.backward_s + t.full_extra_s)
        assert totals[1] == pytest.approx(totals[0], rel=1e-9)


def test_a_host_bound_moe_block_gains_nothing_from_the_overlap(moe):
    """A routed-expert block pays the stack's MoE host time on top of a dense layer's; a pass the
    host sets takes that long whether or not its all-to-alls hide (pass = max(GPU, host))."""
    from smplan.planner.pass_model import host_launch_s, pass_times

    block, span, tp = moe.blocks[0], strided_span(16, 1, 8), strided_span(1, 1, 8)
    slow_host = {"efficiency.host_overhead_us_per_layer": 1000.0, "efficiency.host_overhead_us_per_moe_layer": 1e6}
    cl = load_cluster("h100x8", nodes=2, overrides={"efficiency.ep_a2a_overlap": 1.0, **slow_host})
    assert host_launch_s(cl, block) == pytest.approx(1.001)  # (1000 + 1e6) us
    assert host_launch_s(cl, moe.pre[0]) == host_launch_s(cl) == pytest.approx(1e-3)  # dense parts: the layer's only
    t = pass_times(block, tp, False, 1, cl, "bf16", ep_span=span)
    assert t.forward_s == t.backward_s == pytest.approx(1.001)
    off = pass_times(block, tp, False, 1, load_cluster("h100x8", nodes=2, overrides={
        "efficiency.ep_a2a_overlap": 0.0, **slow_host}), "bf16", ep_span=span)
    assert off.forward_s == t.forward_s
    assert load_cluster("h100x8").efficiency.host_overhead_us_per_moe_layer > 0  # megatron-core states it
    assert load_cluster("h100x8", stack="torchtitan").efficiency.host_overhead_us_per_moe_layer == 0


def test_a2a_overlap_needs_a_partner_micro_batch_and_no_full_recompute(moe):
    """Megatron-Core's config checks: the overlap needs a second micro-batch, the interleaved
    schedule when there are pipeline stages, and no full recompute."""
    # no host launch time: the embedding's and head's launches hide behind the blocks' slack,
    # which the overlap changes, and host-bound blocks hide nothing; this test is about the blocks
    no_host = {"efficiency.host_overhead_us_per_layer": 0.0, "efficiency.host_overhead_us_per_moe_layer": 0.0}
    on = load_cluster("h100x8", nodes=2, overrides={"efficiency.ep_a2a_overlap": 1.0, **no_host})
    off = load_cluster("h100x8", nodes=2, overrides={"efficiency.ep_a2a_overlap": 0.0, **no_host})

    def ep_s(text, cl):
        st = plan_costs(_plan(text, moe, nodes=2), moe, cl).stages[0]
        return st.ep_comm_forward_s + st.ep_comm_backward_s

    assert ep_s("dp=16,ep=16,mbs=1,gbs=64", on) < ep_s("dp=16,ep=16,mbs=1,gbs=64", off)
    for text in ("dp=16,ep=16,mbs=1,gbs=16",  # one micro-batch
                 "dp=8,pp=2,ep=8,mbs=1,gbs=64"):  # pipeline stages without the interleaved schedule
        assert ep_s(text, on) == pytest.approx(ep_s(text, off))
    inter = "dp=8,pp=2,ep=8,mbs=1,gbs=64,schedule=interleaved,v=2"
    assert ep_s(inter, on) < ep_s(inter, off)
    # full recompute gives back what the overlap hid: its blocks take as long as without it
    full_on = plan_costs(_plan("dp=16,ep=16,mbs=1,gbs=64,recompute=full", moe, nodes=2), moe, on).stages[0]
    full_off = plan_costs(_plan("dp=16,ep=16,mbs=1,gbs=64,recompute=full", moe, nodes=2), moe, off).stages[0]
    assert full_on.forward_s + full_on.backward_s == pytest.approx(full_off.forward_s + full_off.backward_s)


def test_only_passes_with_a_partner_hide_their_all_to_alls(moe):
    """The first forward (no pipeline) and a pipeline's warm-up and cool-down passes have no
    other micro-batch's backward beside them; a step that is all warm-up hides nothing."""
    from smplan.planner.cost_model import a2a_paired_share

    assert a2a_paired_share(1, 1, 1) == 0.0 and a2a_paired_share(1, 1, 4) == 0.75
    assert a2a_paired_share(2, 1, 64) == 0.0  # plain 1F1B: Megatron-Core refuses the overlap
    # pp=4, v=8: the first stage warms up with (4-1)*2 + (8-1)*4 + 1 = 35 forwards (the overlap's +1)
    assert a2a_paired_share(4, 8, 4) == 0.0  # 32 passes, all warm-up
    assert a2a_paired_share(4, 8, 8) == pytest.approx((64 - 35) / 64)
    assert a2a_paired_share(4, 2, 1000) == pytest.approx(1 - 11 / 2000)
    no_host = {"efficiency.host_overhead_us_per_layer": 0.0, "efficiency.host_overhead_us_per_moe_layer": 0.0}
    on = load_cluster("h100x8", nodes=2, overrides={"efficiency.ep_a2a_overlap": 1.0, **no_host})
    off = load_cluster("h100x8", nodes=2, overrides={"efficiency.ep_a2a_overlap": 0.0, **no_host})

    def step(text, cl):
        return estimate(_plan(text, moe, nodes=2), moe, cl).step_time_s

    # pp=2, v=2, 2 micro-batches: 4 passes, a warm-up of (2-1)*2 + (2-1)*2 + 1 = 5
    warm = "dp=8,pp=2,ep=8,mbs=1,gbs=16,schedule=interleaved,v=2"
    assert step(warm, on) == pytest.approx(step(warm, off))
    steady = "dp=8,pp=2,ep=8,mbs=1,gbs=256,schedule=interleaved,v=2"
    assert step(steady, on) < step(steady, off)


def test_megatron_core_stack_overlaps_the_all_to_alls_and_fsdp_stacks_do_not():
    assert load_cluster("h100x8").efficiency.ep_a2a_overlap == 1.0
    for stack in ("torchtitan", "pytorch-fsdp", "megatron-deepspeed"):
        assert load_cluster("h100x8", stack=stack).efficiency.ep_a2a_overlap == 0.0


def test_capacity_factor_scales_expert_work(moe):
    cl = load_cluster("h100x8", nodes=1, overrides={"efficiency.ep_a2a_overlap": 0.0, **GPU_BOUND})
    base = plan_costs(_plan("dp=8,ep=8,mbs=1,gbs=8", moe), moe, cl).stages[0]
    busy = plan_costs(_plan("dp=8,ep=8,mbs=1,gbs=8,cf=2", moe), moe, cl).stages[0]
    span, block = strided_span(8, 1, 8), moe.blocks[0]
    expected = 2 * moe.num_blocks * collective_time_s("all_to_all", 2 * block.all_to_all_bytes_per_sample, span, cl)
    assert busy.ep_comm_forward_s == pytest.approx(expected) and busy.ep_comm_forward_s > base.ep_comm_forward_s
    assert busy.forward_s - busy.ep_comm_forward_s > base.forward_s - base.ep_comm_forward_s


def test_ep_splits_expert_compute_it_no_longer_replicates(moe):
    cl = load_cluster("h100x8", nodes=1, overrides=GPU_BOUND)
    rep = estimate(_plan("tp=8,dp=1,mbs=1,gbs=8", moe), moe, cl)
    split = estimate(_plan("tp=8,dp=1,ep=8,mbs=1,gbs=8", moe), moe, cl)
    assert split.breakdown["compute"] < rep.breakdown["compute"]
    assert split.peak_memory_gib < rep.peak_memory_gib


def test_context_parallel_divides_activations_and_adds_kv_traffic():
    prof = profile_model(GPT, args={"layers": 4}, seq_len=16384)
    cl = load_cluster("h100x8", nodes=1)
    one = plan_costs(_plan("tp=4,dp=2,mbs=1,gbs=2", prof), prof, cl).stages[0]
    two = plan_costs(_plan("tp=4,cp=2,dp=1,mbs=1,gbs=1", prof), prof, cl).stages[0]
    assert two.memory.activations_bytes == pytest.approx(one.memory.activations_bytes / 2, rel=1e-6)
    assert two.forward_s < one.forward_s  # half the tokens per GPU
    assert not two.cp_crosses_node
    # ring overlap: the exposed K/V all-gather is at most the collective's time
    span = strided_span(2, 4, 8)
    kv = prof.blocks[0].attention_kv_bytes_per_sample / 4
    assert 0 <= two.cp_comm_forward_s <= prof.num_blocks * collective_time_s("all_gather", kv, span, cl) + 1e-12


def test_cp_exposes_kv_traffic_when_attention_is_short():
    prof = profile_model(GPT, args={"layers": 2}, seq_len=8192)
    cl = load_cluster("h100x8", nodes=2, overrides=["inter_node.bandwidth_gbps=1"])
    costs = plan_costs(_plan("tp=1,cp=16,dp=1,mbs=1,gbs=1", prof, nodes=2), prof, cl).stages[0]
    assert costs.cp_crosses_node and costs.cp_comm_forward_s > 0


def test_a_cp_ring_across_nodes_waits_on_one_nic_a_step():
    """Transformer Engine's p2p ring (the megatron-core stack's cp_comm) sends each step to the next rank: cp=32 over 4 nodes of
    8 was priced as NCCL's all-gather over a node's 8 NICs (1.7 ms for 537 MB), hidden under
    attention, and tied with cp=8 inside a node; each step waits on one NIC at a node boundary."""
    cl = load_cluster("h100x8", nodes=4)
    kv = 537e6
    inside, one_per_node, across = strided_span(8, 1, 8), strided_span(4, 8, 8), strided_span(32, 1, 8)
    assert ring_p2p_time_s(kv, inside, cl) == pytest.approx(collective_time_s("all_gather", kv, inside, cl))
    assert ring_p2p_time_s(kv, one_per_node, cl) == pytest.approx(collective_time_s("all_gather", kv, one_per_node, cl))
    assert ring_p2p_time_s(kv, across, cl) > 5 * collective_time_s("all_gather", kv, across, cl)
    prof = profile_model(GPT, args={"layers": 2}, seq_len=32768)
    in_node, spread = _plan("cp=8,dp=4,mbs=1,gbs=32", prof, nodes=4), _plan("cp=32,dp=1,mbs=4,gbs=32", prof, nodes=4)
    ring = plan_costs(spread, prof, cl).stages[0]
    assert ring.cp_crosses_node and not plan_costs(in_node, prof, cl).stages[0].cp_crosses_node
    assert ring.cp_comm_backward_s > ring.cp_comm_forward_s > 0  # backward: K/V and their gradients
    assert estimate(spread, prof, cl).step_time_s > 1.5 * estimate(in_node, prof, cl).step_time_s
    # torchtitan (and smplan execute) all-gather K/V over NCCL's rings: that price, not the ring's
    titan = load_cluster("h100x8", nodes=4, stack="torchtitan")
    assert titan.efficiency.cp_comm == "all_gather" and cl.efficiency.cp_comm == "p2p"
    gathered = plan_costs(spread, prof, titan).stages[0]
    assert gathered.cp_comm_forward_s < ring.cp_comm_forward_s and gathered.cp_comm_backward_s < ring.cp_comm_backward_s


def test_cp_attention_runs_as_one_kernel_call_per_ring_step():
    """A cp rank's attention is cp kernel calls of s/cp queries against s/2cp keys (causal load
    balancing): at 16k tokens over cp=8, rows of 1k keys, not the whole sequence's 8k, so the
    rank's share of the attention takes longer than 1/cp of the cp=1 time (FlashAttention-2's
    rate by row length, hwprofiles.perf.ATTENTION_HALF_KEYS)."""
    from smplan.hwprofiles.perf import flash_attention_time_s

    cl = load_cluster("h100x8")
    s, d, heads = 16384, 128, 32
    whole = flash_attention_time_s(s, s, d, heads, True, cl)
    per_rank = flash_attention_time_s(s // 8, s, d, heads, True, cl, keys_per_call=s / 16)
    assert per_rank > whole / 8 * 1.05
    assert flash_attention_time_s(s // 8, s, d, heads, True, cl) == pytest.approx(whole / 8)  # the old price


def test_fp8_runs_linears_at_the_fp8_peak_and_keeps_fp8_weight_copies(moe):
    cl = load_cluster("h100x8", nodes=1, overrides=GPU_BOUND)
    bf = plan_costs(_plan("dp=8,ep=8,mbs=2,gbs=16", moe), moe, cl).stages[0]
    f8 = plan_costs(_plan("dp=8,ep=8,mbs=2,gbs=16,dtype=fp8", moe), moe, cl).stages[0]
    assert f8.forward_s < bf.forward_s
    extra = f8.memory.weights_bytes - bf.memory.weights_bytes
    local = bf.memory.weights_bytes / state_bytes_per_param("bf16")[0]
    # the embedding and the output head stay bf16: no FP8 copy of theirs
    blocks = local - sum(p.params_per_gpu(1) for p in moe.parts if p.kind != "block")
    assert 0 < blocks < local
    # H100's FP8 GEMMs take only the TN layout: TE caches the weight and its transpose, 1 B/param each,
    # + amax histories
    assert blocks * 2.0 <= extra <= blocks * 2.0 + 10 * 2**20


def test_mesh_key_carries_the_new_degrees(moe):
    key = mesh_key(_plan("dp=4,cp=2,ep=8,mbs=1,gbs=4,cf=1.5", moe))
    assert (key.ep, key.cp, key.capacity_factor) == (8, 2, 1.5)
    assert CostModel(moe, load_cluster("h100x8", nodes=1, overrides={"efficiency.ep_a2a_overlap": 0.0})).pass_of(moe.blocks[0], key).ep_forward_s > 0


def test_expert_activations_grow_with_capacity_and_split_over_tp_under_ep(moe):
    cl = load_cluster("h100x8", nodes=1)
    block = moe.blocks[0]
    assert 0 < block.saved_bytes_expert_per_sample < block.saved_bytes_replicated_per_sample

    def act(text):
        return plan_costs(_plan(text, moe), moe, cl).stages[0].memory.activations_bytes

    expert = moe.num_blocks * block.saved_bytes_expert_per_sample  # one micro-batch in flight (pp=1)
    assert act("dp=8,ep=8,mbs=1,gbs=8,cf=1.5") - act("dp=8,ep=8,mbs=1,gbs=8") == pytest.approx(0.5 * expert)
    # tp=2 without sp: experts replicated at ep=1, their tokens split over tp under ep=2
    assert act("tp=2,dp=4,mbs=1,gbs=4") - act("tp=2,dp=4,ep=2,mbs=1,gbs=4") == pytest.approx(0.5 * expert)


def test_an_ep_plans_breakdown_keeps_its_keys_when_little_stays_exposed(moe):
    """Scripts read breakdown["ep_all_to_all"] of any ep plan: however little the overlap left
    (a 0 for cp here), never a missing key; a dense plan has neither key."""
    from smplan.simulator import simulate_plan

    cl = load_cluster("h100x8", nodes=2, overrides={"efficiency.ep_a2a_overlap": 1.0})
    plan = _plan("dp=16,ep=2,mbs=1,gbs=64", moe, nodes=2)
    closed = estimate(plan, moe, cl).breakdown
    assert 0.0 < closed["ep_all_to_all"] < 0.3 * closed["compute"] and closed["cp_comm_exposed"] == 0.0
    assert {"ep_all_to_all", "cp_comm_exposed"} <= simulate_plan(plan, moe, cl).figures.breakdown.keys()
    dense = _plan("dp=16,mbs=1,gbs=64", moe, nodes=2)
    assert "ep_all_to_all" not in estimate(dense, moe, cl).breakdown


def test_the_step_timeline_shows_the_exposed_all_to_alls(moe):
    """With contention on, a pass's exposed all-to-alls run on the ep group's links after its
    compute; the trace and Gantt chart draw them (lane "send"), as long as the breakdown says."""
    from smplan.simulator import simulate_plan

    cl = load_cluster("h100x8", nodes=2, overrides={"efficiency.ep_a2a_overlap": 0.0})
    plan = _plan("dp=16,ep=16,mbs=1,gbs=32", moe, nodes=2)
    for contention in (True, False):  # off: each at its cost-model time, at the end of its pass
        result = simulate_plan(plan, moe, cl, contention)
        a2a = [e for e in result.events if e.name == "ep-a2a"]
        assert a2a and {e.lane for e in a2a} == {"send"}
        exposed = result.figures.breakdown["ep_all_to_all"]
        assert sum(e.end - e.start for e in a2a) == pytest.approx(exposed, rel=1e-6)
    assert result.step_time_s == pytest.approx(estimate(plan, moe, cl).step_time_s, rel=1e-9)


def test_a_device_recomputing_its_blocks_recomputes_the_dense_layers_before_them():
    """DeepSeek-V3's published layout (PP16, EP64, ZeRO-1, 2048 GPUs) did not fit: its three dense
    layers kept all their activations for 16 micro-batches (an audit's finding)."""
    from smplan.planner import Plan, even_stages
    from smplan.planner.memory_model import in_flight, part_saved_bytes

    profile = profile_model("examples/moe.py:tiny")
    dense = next(p for p in profile.pre if p.name == "dense")
    cluster = load_cluster("h100x8", nodes=1)

    stages = {kind: even_stages(profile.num_blocks, 2, kind) for kind in ("none", "full")}

    def first_stage(recompute):
        plan = Plan(model="examples/moe.py:tiny", hw="h100x8", nodes=1, dp=4, pp=2, micro_batch=1, global_batch=8,
                    stages=stages[recompute])
        return plan_costs(plan, profile, cluster).stages[0]

    kept, full = first_stage("none"), first_stage("full")
    held = in_flight("1f1b", 2, 1, 2, 0)
    def frees(part):
        fused = cluster.efficiency.elementwise_fusion  # what the stack's fused kernels keep, as the memory model
        return held * (part_saved_bytes(part, 1, False, fusion=fused) - part_saved_bytes(part, 1, False, "full"))

    freed, blocks = frees(dense), stages["full"][0].num_blocks * frees(profile.blocks[0])
    assert kept.memory.activations_bytes - full.memory.activations_bytes == pytest.approx(freed + blocks, rel=1e-6)
    assert full.recompute_s > 0 and full.backward_s > kept.backward_s
    # the hardware FLOPs count the dense layer's re-run forward too (a review's finding)
    cm = CostModel(profile, cluster)

    def hardware(recompute):
        plan = Plan(model="examples/moe.py:tiny", hw="h100x8", nodes=1, dp=4, pp=2, micro_batch=1, global_batch=8,
                    stages=stages[recompute])
        return cm.plan_costs(plan).hardware_flops_per_step

    key = mesh_key(Plan(model="m", hw="h100x8", nodes=1, dp=4, pp=2, micro_batch=1, global_batch=8,
                        stages=stages["full"]))
    rerun = profile.num_blocks * cm.pass_of(profile.blocks[0], key).recompute_flops["full"] \
        + cm.pass_of(dense, key).recompute_flops["full"]
    assert hardware("full") - hardware("none") == pytest.approx(8 * rerun, rel=1e-9)
