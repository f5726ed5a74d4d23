"""Cost model: closed forms, contract fields, monotonicity."""

import pytest
from smplan.hwprofiles import load_cluster
from smplan.planner import Plan, estimate, estimate_from_costs, even_stages, plan_costs
from smplan.planner.costs import PlanCosts, StageCosts

from tests.planner.gpt_profile_fixture import gpt_profile

PROF = gpt_profile(layers=8, hidden=1024, heads=16, seq=512, vocab=8192)


def _plan(**kw):
    base = dict(model="gpt", hw="a100x8", nodes=2, dp=2, tp=2, pp=4, micro_batch=1, global_batch=32)
    base.update(kw)
    chunks = base["pp"] * base.get("virtual_stages", 1)
    base.setdefault("stages", even_stages(8, chunks, base.pop("recompute", "none")))
    return Plan(**base)


def test_uniform_1f1b_closed_form():
    stages = tuple(StageCosts(forward_s=1.0, backward_s=2.0) for _ in range(4))
    costs = PlanCosts(stages=stages, num_microbatches=8, pp=4, tokens_per_step=1, samples_per_step=1)
    assert estimate_from_costs(costs).step_time_s == pytest.approx((8 + 4 - 1) * 3.0)


def test_interleaved_bubble_is_p_minus_1_over_v():
    p, v, m = 4, 2, 8
    stages = tuple(StageCosts(forward_s=0.5, backward_s=1.0) for _ in range(p * v))
    costs = PlanCosts(stages=stages, num_microbatches=m, pp=p, virtual_stages=v, schedule="interleaved",
                      tokens_per_step=1, samples_per_step=1)
    t_stage = v * 1.5
    assert estimate_from_costs(costs).step_time_s == pytest.approx((m + (p - 1) / v) * t_stage)


def test_exposed_dp_comm_and_optimizer():
    stages = (StageCosts(forward_s=1.0, backward_s=2.0, dp_comm_s=5.0, dp_overlappable=True, optimizer_s=0.5),)
    costs = PlanCosts(stages=stages, num_microbatches=4, pp=1, tokens_per_step=1, samples_per_step=1)
    assert estimate_from_costs(costs).step_time_s == pytest.approx(4 * 3.0 + (5.0 - 2.0) + 0.5)
    stages = (replace_overlap := StageCosts(forward_s=1.0, backward_s=2.0, dp_comm_s=5.0, dp_overlappable=False),)
    del replace_overlap
    costs = PlanCosts(stages=stages, num_microbatches=4, pp=1, tokens_per_step=1, samples_per_step=1)
    assert estimate_from_costs(costs).step_time_s == pytest.approx(4 * 3.0 + 5.0)


def test_plan_costs_fields_and_figures():
    cluster = load_cluster("a100x8", nodes=2)
    plan = _plan(recompute="full", sequence_parallel=True)
    costs = plan_costs(plan, PROF, cluster)
    assert len(costs.stages) == 4
    first, last = costs.stages[0], costs.stages[-1]
    assert last.send_bytes == 0 and first.send_bytes == pytest.approx(2 * 512 * 1024 / 2)  # 1/tp slice
    assert all(s.recompute_s > 0 and s.backward_s > s.recompute_s for s in costs.stages)
    assert first.forward_s > costs.stages[1].forward_s  # embedding on the first stage
    f = estimate(plan, PROF, cluster)
    assert f.step_time_s > 0 and 0 < f.mfu < 1 and f.hardware_tflops_per_gpu > f.model_tflops_per_gpu
    assert f.tokens_per_s == pytest.approx(32 * 512 / f.step_time_s)
    assert sum(f.breakdown.values()) == pytest.approx(f.step_time_s, rel=1e-6)


