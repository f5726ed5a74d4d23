"""Pick K plans for calibration that differ from each other as much as possible.

A fit can only separate factors that the runs exercise differently: pure data parallelism
stresses GEMMs and the gradient all-reduce, tensor parallelism small GEMMs and per-layer
collectives, pipelining bubbles and sends, recomputation extra forward work, the
micro-batch size GEMM shapes and host overhead per pass. So the choice is greedy
max-min diversity (farthest-point sampling, Gonzalez 1985) over those five features.
"""

from __future__ import annotations

from dataclasses import dataclass

from smplan.planner import blocks_problem
from smplan.planner.feasibility import pipeline_fill_problem
from smplan.planner.model_profile import ModelProfile
from smplan.planner.plan import Plan, PlanError, even_stages

RECOMPUTE_ORDER = ("none", "full", "selective")
# Selective is not picked by default: the executor's op-level policy recomputes every
# non-matmul op (norms, GeLU, softmax; under TP also the functional all-reduces), the cost
# model's is Megatron's attention core only (Korthikanti et al. 2022, section 5). Measured
# on CPU: +22% step time against the model's +4%. A fit over such runs would push that
# mismatch into the global factors. Ask for it explicitly (`--plan ...,recompute=selective`).
DEFAULT_RECOMPUTE = ("none", "full")
MICRO_BATCHES = (4, 2, 1)  # largest first: the first plan is the plainest, fastest one
# On CPU a tp plan's time is mostly DTensor's per-operation dispatch in Python, which no profile
# factor prices and a GPU hides behind its kernels: examples/gpt.py:tiny at tp=2 took 87 ms a
# forward of two micro-batches of 4 against dp=2's 2.6 ms for one (2 cores, gloo; calibrate's own
# runs), 7x its prediction, and a fit that took it in missed every plan by 69% (median) against
# 21% before. So the automatic pick leaves tp out on CPU; `--plan` still runs one.
CPU_TP_NOTE = ("tp plans are not picked on CPU, where DTensor's per-operation dispatch, not the hardware, sets "
               "their speed (no profile factor prices it); --plan dp=1,tp=2,... runs one anyway")


@dataclass(frozen=True)
class PlanChoice:
    dp: int
    tp: int
    pp: int
    micro_batch: int
    recompute: str

    @property
    def label(self) -> str:
        return f"dp={self.dp},tp={self.tp},pp={self.pp},mbs={self.micro_batch},recompute={self.recompute}"


