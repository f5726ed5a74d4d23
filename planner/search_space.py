"""The candidates plan_search enumerates around the ILP, and the checks of --fix values."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from smplan.hwprofiles import Cluster

from .feasibility import (
    capacity_factor_problem,
    context_parallel_problem,
    expert_grid_problem,
    expert_parallel_problem,
    fp8_problem,
    fp8_scaling_problem,
    fsdp_zero1_problem,
    pipeline_fill_problem,
    sp_unsupported,
    zero_with_pp_problem,
)
from .grad_compress import parse as parse_grad_compress
from .grad_compress import problem as grad_compress_problem
from .model_profile import ModelProfile
from .plan import (
    COUNT_FIELDS,
    DTYPES,
    PlanError,
    count_problem,
    field_problem,
    parse_inline,
)

MAX_MICRO_BATCH = 64  # a search bound (chosen): 64 x even 2K tokens is 128K GEMM rows, far past where efficiency stops growing
# A search bound, not a limit of the schedule (a fixed v may be larger): interleaving's gain, the
# bubble (p-1)/(v*m), shrinks as 1/v while the p2p sends grow with v (Narayanan et al. 2021,
# section 2.2); Megatron-Bridge's published recipes use vp <= 8 in 253 of the 273 rows that state
# one (validation folder, megatron_bridge_perf_summary.csv).
MAX_VIRTUAL_STAGES = 8
# Context parallelism is offered from this sequence length on (or when fixed): Megatron-Core's
# and NeMo's long-context recipes start CP at 8K-16K tokens (NeMo "Context Parallelism" docs;
# Llama 3 adds CP only in its long-context stage, Dubey et al. 2024, section 3.3.2).
CP_MIN_SEQ_LEN = 8192


@dataclass(frozen=True)
class Candidate:
    world: int
    tp: int
    pp: int
    dp: int
    mbs: int
    m: int
    schedule: str
    v: int
    sp: bool
    zero: int
    kind: str  # recomputation kind the ILP may apply per block ("none": never)
    recompute_all: bool  # a fixed recompute=...: every block recomputes
    overlap_dp: bool
    dtype: str
    ep: int = 1
    cp: int = 1
    capacity_factor: float = 1.0
    grad_compress: str = "none"  # only as fixed (--fix grad_compress=...): compression changes convergence
    fp8_scaling: str = "tensor"  # only as fixed (--fix fp8_scaling=block): the recipe is the user's

    @property
    def mesh(self) -> tuple:
        return (self.world, self.dp, self.tp, self.pp, self.mbs, self.cp, self.ep)

    def describe(self) -> str:
        sched = self.schedule + (f" v={self.v}" if self.v > 1 else "")
        extra = (f" ep={self.ep}" if self.ep > 1 else "") + (f" cp={self.cp}" if self.cp > 1 else "")
        extra += f" grad_compress={self.grad_compress}" if self.grad_compress != "none" else ""
        extra += f" fp8_scaling={self.fp8_scaling}" if self.fp8_scaling != "tensor" else ""
        return (
            f"dp={self.dp} tp={self.tp} pp={self.pp}{extra} mbs={self.mbs} {sched} zero={self.zero} "
            f"sp={int(self.sp)} recompute={self.kind}"
        )


def _divisors(n: int) -> list[int]:
    """Ascending; in sqrt(n) steps (a global batch of 10^12 is a typo that must not hang the search)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def tp_domain_gpus(cluster: Cluster) -> int:
    """The GPUs a tensor-parallel group may span: one node, or inside an NVLink domain
    larger than a node (NVL72) the largest power of two dividing it (72 -> 8), as
    Megatron-Core's GB200 recipes keep tp a power of two <= 8 (Megatron-Bridge perf summary)."""
    domain = cluster.fast_domain_gpus
    if domain == cluster.gpus_per_node:
        return domain
    return domain & -domain