def test_recompute_trades_time_for_memory():
    cluster = load_cluster("a100x8", nodes=2)
    plain = estimate(_plan(), PROF, cluster)
    full = estimate(_plan(recompute="full"), PROF, cluster)
    sel = estimate(_plan(recompute="selective"), PROF, cluster)
    assert full.step_time_s > sel.step_time_s >= plain.step_time_s
    assert full.peak_memory_gib < sel.peak_memory_gib < plain.peak_memory_gib


def test_zero3_saves_memory_and_sp_saves_memory():
    cluster = load_cluster("a100x8", nodes=2)
    z0, z3 = estimate(_plan(zero=0, pp=1, dp=8), PROF, cluster), estimate(_plan(zero=3, pp=1, dp=8), PROF, cluster)
    assert z3.memory_breakdown_gib["weights"] < z0.memory_breakdown_gib["weights"]
    z0 = estimate(_plan(zero=0), PROF, cluster)
    sp = estimate(_plan(sequence_parallel=True), PROF, cluster)
    assert sp.memory_breakdown_gib["activations"] < z0.memory_breakdown_gib["activations"]


def test_host_overhead_floors_small_layers():
    tiny = gpt_profile(layers=4, hidden=64, heads=4, seq=32, vocab=128)
    slow = load_cluster("a100x8", nodes=1, overrides={"efficiency.host_overhead_us_per_layer": 1000.0})
    plan = Plan(model="t", hw="a100x8", nodes=1, dp=1, tp=1, pp=1, micro_batch=1, global_batch=1,
                stages=even_stages(4, 1))
    f = estimate(plan, tiny, slow)
    assert f.step_time_s >= 6 * 2 * 1e-3  # 6 parts, forward and backward, 1 ms each


def test_head_launches_hide_behind_gpu_bound_blocks():
    """The host runs ahead of GPU-bound blocks, so the last stage's head and loss cost their GPU
    time, not a layer's launch time; behind host-bound blocks they still wait for the host."""
    host_s = 2e-4
    plan = _plan(pp=2, dp=4, tp=2, micro_batch=8)
    fast = load_cluster("a100x8", nodes=2, overrides={"efficiency.host_overhead_us_per_layer": 0.0})
    slow = load_cluster("a100x8", nodes=2, overrides={"efficiency.host_overhead_us_per_layer": host_s * 1e6})
    small_head = gpt_profile(layers=8, hidden=1024, heads=16, seq=512, vocab=128)  # head: GPU time < host_s
    gpu = plan_costs(plan, small_head, fast).stages[-1]
    assert gpu.forward_s / 4 > 2 * host_s  # each block is GPU-bound at this host time
    with_host = plan_costs(plan, small_head, slow).stages[-1]
    assert with_host.forward_s == pytest.approx(gpu.forward_s)
    assert with_host.backward_s == pytest.approx(gpu.backward_s)
    tiny = gpt_profile(layers=8, hidden=64, heads=4, seq=32, vocab=128)  # host-bound blocks
    last = plan_costs(plan, tiny, slow).stages[-1]
    assert last.forward_s == pytest.approx(host_s * (4 + len(tiny.post)))


def test_plan_errors_name_the_fix():
    cluster = load_cluster("a100x8", nodes=1)
    with pytest.raises(ValueError, match="GPUs but the cluster has 8"):
        estimate(_plan(), PROF, cluster)