def meshes(nproc: int, profile: ModelProfile, tensor_parallel: bool = True) -> list[tuple[int, int, int]]:
    """(dp, tp, pp) with dp*tp*pp = nproc that the model allows (profile.unsupported: what the
    planner would refuse too, e.g. pp for a forward that does not skip other stages' layers);
    pure dp first. `tensor_parallel=False`: tp=1 only (`choose` on CPU)."""
    out = []
    for tp in _divisors(nproc):
        if tp > 1 and (not tensor_parallel or not profile.has_tp_plan or "tp" in profile.unsupported
                       or (profile.num_heads and profile.num_heads % tp)):
            continue
        for pp in _divisors(nproc // tp):
            if pp > profile.num_blocks or (pp > 1 and "pp" in profile.unsupported):
                continue
            out.append((nproc // (tp * pp), tp, pp))
    return sorted(out, key=lambda m: (-m[0], m[1], m[2]))


def candidates(nproc: int, profile: ModelProfile, global_batch: int,
               recompute: tuple[str, ...] = DEFAULT_RECOMPUTE, tensor_parallel: bool = True) -> list[PlanChoice]:
    """Every choice whose micro-batches divide `global_batch` and fill the pipeline."""
    out = []
    for dp, tp, pp in meshes(nproc, profile, tensor_parallel):
        for mbs in MICRO_BATCHES:
            if global_batch % (dp * mbs):
                continue
            if pipeline_fill_problem(pp, "1f1b", global_batch // (dp * mbs), dp, mbs):
                continue
            for kind in RECOMPUTE_ORDER:
                if kind in recompute:
                    out.append(PlanChoice(dp, tp, pp, mbs, kind))
    return out


def choose(nproc: int, profile: ModelProfile, k: int, global_batch: int = 8,
           recompute: tuple[str, ...] = DEFAULT_RECOMPUTE, tensor_parallel: bool = True) -> list[PlanChoice]:
    """K diverse choices; the first is pure data parallelism without recomputation.
    `tensor_parallel=False` leaves tp > 1 out (CPU: `CPU_TP_NOTE`)."""
    if k < 1:
        raise PlanError(f"--plans must be at least 1, got {k}")
    problem = blocks_problem(profile)  # no mesh places such a model, whatever the batch
    if problem:
        raise PlanError(problem)
    pool = candidates(nproc, profile, global_batch, recompute, tensor_parallel)
    if not pool:
        raise PlanError(
            f"no plan of {nproc} processes fits a global batch of {global_batch}; "
            f"use a global batch that is a multiple of {nproc} (--global-batch)"
        )
    if k > len(pool):
        raise PlanError(f"only {len(pool)} different plans exist for {nproc} processes; use --plans {len(pool)} or fewer")
    chosen = [pool[0]]
    while len(chosen) < k:
        # farthest point: the candidate whose nearest chosen plan differs in most features;
        # ties go to the earliest candidate, so the choice is deterministic
        best = max((c for c in pool if c not in chosen), key=lambda c: min(_distance(c, s) for s in chosen))
        chosen.append(best)
    return chosen


def to_plan(choice: PlanChoice, profile: ModelProfile, *, model: str, model_args: dict, hw: str,
            global_batch: int, gpus_per_node: int, dtype: str) -> Plan:
    """The full Plan of a choice (1F1B, even stages, ZeRO-0, DP overlapping backward)."""
    return Plan(
        model=model,
        hw=hw,
        nodes=1,
        dp=choice.dp,
        tp=choice.tp,
        pp=choice.pp,
        micro_batch=choice.micro_batch,
        global_batch=global_batch,
        dtype=dtype,
        stages=even_stages(profile.num_blocks, choice.pp, choice.recompute),
        model_args=dict(model_args),
        hw_overrides={"gpus_per_node": gpus_per_node},
    )


# --plan keys a calibration plan honours; the rest of a plan is fixed (see `to_plan`)
CHOICE_KEYS = {"dp": "dp", "tp": "tp", "pp": "pp", "micro_batch": "mbs", "recompute": "recompute"}


def parse_choice(text: str) -> PlanChoice:
    """`"dp=2,tp=1,pp=1,mbs=4,recompute=none"` (omitted keys: 1 and none)."""
    from smplan.planner.plan import INLINE_KEYS, parse_inline

    keys = parse_inline(text)
    unsupported = [k for k in (part.split("=", 1)[0].strip() for part in text.split(",") if part.strip())
                   if INLINE_KEYS[k] not in CHOICE_KEYS]
    if unsupported:
        raise PlanError(
            f"--plan {text}: calibration does not take {', '.join(unsupported)}; use only "
            f"{', '.join(CHOICE_KEYS.values())} (the global batch is --global-batch; plans run 1F1B, ZeRO-0, no sp)"
        )
    return PlanChoice(keys.get("dp", 1), keys.get("tp", 1), keys.get("pp", 1), keys.get("micro_batch", 1),
                      keys.get("recompute", "none"))


def batch_problem(choice: PlanChoice, global_batch: int) -> str | None:
    """Why `choice` cannot run a global batch of `global_batch`, naming calibrate's --global-batch:
    the planner's own line (plan.validate, feasibility) names gbs, which --plan does not take."""
    per_step = choice.dp * choice.micro_batch  # samples per micro-batch step of all replicas
    if global_batch % per_step:
        lower = max(per_step, global_batch // per_step * per_step)
        return (f"--plan {choice.label}: dp*mbs={per_step} does not divide the global batch {global_batch}; "
                f"use --global-batch {lower} or {lower + per_step}, or another mbs")
    if pipeline_fill_problem(choice.pp, "1f1b", global_batch // per_step, choice.dp, choice.micro_batch):
        return (f"--plan {choice.label}: {global_batch // per_step} micro-batches cannot fill {choice.pp} pipeline "
                f"stages; use --global-batch {choice.pp * per_step} or more (a multiple of dp*mbs={per_step}), "
                "a smaller mbs or a smaller pp")
    return None


def _distance(a: PlanChoice, b: PlanChoice) -> int:
    return sum(getattr(a, f) != getattr(b, f) for f in ("dp", "tp", "pp", "micro_batch", "recompute"))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