def check_fix_syntax(fix, dtype: str | None = None) -> dict:
    """What --fix gets wrong without the model (its syntax, a grad_compress value, a dtype
    other than --dtype's), refused before the model is profiled, so the error is the only line
    the user sees. Returns the fixed keys."""
    fixed = parse_inline(fix) if isinstance(fix, str) else (fix or {})
    if dtype is not None and fixed.get("dtype", dtype) != dtype:
        raise PlanError(f"--dtype {dtype} contradicts --fix dtype={fixed['dtype']}; give one")
    if "stages" in fixed:
        raise PlanError("--fix stages= is not a search constraint: the planner chooses the stage split; to price "
                        'a split of your own, run smplan simulate MODEL --plan "...,stages=B:R/B:R/..."')
    if "grad_compress" in fixed:
        spec = str(parse_grad_compress(fixed["grad_compress"]))
        if spec.startswith("powersgd") and (fixed.get("tp", 1) > 1 or fixed.get("pp", 1) > 1):
            raise PlanError(f"grad_compress={spec} runs as torch DDP's comm hook, which smplan execute "
                            "applies without tp or pp; drop tp/pp or use grad_compress=bf16")
    return fixed


def validate_constraints(
    profile: ModelProfile,
    cluster: Cluster,
    fix,
    global_batch: int | None,
    max_nodes: int | None,
    overlap_dp: bool | None,
    dtype: str | None,
    min_nodes: int | None = None,
) -> dict:
    """Fixed plan fields, checked against the model and the cluster (errors name the fix)."""
    fixed = dict(parse_inline(fix) if isinstance(fix, str) else (fix or {}))
    if min_nodes is not None and max_nodes is not None and min_nodes > max_nodes:
        raise PlanError(f"--nodes {min_nodes} is more than --max-nodes {max_nodes}; --nodes is the fewest nodes "
                        f"to search, so give --nodes <= {max_nodes} or a larger --max-nodes")
    if global_batch is not None:
        if "global_batch" in fixed and fixed["global_batch"] != global_batch:
            raise PlanError(f"--global-batch {global_batch} contradicts --fix gbs={fixed['global_batch']}; give one")
        fixed["global_batch"] = global_batch
    if overlap_dp is not None:
        fixed.setdefault("overlap_dp", overlap_dp)
    if dtype is not None:
        fixed.setdefault("dtype", dtype)
    fixed.setdefault("dtype", profile.dtype if profile.dtype in DTYPES else "bf16")
    fixed.setdefault("overlap_dp", True)
    gpn = cluster.gpus_per_node
    world = (max_nodes or cluster.nodes) * gpn
    nodes_flag = "--max-nodes" if max_nodes else "--nodes"  # a hint names the option the user searched with
    fixed.setdefault("global_batch", world)
    L, heads = profile.num_blocks, profile.num_heads
    problem = (count_problem({k: v for k, v in fixed.items() if k in COUNT_FIELDS})
               or expert_parallel_problem(fixed.get("ep", 1), profile.num_experts)
               or context_parallel_problem(fixed.get("cp", 1), profile.seq_len)
               or capacity_factor_problem(fixed.get("capacity_factor", 1.0))
               or fp8_problem(fixed["dtype"], cluster.gpu.peak_tflops.fp8, repr(cluster.name), cluster.gpu.name))
    if problem:
        raise PlanError(problem)
    # what the model offers first: a hint on a degree's size must not lead into that refusal
    problem = profile.degree_problem(**{k: fixed.get(k) for k in ("tp", "pp", "cp", "ep")})
    if problem:
        raise PlanError(problem)
    if fixed.get("capacity_factor", 1.0) != 1.0 and profile.num_experts <= 1:  # it would change nothing
        raise PlanError(f"cf={fixed['capacity_factor']:g} sets the busiest expert's load, but {profile.model} has no "
                        "routed experts; drop cf")
    tp = fixed.get("tp")
    if tp is not None:
        tp_gpus = tp_domain_gpus(cluster)
        if tp > tp_gpus or tp_gpus % tp:
            ok = max(t for t in _divisors(tp_gpus) if t <= tp)
            link = "PCIe" if cluster.intra_node.fabric == "pcie" else "NVLink"
            where = (f"the {tp_gpus} GPUs of a node (tensor parallelism stays on the node's {link})"
                     if tp_gpus == cluster.gpus_per_node
                     else f"{tp_gpus}: in {cluster.name}'s {cluster.fast_domain_gpus}-GPU NVLink domain tp is a power of two "
                          f"up to {tp_gpus}, as the Megatron-Bridge perf recipes keep it")
            raise PlanError(f"tp={tp} must divide {where}; use tp={ok}")
        if tp > 1 and heads and heads % tp:
            ok = max(t for t in _divisors(tp_domain_gpus(cluster)) if heads % t == 0 and t <= tp)
            raise PlanError(f"tp={tp} does not divide the model's {heads} key/value heads (tp splits attention by them); use tp={ok}")
    pp = fixed.get("pp")
    if pp is not None and pp > L:
        raise PlanError(f"pp={pp} exceeds the model's {L} blocks (each stage needs one); use pp<={L}")
    degrees = [fixed.get(k) for k in ("dp", "tp", "pp")]
    product = fixed.get("cp", 1)
    for dgr in degrees:
        product *= dgr or 1
    if product > world:
        raise PlanError(
            f"dp*tp*pp*cp={product} GPUs but the cluster has {world}; use {nodes_flag} {-(-product // gpn)} or lower a degree"
        )
    if all(d is not None for d in degrees) and product != world and not max_nodes:
        raise PlanError(f"dp*tp*pp*cp={product} must use all {world} GPUs; change a degree or use --max-nodes")
    if "ep" in fixed and all(fixed.get(k) for k in ("dp", "tp")):
        problem = expert_grid_problem(fixed["ep"], fixed["tp"], fixed.get("cp", 1), fixed["dp"])
        if problem:
            raise PlanError(problem)
    ep, pp_fixed = fixed.get("ep", 1), fixed.get("pp") or 1
    if ep * pp_fixed > world:  # the expert grid folds ep into the tp x cp x dp ranks (megatron/core/parallel_state.py)
        # the fewest nodes whose GPUs per pipeline stage ep divides
        nodes = next(n for n in range(-(-ep * pp_fixed // gpn), ep * pp_fixed + 1) if n * gpn % (ep * pp_fixed) == 0)
        per = f" of each of pp={pp_fixed} stages" if pp_fixed > 1 else ""
        raise PlanError(f"ep={ep} needs at least {ep * pp_fixed} GPUs (ep divides tp*cp*dp{per}) but the cluster has "
                        f"{world}; use {nodes_flag} {nodes} or a lower ep")
    gbs = fixed["global_batch"]
    dp, mbs = fixed.get("dp"), fixed.get("micro_batch")
    sizes = world_sizes(cluster, fixed, max_nodes, min_nodes)
    if dp and all(w % product for w in sizes):
        # no mesh has these degrees: say so before the batch, which no batch can mend
        raise PlanError(why_no_candidates(profile, cluster, fixed, max_nodes, min_nodes))
    if dp and gbs % (dp * (mbs or 1)):
        per = dp * (mbs or 1)
        lower = max(per, gbs // per * per)
        raise PlanError(f"global batch {gbs} is not divisible by dp*mbs={per}; use --global-batch {lower} or {lower + per}")
    sched = fixed.get("schedule")
    problem = field_problem("schedule", sched) if sched is not None else None
    if problem:
        raise PlanError(problem)
    v = fixed.get("virtual_stages")
    if v is not None and v > 1:
        if sched not in (None, "interleaved"):
            raise PlanError(f"v={v} needs schedule=interleaved, but schedule={sched} is fixed; "
                            "drop v or fix schedule=interleaved")
        sched = fixed["schedule"] = "interleaved"  # v > 1 chunks per stage is what interleaving means
        if pp is not None and pp * v > L:
            raise PlanError(f"pp*v={pp * v} model chunks exceed the model's {L} blocks (each chunk needs one); "
                            f"use v<={max(L // pp, 1)} or a smaller pp")
        if v > L // 2:
            raise PlanError(f"v={v} needs pp*v <= the model's {L} blocks with pp >= 2; use v<={max(L // 2, 1)}")
    if v == 1 and sched == "interleaved":
        raise PlanError("the interleaved schedule needs v >= 2 model chunks per stage; drop v=1 or use schedule=1f1b")
    if sched == "interleaved" and pp == 1:
        raise PlanError("the interleaved schedule needs pp >= 2; use schedule=1f1b or fix pp>=2")
    rec = fixed.get("recompute")
    problem = field_problem("recompute", rec) if rec is not None else None
    if problem:
        raise PlanError(problem)
    if rec == "sac" and profile.blocks and not profile.blocks[0].supports_sac:
        raise PlanError("recompute=sac: the profile has no op-level checkpointing figures (a profile made before "
                        "they existed); re-profile the model or use recompute=selective|full")
    problem = field_problem("zero", fixed.get("zero", 0)) or field_problem("dtype", fixed["dtype"])
    if problem:
        raise PlanError(problem)
    if "grad_compress" in fixed:
        fixed["grad_compress"] = str(parse_grad_compress(fixed["grad_compress"]))
        problem = grad_compress_problem(fixed["grad_compress"], fixed.get("zero", 0))
        if problem:
            raise PlanError(problem)
        check_fix_syntax({k: fixed[k] for k in ("grad_compress", "tp", "pp") if k in fixed})  # DDP's hook: no tp, pp
    problem = fp8_scaling_problem(fixed.get("fp8_scaling", "tensor"), fixed["dtype"], cluster.gpu.block_scaled_fp8,
                                  repr(cluster.name))
    if problem:
        raise PlanError(problem)
    if fixed.get("sequence_parallel") and tp == 1:
        raise PlanError("sequence parallelism needs tp > 1; drop sp=1 or fix tp>1")
    if fixed.get("sequence_parallel") and "tp" not in fixed and tp_domain_gpus(cluster) == 1:
        raise PlanError(f"sequence parallelism needs tp > 1, and {cluster.name} has no two GPUs in one NVLink domain "
                        "to split it over; drop sp=1")
    if fixed.get("sequence_parallel") and profile.supports_sequence_parallel is False:
        raise PlanError(sp_unsupported(profile.unsupported))
    return fixed


def world_sizes(cluster: Cluster, fixed: dict, max_nodes: int | None, min_nodes: int | None = None) -> list[int]:
    """GPU counts to search: the cluster's, or min_nodes (default 1) .. max_nodes nodes (every
    count up to 16, then powers of two, and max_nodes itself)."""
    gpn = cluster.gpus_per_node
    if not max_nodes:
        return [cluster.num_gpus]
    low = min_nodes or 1
    counts = [k for k in range(low, max_nodes + 1) if k <= 16 or (k & (k - 1)) == 0 or k in (low, max_nodes)]
    return [k * gpn for k in counts]


def enumerate_candidates(profile: ModelProfile, cluster: Cluster, fixed: dict, max_nodes: int | None,
                         min_nodes: int | None = None) -> Iterator[Candidate]:
    return _walk(profile, cluster, fixed, max_nodes, min_nodes, None)


def _walk(profile: ModelProfile, cluster: Cluster, fixed: dict, max_nodes: int | None, min_nodes: int | None,
          reasons: list | None) -> Iterator[Candidate]:
    """Every candidate; with `reasons` a list, also what ruled out each mesh that had none
    (kind, sort key, detail), for `why_no_candidates`."""
    def reject(kind: str, key, detail) -> None:
        if reasons is not None:
            reasons.append((kind, key, detail))

    L, heads = profile.num_blocks, profile.num_heads
    gbs = fixed["global_batch"]
    rec = fixed.get("recompute")
    gc = fixed.get("grad_compress", "none")
    # PowerSGD is torch DDP's comm hook: zero=0 (grad_compress.problem), and no tp or pp, which
    # the executor runs with FSDP2 / DTensor rather than DDP (executor.validate).
    powersgd = gc.startswith("powersgd")
    kinds = [("selective", False), ("full", False)] if rec is None else [(rec, recomputes_every_block(fixed))]
    if rec is None and profile.blocks and profile.blocks[0].supports_sac:
        kinds.insert(1, ("sac", False))
    for world in world_sizes(cluster, fixed, max_nodes, min_nodes):
        tps = [fixed["tp"]] if "tp" in fixed else [
            t for t in _divisors(tp_domain_gpus(cluster)) if t <= world and (t == 1 or (
                not powersgd and profile.has_tp_plan and "tp" not in profile.unsupported and (not heads or heads % t == 0)))
        ]
        if fixed.get("sequence_parallel"):  # sp=1 splits activations over the tp ranks: tp=1 has none
            tps = [t for t in tps if t > 1]
        for tp, cp in ((t, c) for t in tps for c in _cps(profile, fixed, world // t if world % t == 0 else 0)):
            if world % (tp * cp):
                continue
            max_pp = 1 if "pp" in profile.unsupported or powersgd else L  # the model cannot be cut (capabilities)
            pps = [fixed["pp"]] if "pp" in fixed else [p for p in range(1, max_pp + 1) if world % (tp * cp * p) == 0]
            for pp in pps:
                if world % (tp * cp * pp):
                    continue
                zero_pp = zero_with_pp_problem(fixed.get("zero", 0), pp)  # it would run, and be priced, as ZeRO-1
                if zero_pp:
                    reject("zero", 0, f"{zero_pp}; fix pp=1 for ZeRO-2/3, or zero=1")
                    continue
                fsdp = fsdp_zero1_problem(fixed.get("zero", 0), pp, world // (tp * pp), cluster.efficiency.zero_granularity)
                if fsdp:
                    reject("zero", 0, f"{fsdp}; fix zero=2 (or 0), or pp > 1 for ZeRO-1")
                    continue
                dp = world // (tp * cp * pp)
                if fixed.get("dp", dp) != dp:
                    reject("shape", 0, (world, tp, pp, dp))
                    continue
                if gbs % dp:
                    reject("batch", 0, dp)
                    continue
                eps = _eps(profile, fixed, tp * cp * dp)
                if not eps:
                    reject("shape", 0, (world, tp, pp, dp))
                    continue
                per_replica = gbs // dp
                mbss = [fixed["micro_batch"]] if "micro_batch" in fixed else [
                    b for b in _divisors(per_replica) if b <= MAX_MICRO_BATCH
                ]
                for mbs in mbss:
                    if per_replica % mbs:
                        reject("batch", 0, dp)
                        continue
                    m = per_replica // mbs
                    schedules = _schedules(fixed, pp, m, L)
                    if not schedules:
                        sched = fixed.get("schedule") or "1f1b"
                        why = pipeline_fill_problem(pp, sched, m, dp, mbs, pp_given="pp" in fixed)
                        reject("fill", pp * dp * mbs, why or f"no schedule runs pp={pp} with {m} micro-batches")
                    for schedule, v in schedules:
                        sp_ok = profile.supports_sequence_parallel is not False
                        sps = [fixed["sequence_parallel"]] if "sequence_parallel" in fixed else [tp > 1 and sp_ok]
                        cf = fixed.get("capacity_factor", 1.0)
                        for sp, ep in ((s, e) for s in sps for e in eps):
                            # dense states shard over dp x cp, routed experts' (ep > 1) over
                            # edp = tp*cp*dp/ep: ZeRO only where one of the groups has ranks
                            single = dp * cp == 1 and (ep == 1 or ep == tp * cp * dp)
                            # with pp > 1, ZeRO-2/3 run as ZeRO-1 (feasibility.effective_zero): not offered.
                            # ZeRO-0 only where nothing shards, or where per-block ZeRO collectives
                            # (efficiency.zero_granularity "block": FSDP) can cost more than DDP's buckets
                            fsdp = cluster.efficiency.zero_granularity == "block"
                            plain = [0] if fsdp else []
                            # FSDP (FSDP1's sharding strategies, FSDP2's reshard_after_forward) shards
                            # gradients with the optimizer states or nothing: no ZeRO-1 without pp
                            sharded = [2, 3] if fsdp else [1, 2, 3]
                            zeros = [fixed["zero"]] if "zero" in fixed else (
                                [0] if single or powersgd else [*plain, 1] if pp > 1 else [*plain, *sharded])
                            for zero in zeros:
                                for kind, all_ in kinds:
                                    yield Candidate(world, tp, pp, dp, mbs, m, schedule, v, bool(sp and tp > 1),
                                                    zero, kind, all_, fixed["overlap_dp"], fixed["dtype"],
                                                    ep, cp, cf, gc, fixed.get("fp8_scaling", "tensor"))


def recomputes_every_block(fixed: dict) -> bool:
    """A fixed recompute kind other than none recomputes every block (Candidate.recompute_all)."""
    return fixed.get("recompute", "none") != "none"


def _cps(profile: ModelProfile, fixed: dict, room: int) -> list[int]:
    """cp degrees to search: the fixed one, else 1 and (from CP_MIN_SEQ_LEN tokens on) the
    powers of two with 2*cp dividing seq_len (Megatron-Core's causal load balancing), <= room GPUs."""
    if "cp" in fixed:
        return [fixed["cp"]]
    out, cp = [1], 2
    if profile.seq_len >= CP_MIN_SEQ_LEN and "cp" not in profile.unsupported:  # capabilities: the model's hook
        while cp <= room and profile.seq_len % (2 * cp) == 0:
            out.append(cp)
            cp *= 2
    return out


def _eps(profile: ModelProfile, fixed: dict, grid: int) -> list[int]:
    """ep degrees to search: divisors of the stage's tp*cp*dp ranks (the expert grid folds into
    them) that divide the experts; 1 for a dense model."""
    experts = profile.num_experts
    if "ep" in fixed:
        return [fixed["ep"]] if grid % fixed["ep"] == 0 else []
    if not experts or "ep" in profile.unsupported:  # the banks cannot be split (capabilities)
        return [1]
    return [e for e in _divisors(grid) if experts % e == 0]


def _schedules(fixed: dict, pp: int, m: int, L: int) -> list[tuple[str, int]]:
    """The (schedule, v) pairs that can run `m` micro-batches on `pp` stages (feasibility rule)."""
    sched = fixed.get("schedule")
    v_fixed = fixed.get("virtual_stages")
    out = []
    for name in ("1f1b", "gpipe"):  # GPipe only when asked (module docstring of search.py)
        if (sched == name or (sched is None and name == "1f1b")) and v_fixed in (None, 1):
            if not pipeline_fill_problem(pp, name, m, 1, 1):
                out.append((name, 1))
    if sched in (None, "interleaved") and pp >= 2 and v_fixed != 1:
        if not pipeline_fill_problem(pp, "interleaved", m, 1, 1):
            vs = [v_fixed] if v_fixed else range(2, min(L // pp, MAX_VIRTUAL_STAGES) + 1)
            out += [("interleaved", v) for v in vs if pp * v <= L]
    return out


def why_no_candidates(profile: ModelProfile, cluster: Cluster, fixed: dict, max_nodes: int | None,
                      min_nodes: int | None = None) -> str:
    """One line: why no mesh shape meets the fixed keys and the global batch (not memory)."""
    reasons: list = []
    for _ in _walk(profile, cluster, fixed, max_nodes, min_nodes, reasons):
        return "candidates exist"  # not reached by search(), which calls this only when there are none
    gbs = fixed["global_batch"]
    zeros = [r for r in reasons if r[0] == "zero"]
    if zeros and (fixed.get("pp", 1) > 1 or fixed.get("zero") == 1):  # the fixed ZeRO stage rules the shapes out
        return zeros[0][2]
    fills = sorted((r for r in reasons if r[0] == "fill"), key=lambda r: r[1])
    if fills:
        return fills[0][2]
    dps = sorted({r[2] for r in reasons if r[0] == "batch"})
    if dps:
        mbs = fixed.get("micro_batch")
        if mbs:
            ok = sorted({b for dp in dps if gbs % dp == 0 for b in _divisors(gbs // dp) if b <= MAX_MICRO_BATCH})
            choose = f"choose mbs dividing gbs/dp (mbs in {{{', '.join(map(str, ok))}}})" if ok else "choose another mbs"
            multiple = mbs * dps[0]
            return (f"gbs={gbs} is not a multiple of mbs*dp for any dp (mbs={mbs}, dp in {{{', '.join(map(str, dps))}}}); "
                    f"{choose} or --global-batch {-(-gbs // multiple) * multiple}")
        return (f"global batch {gbs} is not divisible by any dp this cluster allows (dp in {{{', '.join(map(str, dps))}}}); "
                f"use --global-batch {-(-gbs // dps[0]) * dps[0]}")
    fixed_shape = ", ".join(f"{k}={fixed[k]}" for k in ("dp", "tp", "pp") if k in fixed)
    gpus = ", ".join(str(w) for w in world_sizes(cluster, fixed, max_nodes, min_nodes))
    return (f"no mesh of {gpus} GPUs has {fixed_shape or 'the fixed keys'}; change a degree, "
            "--nodes or --max-nodes")