def test_full_recompute_under_zero3_gathers_parameters_once_per_backward():
    # FSDP / DeepSpeed gather a block once for its backward; the recomputed forward runs on
    # those parameters. Network-bound ZeRO-3 (a slow NIC) must therefore cost fwd + bwd
    # gathers + one reduce-scatter per micro-batch, the same with or without full recompute.
    from smplan.planner.cost_model import CostModel, MeshKey

    slow = load_cluster("a100x8", nodes=2, overrides={"inter_node.bandwidth_gbps": 0.05})
    cm = CostModel(PROF, slow)
    key = MeshKey(tp=1, dp=16, pp=1, v=1, micro_batch=1, num_microbatches=2, sp=False, zero=3,
                  overlap_dp=True, schedule="1f1b", dtype="bf16")
    passes = cm.pass_of(PROF.blocks[0], key)
    full, recompute_s, _ = passes.backward_with("full")
    assert recompute_s == pytest.approx(0.0, abs=1e-12)  # hidden under the gathers
    assert full == pytest.approx(passes.backward_s)
    links = {"inter_node.bandwidth_gbps": 1e6, "intra_node.bandwidth_gbps": 1e6}
    fast = CostModel(PROF, load_cluster("a100x8", nodes=2, overrides=links))
    passes = fast.pass_of(PROF.blocks[0], key)
    assert passes.backward_with("full")[1] == pytest.approx(passes.forward_s)  # compute-bound: a forward more


def test_elementwise_fusion_shortens_passes_by_the_fusible_traffic():
    from smplan.planner import profile_model
    from smplan.planner.cost_model import CostModel, MeshKey

    from tests.conftest import EXAMPLES

    prof = profile_model(str(EXAMPLES / "gpt.py"), {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 256}, cache=False)

    key = MeshKey(tp=1, dp=1, pp=1, v=1, micro_batch=1, num_microbatches=1, sp=False, zero=0,
                  overlap_dp=True, schedule="1f1b", dtype="bf16")
    block = prof.blocks[0]
    assert 0 < block.elementwise_fusible_bytes_per_sample < block.elementwise_bytes_per_sample
    times = {}
    for fusion in (0.0, 1.0):
        cl = load_cluster("a100x8", nodes=1, overrides={"efficiency.elementwise_fusion": fusion,
                                                         "efficiency.host_overhead_us_per_layer": 0})
        times[fusion] = CostModel(prof, cl).pass_of(block, key).forward_s
    saved_s = block.elementwise_fusible_bytes_per_sample / (cl.gpu.memory_bandwidth_gbps * 1e9 * cl.efficiency.memory_bound)
    assert times[0.0] - times[1.0] == pytest.approx(saved_s)


def test_fp32_gradient_reduce_doubles_the_gradient_bytes_not_the_parameter_gathers():
    """efficiency.grad_reduce_dtype = "fp32" (torchtitan's FSDP2 reduce_dtype): the DP all-reduce
    and the reduce-scatters carry 4 B per gradient, ZeRO's parameter all-gathers stay at 2 B."""
    from smplan.planner.cost_model import CostModel, MeshKey

    bf16 = load_cluster("a100x8", nodes=2, overrides={"inter_node.bandwidth_gbps": 0.05})
    fp32 = bf16.with_overrides({"efficiency.grad_reduce_dtype": "fp32"})
    for zero, ratio in ((0, 2.0), (1, 1.5)):  # all-reduce: g; distributed optimizer: g + w
        plan = _plan(nodes=2, dp=16, tp=1, pp=1, zero=zero, global_batch=32)
        low, high = plan_costs(plan, PROF, bf16).stages[0], plan_costs(plan, PROF, fp32).stages[0]
        assert high.dp_comm_bytes == pytest.approx(ratio * low.dp_comm_bytes)
        assert high.dp_comm_s > low.dp_comm_s
    key = MeshKey(tp=1, dp=16, pp=1, v=1, micro_batch=1, num_microbatches=2, sp=False, zero=3,
                  overlap_dp=True, schedule="1f1b", dtype="bf16")
    low, high = (CostModel(PROF, c).pass_of(PROF.blocks[0], key) for c in (bf16, fp32))
    assert high.forward_s == pytest.approx(low.forward_s)  # the forward's gather: parameters, bf16
    # network-bound backward: gather (2 B) + reduce-scatter (2 B -> 4 B) = 1.5x the bytes
    assert high.backward_s == pytest.approx(1.5 * low.backward_s, rel=0.02)


def test_zero2_and_zero3_under_pipelining_run_as_zero1():
    """torch.distributed.pipelining keeps FSDP2's gradients unsharded until the last backward and
    torchtitan its parameters gathered: with pp > 1, ZeRO-2/3 cost and hold what ZeRO-1 does, and
    the search offers only ZeRO-1 there."""
    from smplan.planner.feasibility import effective_zero

    cluster = load_cluster("a100x8", nodes=2)
    z1 = estimate(_plan(zero=1), PROF, cluster)
    for zero in (2, 3):
        other = estimate(_plan(zero=zero), PROF, cluster)
        assert other.step_time_s == z1.step_time_s and other.memory_breakdown_gib == z1.memory_breakdown_gib
    assert [effective_zero(z, 1) for z in range(4)] == [0, 1, 2, 3]
    assert [effective_zero(z, 2) for z in range(4)] == [0, 1, 1, 1]
    from smplan.planner.search_space import enumerate_candidates

    fixed = {"overlap_dp": True, "dtype": "bf16", "global_batch": 32}
    cands = list(enumerate_candidates(PROF, cluster, fixed, None))
    assert {c.zero for c in cands if c.pp > 1 and c.dp > 1} == {1}
    assert {c.zero for c in cands if c.pp == 1 and c.dp > 1} == {1, 2, 3}


def _launch_bound(host_us: float, **over):
    tiny = gpt_profile(layers=4, hidden=64, heads=4, seq=32, vocab=128)
    cluster = load_cluster("a100x8", nodes=1, overrides={"efficiency.host_overhead_us_per_layer": host_us, **over})
    plan = Plan(model="t", hw="a100x8", nodes=1, dp=1, tp=1, pp=1, micro_batch=1, global_batch=4,
                stages=even_stages(4, 1))
    return plan, tiny, cluster


def test_a_launch_bound_step_shows_its_wait_for_the_host_not_compute():
    """A tiny model at 1 ms per layer pass: the GPU idles most of each pass; the breakdown says
    so (`host_wait`) and a twice faster GPU changes the step by nothing but that split."""
    plan, tiny, slow = _launch_bound(1000.0)
    f = estimate(plan, tiny, slow)
    assert f.breakdown["host_wait"] > 0.9 * f.step_time_s > 0
    assert f.breakdown["compute"] >= 0 and sum(f.breakdown.values()) == pytest.approx(f.step_time_s)
    bare = estimate(plan, tiny, load_cluster("a100x8", nodes=1, overrides={"efficiency.host_overhead_us_per_layer": 0.0}))
    assert "host_wait" not in bare.breakdown  # nothing waits: the key is left out, as ep's are
    big = gpt_profile(layers=4, hidden=4096, heads=32, seq=2048, vocab=32000)  # ~16 ms per layer pass
    gpu_bound = Plan(model="b", hw="a100x8", nodes=1, dp=1, tp=1, pp=1, micro_batch=4, global_batch=8,
                     stages=even_stages(4, 1, "full"))
    assert "host_wait" not in estimate(gpu_bound, big, load_cluster("a100x8", nodes=1)).breakdown
    assert f.breakdown["compute"] == pytest.approx(bare.breakdown["compute"], rel=1e-9)
    _, _, faster = _launch_bound(1000.0, **{"gpu.peak_tflops.fp32": 2 * 19.5, "gpu.memory_bandwidth_gbps": 2 * 2039.0})
    g = estimate(plan, tiny, faster)
    # the step moves only by its optimizer, which does not wait for launches
    assert g.step_time_s == pytest.approx(f.step_time_s, rel=1e-3) and g.breakdown["host_wait"] > f.breakdown["host_wait"]


def test_recompute_in_a_launch_bound_pass():
    """Selective recompute runs inside backward, where the GPU waited for the host: the step
    stays and host_wait shrinks. Full recompute launches the forward's kernels again: that time,
    launches included, is its recompute, not counted twice."""
    plan, tiny, slow = _launch_bound(1000.0)
    f = estimate(plan, tiny, slow)
    for kind in ("selective", "full", "sac"):
        r = estimate(Plan(**{**plan.__dict__, "stages": even_stages(4, 1, kind)}), tiny, slow)
        assert sum(r.breakdown.values()) == pytest.approx(r.step_time_s)
        assert min(r.breakdown.values()) >= -1e-12, r.breakdown
        assert r.breakdown["host_wait"] <= f.breakdown["host_wait"] + 1e-12
        if kind == "full":
            assert r.breakdown["recompute"] == pytest.approx(r.step_time_s - f.step_time_s)
            # 4 micro-batches x 4 blocks, each forward launched again at 1 ms
            assert r.breakdown["recompute"] == pytest.approx(4 * 4 * 1e-3, rel=0.1)
        else:
            assert r.step_time_s == pytest.approx(f.step_time_s)


def test_fsdp_stacks_pay_a_collective_per_block_for_zero_1_and_2():
    """Megatron's distributed optimizer reduce-scatters and gathers in buckets (one latency per
    stage); FSDP shards each block on its own: zero_granularity="block" adds one collective's latency
    per block (ring: (n-1) alpha each way) and the same bytes. DDP (zero=0) stays bucketed."""
    from smplan.hwprofiles.perf import link_for
    from smplan.hwprofiles.topology import ParallelLayout

    bucket = load_cluster("a100x8", nodes=2, overrides={"efficiency.zero_granularity": "bucket"})
    block = load_cluster("a100x8", nodes=2, overrides={"efficiency.zero_granularity": "block"})
    span = ParallelLayout(pp=1, dp=16, tp=1, gpus_per_node=8).span("dp")
    alpha = link_for(span, bucket)[1]
    for zero, collectives in ((1, 2), (2, 1)):  # ZeRO-1: reduce-scatter + all-gather; ZeRO-2: the gather
        plan = _plan(tp=1, pp=1, dp=16, zero=zero, global_batch=16)
        stage = {c: plan_costs(plan, PROF, c).stages[0] for c in (bucket, block)}
        extra = stage[block].dp_comm_s - stage[bucket].dp_comm_s
        assert extra == pytest.approx(PROF.num_blocks * collectives * (span.size - 1) * alpha, rel=1e-6)
    plain = _plan(tp=1, pp=1, dp=16, zero=0, global_batch=16)  # DDP's buckets
    assert plan_costs(plain, PROF, block).stages[0].dp_comm_s == plan_costs(plain, PROF, bucket).stages[0].dp_comm_s
    # under tp the executor's plain DP is FSDP2's replicate per block: an all-reduce per block
    tp_span = ParallelLayout(pp=1, dp=8, tp=2, gpus_per_node=8).span("dp")
    replicated = _plan(tp=2, pp=1, dp=8, zero=0, global_batch=16)
    extra = (plan_costs(replicated, PROF, block).stages[0].dp_comm_s
             - plan_costs(replicated, PROF, bucket).stages[0].dp_comm_s)
    assert extra == pytest.approx(PROF.num_blocks * 2 * (tp_span.size - 1) * link_for(tp_span, bucket)[1], rel=1e-6)


def test_zero_0_is_searched_where_per_block_collectives_can_cost_more():
    from smplan.planner.search_space import enumerate_candidates, validate_constraints

    def zeros(cluster):
        fixed = validate_constraints(PROF, cluster, {"tp": 1, "pp": 1}, 16, None, None, "bf16")
        return {c.zero for c in enumerate_candidates(PROF, cluster, fixed, None)}

    assert zeros(load_cluster("a100x8")) == {1, 2, 3}  # bucketed: ZeRO-1 never costs more than DDP
    # FSDP shards gradients with the optimizer states or nothing: no ZeRO-1 to offer
    assert zeros(load_cluster("a100x8", stack="torchtitan")) == {0, 2, 3}
    assert zeros(load_cluster("a100x8", stack="pytorch-fsdp")) == {0, 2, 3}


def test_a_stage_recomputing_no_block_costs_as_none():
    """A stage the search gave a kind but no recomputed block is written `recompute: none` in
    the plan file: it is costed so too (no re-materialisation buffer), or `plan` printed more
    memory than `simulate PLAN.json` (44.2 vs 43.5 GiB, Llama-3-8B on 4 l40sx8 nodes). A device
    that recomputes in another chunk keeps the buffer on its first chunk."""
    from smplan.planner.plan import Stage

    cl = load_cluster("a100x8", nodes=2)
    def peak(stages, **kw):
        return estimate(_plan(stages=stages, **kw), PROF, cl).peak_memory_gib

    for kind in ("full", "sac"):
        zero = tuple(Stage(2 * i, 2 * i + 2, kind, 0) for i in range(4))
        none = tuple(Stage(2 * i, 2 * i + 2) for i in range(4))
        assert peak(zero) == pytest.approx(peak(none))
        # interleaved, v=2: device 0's first chunk recomputes nothing, its second chunk one block
        split = [Stage(i, i + 1, kind, 0) for i in range(8)]
        split[4] = Stage(4, 5, kind, 1)
        first = list(split)
        first[0], first[4] = Stage(0, 1, kind, 1), Stage(4, 5, kind, 0)  # the same, on the first chunk
        kw = dict(virtual_stages=2, schedule="interleaved")
        held = [plan_costs(_plan(stages=tuple(st), **kw), PROF, cl).stages[0].memory.buffers_bytes for st in (split, first)]
        assert held[0] == pytest.approx(held[1])  # the buffer, whichever chunk recomputes
        # ...and the block recomputed on the first chunk, which holds more micro-batches at the peak, saves more
        assert peak(tuple(first), **kw) < peak(tuple(split), **kw)
        buffers = [plan_costs(_plan(stages=st, **kw), PROF, cl).stages[0].memory.buffers_bytes
                   for st in (tuple(split), tuple(Stage(i, i + 1) for i in range(8)))]
        assert buffers[0] > buffers[1]  # device 0 holds the buffer on its first chunk
    # mixed kinds on one device (a hand-written plan): selective on its first chunk, full on its second
    mixed = [Stage(i, i + 1) for i in range(8)]
    mixed[0], mixed[4] = Stage(0, 1, "selective", 1), Stage(4, 5, "full", 1)
    swapped = list(mixed)
    swapped[0], swapped[4] = Stage(0, 1, "full", 1), Stage(4, 5, "selective", 1)
    kw = dict(virtual_stages=2, schedule="interleaved")
    held = [plan_costs(_plan(stages=tuple(st), **kw), PROF, cl).stages[0].memory.buffers_bytes for st in (mixed, swapped)]
    assert held[0] == pytest.approx(held[1]) and held[0] > 0


@pytest.mark.parametrize("stack,sp,divided", [("megatron-core", False, 1), ("megatron-core", True, 2),
                                              ("megatron-deepspeed", False, 2), ("torchtitan", False, 1)])
def test_a_stage_sends_its_whole_activation_unless_sp_or_the_stack_slices_it(stack, sp, divided):
    """Megatron-Core dropped 2021 Megatron-LM's scatter/gather (Narayanan et al. 2021, section 4.1):
    without sp each tp rank sends all of (s, b, h); the sends were / tp for every stack."""
    from smplan.hwprofiles.perf import p2p_time_s

    cluster = load_cluster("a100x8", nodes=2, stack=stack)
    first = plan_costs(_plan(sequence_parallel=sp), PROF, cluster).stages[0]
    whole = PROF.blocks[0].output_bytes_per_sample  # micro-batch 1
    assert first.send_s == pytest.approx(p2p_time_s(whole / divided, first.send_crosses_node, cluster))
