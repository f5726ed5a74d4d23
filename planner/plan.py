"""The Plan contract: one parallel configuration, as JSON (versioned) or inline text.

The same plan file flows through `smplan plan`, `simulate`, `reliability`, `whatif` and
`execute`. Inline form (accepted wherever a plan is):
    "tp=8,pp=8,dp=16,mbs=1,gbs=1536,recompute=full,schedule=interleaved,v=3,sp=1,zero=0,overlap_dp=1"
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from smplan.display import memory_gib_text

from .feasibility import (
    capacity_factor_problem,
    expert_grid_problem,
    fp8_scaling_problem,
    pipeline_fill_problem,
)
from .grad_compress import problem as grad_compress_problem
from .model_file import beside, relative_to_folder, split_ref
from .plan_schema import COUNT_CAPS, check_derived, check_plan_dict

# 2: ep, cp, capacity_factor and dtype fp8; version-1 files (no such keys) still read. Keys added
# since with a default (grad_compress, fp8_scaling, stack) keep version 2: files without them read
# as the default; a file that has them needs this smplan or later.
PLAN_VERSION = 2
READABLE_VERSIONS = (1, 2)
SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "sac", "full")  # sac: torchtitan op-level selective AC
DTYPES = ("bf16", "fp16", "fp32", "fp8")  # fp8: FP8 linears, bf16 elsewhere
# How FP8 tensors are scaled: "tensor" (one scale per tensor: Transformer Engine's delayed and
# current scaling, torchao float8) or "block" (a scale per block of 32 elements: MXFP8, the
# OCP microscaling format Blackwell's tensor cores take natively; TE MXFP8BlockScaling).
FP8_SCALINGS = ("tensor", "block")


class PlanError(ValueError):
    """A plan the user gave is inconsistent; the message names the value and the fix."""


class TooFewBlocksError(PlanError):
    """More pipeline stages than the model has blocks. `because(why)` says it again with why the
    blocks are few (smplan.model.structure.unlike_blocks), which only a caller holding the model knows."""

    def __init__(self, num_chunks: int, num_blocks: int, why: str | None = None):
        self.num_chunks, self.num_blocks, self.why = num_chunks, num_blocks, why
        super().__init__(f"{num_chunks} pipeline stages need at least {num_chunks} blocks but the model has "
                         f"{num_blocks}{f': {why}' if why else ''}; lower pp (or v)")

    def __reduce__(self):  # pickled with its own arguments (a process pool's error), not the message alone
        return TooFewBlocksError, (self.num_chunks, self.num_blocks, self.why)

    def because(self, why: str) -> TooFewBlocksError:
        return TooFewBlocksError(self.num_chunks, self.num_blocks, why)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage (one virtual stage under the interleaved schedule).

    Holds repeated blocks [first_block, last_block) and, on the first / last stage, the
    model's non-repeated parts. `recompute_blocks` of its blocks use `recompute`
    (the rest keep their activations); None means all of them.
    """

    first_block: int
    last_block: int
    recompute: str = "none"
    recompute_blocks: int | None = None

    @property
    def num_blocks(self) -> int:
        return self.last_block - self.first_block

    @property
    def num_recomputed(self) -> int:
        if self.recompute == "none":
            return 0
        return self.num_blocks if self.recompute_blocks is None else self.recompute_blocks


@dataclass(frozen=True)
class Figures:
    """The predicted (or measured) figures every --json output uses (DESIGN.md)."""

    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    peak_memory_gib: float
    bubble_fraction: float
    breakdown: dict = field(default_factory=dict)  # seconds by kind: compute, tp_comm, ...
    usd_per_step: float = 0.0
    memory_breakdown_gib: dict = field(default_factory=dict)  # weights, grads, optimizer, ...

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def peak_memory_text(self) -> str:
        return memory_gib_text(self.peak_memory_gib)


@dataclass(frozen=True)
class Plan:
    model: str
    hw: str
    nodes: int
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1  # expert parallel: experts split over ep ranks of the tp*cp*dp grid (MoE parallel folding)
    cp: int = 1  # context parallel: each sequence split over cp ranks
    micro_batch: int = 1
    global_batch: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    overlap_dp: bool = True
    dtype: str = "bf16"
    # Busiest expert's load over the balanced one (GShard's capacity factor, Lepikhin et al.
    # 2020): multiplies expert compute and all-to-all bytes; 1.0 = balanced routing.
    capacity_factor: float = 1.0
    # DP gradient compression: none, bf16 or powersgd:R (planner/grad_compress.py)
    grad_compress: str = "none"
    # FP8 scaling under dtype=fp8 (FP8_SCALINGS); files without the key read as "tensor"
    fp8_scaling: str = "tensor"
    stages: tuple[Stage, ...] = ()
    model_args: dict = field(default_factory=dict)
    seq_len: int | None = None
    hw_overrides: dict = field(default_factory=dict)
    # Software stack (hwprofiles/stack.py): a bundled name or a .toml path, as --stack takes it
    stack: str = "megatron-core"
    predicted: Figures | None = None
    version: int = PLAN_VERSION

    def __post_init__(self) -> None:
        validate(self)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def edp(self) -> int:
        """Expert data parallel: the expert grid's other side, ep x edp = tp x cp x dp (Megatron-Core
        MoE parallel folding, Liu et al. 2025 "MoE Parallel Folding", section 3)."""
        return self.tp * self.cp * self.dp // self.ep

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per replica per optimizer step."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def num_model_chunks(self) -> int:
        return self.pp * self.virtual_stages

    @property
    def recompute(self) -> str:
        """One word for the plan's recomputation (the strongest any stage uses)."""
        used = {s.recompute for s in self.stages if s.num_recomputed}
        for kind in ("full", "sac", "selective"):
            if kind in used:
                return kind
        return "none"

    @property
    def recomputed_blocks(self) -> tuple[int, int]:
        """(blocks recomputed, blocks) over every model chunk."""
        return sum(s.num_recomputed for s in self.stages), sum(s.num_blocks for s in self.stages)

    @property
    def recompute_label(self) -> str:
        """"recompute=full" when every block recomputes, "recompute=full 34/80" when some do,
        "recompute=none" when none does (whatever kind a stage names)."""
        n, total = self.recomputed_blocks
        return f"recompute={self.recompute}" + (f" {n}/{total}" if 0 < n < total else "")

    def replace(self, **changes) -> Plan:
        return dataclasses.replace(self, **changes)

    @property
    def degrees(self) -> str:
        """"tp=8 pp=2 dp=4", with ep and cp where they are above 1: the layout in one phrase."""
        extra = "".join(f" {k}={v}" for k, v in (("ep", self.ep), ("cp", self.cp)) if v > 1)
        return f"tp={self.tp} pp={self.pp} dp={self.dp}{extra}"

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        # a stage the search gave a kind but no recomputed block reads "none" (Stage.num_recomputed
        # counts it so either way; files that say "selective" with 0 blocks still load)
        data["stages"] = [stage if self.stages[i].num_recomputed else {**stage, "recompute": "none", "recompute_blocks": None}
                          for i, stage in enumerate(data["stages"])]
        data["recompute"] = self.recompute
        data["num_microbatches"] = self.num_microbatches
        data["stage_blocks"] = [[s.first_block, s.last_block] for s in self.stages]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON; a relative model path is written relative to the file's
        folder (`Plan.load` looks there first), so the file works from any directory."""
        path = Path(path)
        model = relative_to_folder(self.model, path.parent)
        plan = self if model == self.model else self.replace(model=model)
        path.write_text(plan.to_json() + "\n")

    @staticmethod
    def from_dict(data: dict, source: str = "plan") -> Plan:
        """A Plan from its JSON form, checked against the schema first (`plan_schema`): every
        problem (unknown key, missing key, wrong type) is one line of one PlanError."""
        kwargs = check_plan_dict(data, source)
        try:
            plan = Plan(**kwargs)
        except PlanError as err:
            raise PlanError(f"{source}: {err}") from None
        check_derived(plan, data, source)
        return plan

    @staticmethod
    def load(path: str | Path) -> Plan:
        path = Path(path)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise PlanError(f"plan file {str(path)!r} does not exist; create it with `smplan plan MODEL --hw HW -o {path}`") from None
        except IsADirectoryError:
            raise PlanError(f"plan file {str(path)!r} is a folder; give the .json file") from None
        except (OSError, UnicodeDecodeError) as err:
            raise PlanError(f"cannot read plan file {str(path)!r}: {err}") from None
        try:
            data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
        except PlanError as err:
            raise PlanError(f"plan file {str(path)!r}: {err}") from None
        except json.JSONDecodeError as err:
            raise PlanError(f"plan file {str(path)!r} is not valid JSON ({err}); regenerate it with `smplan plan`") from None
        except ValueError:  # int() refuses literals over sys.get_int_max_str_digits() (4300) digits
            raise PlanError(f"plan file {str(path)!r} has a number over {sys.get_int_max_str_digits()} digits "
                            "long; no plan value is that large, regenerate it with `smplan plan`") from None
        except RecursionError:
            raise PlanError(f"plan file {str(path)!r} nests too deeply; regenerate it with `smplan plan`") from None
        plan = Plan.from_dict(data, source=f"plan file {str(path)!r}")
        # A relative model path is relative to the plan file (Plan.save), or, in files written
        # before, to where `smplan plan` ran.
        model = beside(plan.model, path.parent)
        return plan if model == plan.model else plan.replace(model=model)


def model_not_found(plan: Plan, path: str | Path, fix: str = "fix its \"model\" key") -> str | None:
    """Where plan file `path` looked for its model, when neither place holds it (a plan moved
    without its model file), else None."""
    ref = plan.model
    if not isinstance(ref, str) or not ref:
        return None
    found = split_ref(ref)[0]
    if found.exists() or found.is_absolute():
        return None  # an absolute path that is gone: the model file's own error names it
    folder = Path(path).parent
    return (f"plan file {str(path)!r} names model {ref!r}, which is neither beside it ({folder / found}) nor "
            f"below the working directory ({Path.cwd() / found}); copy the model file there, or {fix}")


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise PlanError(f"key {key!r} is given twice; keep one")
        seen[key] = value
    return seen


# What the repeated blocks are (smplan.model.structure's rule, `_signature`), in the words of the
# refusals: same-class blocks of other widths (a pyramid) are not one run.
BLOCKS_RULE = ("an nn.ModuleList or nn.Sequential of structurally identical modules: one class, with the same "
               "submodules and parameter shapes")


def no_blocks_reason(name: str) -> str:
    """Why `name` (a model without repeated blocks) cannot be planned or run: the one line plan
    and execute refuse it with and profile warns with."""
    return (f"{name} has no repeated blocks ({BLOCKS_RULE}), which smplan places and prices one by one; "
            "build it around such a stack (README: The model file)")


def even_stages(num_blocks: int, num_chunks: int, recompute: str = "none") -> tuple[Stage, ...]:
    """Split blocks into contiguous chunks as evenly as possible (earlier chunks get the extra)."""
    if num_blocks == 0:
        raise PlanError(no_blocks_reason("the model"))
    if num_chunks > num_blocks:
        raise TooFewBlocksError(num_chunks, num_blocks)
    base, extra = divmod(num_blocks, num_chunks)
    stages, start = [], 0
    for i in range(num_chunks):
        end = start + base + (1 if i < extra else 0)
        stages.append(Stage(start, end, recompute))
        start = end
    return tuple(stages)


INLINE_KEYS = {
    "tp": "tp",
    "pp": "pp",
    "dp": "dp",
    "mbs": "micro_batch",
    "micro_batch": "micro_batch",
    "gbs": "global_batch",
    "global_batch": "global_batch",
    "recompute": "recompute",
    "schedule": "schedule",
    "v": "virtual_stages",
    "virtual_stages": "virtual_stages",
    "sp": "sequence_parallel",
    "sequence_parallel": "sequence_parallel",
    "zero": "zero",
    "overlap_dp": "overlap_dp",
    "dtype": "dtype",
    "ep": "ep",
    "cp": "cp",
    "cf": "capacity_factor",
    "capacity_factor": "capacity_factor",
    "grad_compress": "grad_compress",
    "fp8_scaling": "fp8_scaling",
    "stages": "stages",
}
_INT_FIELDS = {"tp", "pp", "dp", "ep", "cp", "micro_batch", "global_batch", "virtual_stages", "zero"}
_FLOAT_FIELDS = {"capacity_factor"}
_BOOL_FIELDS = {"sequence_parallel", "overlap_dp"}


def parse_inline(text: str) -> dict:
    """`"tp=8,pp=2,recompute=full"` -> {"tp": 8, "pp": 2, "recompute": "full"} (field names)."""
    out: dict = {}
    given: dict[str, str] = {}  # field name -> the key it was given as
    for item in filter(None, (part.strip() for part in text.split(","))):
        if "=" not in item:
            raise PlanError(f"plan item {item!r} needs the form key=value, e.g. tp=8")
        key, raw = (s.strip() for s in item.split("=", 1))
        if re.search(r"\s\w+=", raw) or re.search(r"\s", key):  # "dp=2 mbs=2": the value would be "2 mbs=2"
            fixed = ",".join(part for part in re.split(r"[\s,]+", text.strip()) if part)
            raise PlanError(f"plan keys are separated by commas, not spaces: {fixed!r}")
        if key not in INLINE_KEYS:
            near = difflib.get_close_matches(key, list(INLINE_KEYS), n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            raise PlanError(f"unknown plan key {key!r}; {hint}use {', '.join(sorted(set(INLINE_KEYS)))}")
        name = INLINE_KEYS[key]
        if name in given:
            same = key if given[name] == key else f"{given[name]} (as {key})"
            raise PlanError(f"plan key {same} is given twice ({text.strip()!r}); keep one")
        given[name] = key
        out[name] = _parse_value(name, raw)
    return out


def _parse_stages(raw: str) -> tuple[tuple[int, int], ...]:
    """`"3:1/3:0/2:0"` -> ((3, 1), (3, 0), (2, 0)): each model chunk's blocks and how many of them
    recompute, in pipeline order: a plan file's `stages` in the inline form."""
    out = []
    for item in raw.split("/"):
        blocks, _, recomputed = item.partition(":")
        try:
            n, r = int(blocks), int(recomputed or 0)
        except ValueError:
            n = r = -1
        if n < 1 or not 0 <= r <= n:
            raise PlanError(f"plan key stages takes BLOCKS:RECOMPUTED per model chunk, separated by '/', with "
                            f"1 <= BLOCKS and 0 <= RECOMPUTED <= BLOCKS (e.g. stages=3:1/3:0), got {raw!r}")
        out.append((n, r))
    return tuple(out)


def _parse_value(name: str, raw: str):
    if name == "stages":
        return _parse_stages(raw)
    if name in _INT_FIELDS:
        try:
            return int(raw)
        except ValueError:
            raise PlanError(f"plan key {name} must be a whole number, got {raw!r}") from None
    if name in _FLOAT_FIELDS:
        try:
            return float(raw)
        except ValueError:
            raise PlanError(f"plan key {name} must be a number, got {raw!r}") from None
    if name in _BOOL_FIELDS:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise PlanError(f"plan key {name} must be 0 or 1, got {raw!r}")
    return raw


def _stages_from_counts(counts, num_blocks: int, chunks: int, recompute: str) -> tuple[Stage, ...]:
    """Stages from the inline key's (blocks, recomputed) per chunk, checked against the model."""
    if len(counts) != chunks:
        raise PlanError(f"stages= lists {len(counts)} model chunks but pp*v = {chunks}; give one BLOCKS:RECOMPUTED "
                        "per chunk, or drop stages= to split evenly")
    if sum(n for n, _ in counts) != num_blocks:
        raise PlanError(f"stages= places {sum(n for n, _ in counts)} blocks but the model has {num_blocks}; "
                        "make the chunks' blocks add up to it")
    if recompute == "none" and any(r for _, r in counts):
        raise PlanError("stages= recomputes blocks but recompute=none; name the kind (recompute=selective, sac or "
                        "full) or give RECOMPUTED 0")
    out, start = [], 0
    for n, r in counts:
        out.append(Stage(start, start + n, recompute, None if r == n else r))
        start += n
    return tuple(out)


def plan_from_inline(
    text: str | dict,
    *,
    model: str,
    hw: str,
    nodes: int,
    gpus_per_node: int,
    num_blocks: int,
    model_args: dict | None = None,
    seq_len: int | None = None,
    hw_overrides: dict | None = None,
) -> Plan:
    """A full Plan from inline keys; omitted keys take defaults.

    Defaults: tp=pp=1, dp fills the cluster, mbs=1, gbs = dp*mbs*(4*pp if pp > 1 else 1)
    (enough micro-batches to keep the 1F1B bubble near 20%), stages split evenly with every
    block recomputed, unless `stages=` gives each model chunk's blocks and recomputed count.
    """
    keys = parse_inline(text) if isinstance(text, str) else dict(text)
    problem = count_problem(keys)  # before any division by them (v=0 divided the stage split by zero)
    if problem:
        raise PlanError(problem)
    tp, pp, cp = keys.get("tp", 1), keys.get("pp", 1), keys.get("cp", 1)
    world = nodes * gpus_per_node
    if "dp" in keys:
        dp = keys["dp"]
    else:
        if world % (tp * pp * cp):
            # the nearest tp below that fills the GPUs (tp is the degree most often mistyped: 3, 6)
            fits = next((t for t in range(tp - 1, 0, -1) if world % (t * pp * cp) == 0), None)
            change = f"use tp={fits} or change pp/cp" if fits else "change tp/pp/cp"
            raise PlanError(f"tp*pp*cp={tp * pp * cp} does not divide the cluster's {world} GPUs; "
                            f"{change}, or give dp= to lay out fewer GPUs")
        dp = world // (tp * pp * cp)
    mbs = keys.get("micro_batch", 1)
    gbs = keys.get("global_batch", dp * mbs * (4 * pp if pp > 1 else 1))
    # v > 1 implies the interleaved schedule, as `smplan plan --fix v=N` takes it
    schedule = keys.get("schedule", "interleaved" if keys.get("virtual_stages", 1) > 1 else "1f1b")
    v = keys.get("virtual_stages", 2 if schedule == "interleaved" else 1)
    recompute = keys.pop("recompute", "none")
    problem = field_problem("recompute", recompute)
    if problem:
        raise PlanError(problem)
    stages = (_stages_from_counts(keys["stages"], num_blocks, pp * v, recompute) if "stages" in keys
              else even_stages(num_blocks, pp * v, recompute))
    if dp * tp * pp * cp > world:
        raise PlanError(
            f"dp*tp*pp*cp={dp * tp * pp * cp} GPUs but the cluster has {world}; lower a degree or add --nodes"
        )
    return Plan(
        model=model,
        hw=hw,
        nodes=nodes,
        dp=dp,
        tp=tp,
        pp=pp,
        ep=keys.get("ep", 1),
        cp=cp,
        micro_batch=mbs,
        global_batch=gbs,
        schedule=schedule,
        virtual_stages=v,
        zero=keys.get("zero", 0),
        sequence_parallel=keys.get("sequence_parallel", False),
        overlap_dp=keys.get("overlap_dp", True),
        dtype=keys.get("dtype", "bf16"),
        capacity_factor=keys.get("capacity_factor", 1.0),
        grad_compress=keys.get("grad_compress", "none"),
        fp8_scaling=keys.get("fp8_scaling", "tensor"),
        stages=stages,
        model_args=dict(model_args or {}),
        seq_len=seq_len,
        hw_overrides=dict(hw_overrides or {}),
    )


def is_plan_file_name(path: str | Path) -> bool:
    """Whether `path` names a plan file: `smplan plan -o` writes them with a .json suffix (any
    case), which is how simulate, reliability, whatif and execute tell one from a model."""
    return Path(path).suffix.lower() == ".json"


# Plan fields that count something (degrees, batch sizes, model chunks): a whole number >= 1.
COUNT_FIELDS = ("dp", "tp", "pp", "ep", "cp", "micro_batch", "global_batch", "virtual_stages")


def count_problem(keys: dict) -> str | None:
    """Why one of the COUNT_FIELDS in `keys` (plan fields, or `nodes`) is not a whole number >= 1
    and within its cap (plan_schema's, as a plan file's), or None."""
    for name in (*COUNT_FIELDS, "nodes"):
        value = keys.get(name, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"{name} must be a whole number >= 1, got {value!r}"
        cap = COUNT_CAPS[name]
        if value > cap:
            return f"{name} must be at most {cap} (a typo guard), got {value}"
    return None


def idle_nodes_problem(what: str, world_size: int, gpus_per_node: int, nodes: int) -> str | None:
    """Why `nodes` nodes are more than a layout of `world_size` GPUs uses (the rest would idle,
    and a result would be labelled with GPUs that did nothing), or None."""
    needed = -(-world_size // gpus_per_node)
    if nodes <= needed:
        return None
    return (f"{what} lays out {world_size} GPUs ({needed} node{'s' if needed != 1 else ''} of {gpus_per_node}); "
            f"{nodes} nodes would leave the rest idle")


def field_problem(name: str, value) -> str | None:
    """Why one plan field's value is outside its domain on its own (no model, no hardware), or
    None: what a swept or fixed value is held against before any point is priced."""
    if name in COUNT_FIELDS:
        return count_problem({name: value})
    if name == "zero" and value not in (0, 1, 2, 3):
        return f"zero must be 0, 1, 2 or 3, got {value!r}"
    choices = {"schedule": SCHEDULES, "recompute": RECOMPUTE, "dtype": DTYPES, "fp8_scaling": FP8_SCALINGS}.get(name)
    if choices and value not in choices:
        return f"{name} must be one of {', '.join(choices)}, got {value!r}"
    if name == "capacity_factor":
        return capacity_factor_problem(value)
    return None


def validate(plan: Plan) -> None:
    """Structural checks that need no model or hardware; each error names the fix."""
    problem = count_problem({name: getattr(plan, name) for name in (*COUNT_FIELDS, "nodes")})
    if problem:
        raise PlanError(problem)
    problem = expert_grid_problem(plan.ep, plan.tp, plan.cp, plan.dp) or capacity_factor_problem(plan.capacity_factor)
    if problem:
        raise PlanError(problem)
    problem = field_problem("schedule", plan.schedule)
    if problem:
        raise PlanError(problem)
    if plan.schedule == "interleaved":
        if plan.pp < 2 or plan.virtual_stages < 2:
            raise PlanError("the interleaved schedule needs pp >= 2 and v >= 2; use schedule=1f1b otherwise")
    elif plan.virtual_stages != 1:
        raise PlanError(f"v={plan.virtual_stages} needs schedule=interleaved; drop v or set schedule=interleaved")
    problem = field_problem("zero", plan.zero) or field_problem("dtype", plan.dtype)
    if problem:
        raise PlanError(problem)
    problem = grad_compress_problem(plan.grad_compress, plan.zero) or fp8_scaling_problem(plan.fp8_scaling, plan.dtype)
    if problem:
        raise PlanError(problem)
    per_step = plan.dp * plan.micro_batch
    if plan.global_batch % per_step:
        lower = max(per_step, plan.global_batch // per_step * per_step)
        raise PlanError(
            f"global batch {plan.global_batch} is not divisible by dp*mbs={per_step}; "
            f"use gbs={lower} or {lower + per_step} (global_batch in a plan file)"
        )
    if plan.schedule == "interleaved":
        problem = pipeline_fill_problem(plan.pp, plan.schedule, plan.num_microbatches, plan.dp, plan.micro_batch)
        if problem:
            raise PlanError(problem)
    if plan.stages:
        if len(plan.stages) != plan.num_model_chunks:
            raise PlanError(
                f"the plan lists {len(plan.stages)} stages but pp*v={plan.num_model_chunks}; "
                "fix the stage list or the degrees"
            )
        expected = 0
        for i, stage in enumerate(plan.stages):
            if stage.first_block != expected or stage.last_block <= stage.first_block:
                raise PlanError(
                    f"stage {i} covers blocks [{stage.first_block}, {stage.last_block}) but must start at "
                    f"block {expected} and hold at least one block; stages must be contiguous"
                )
            if stage.recompute not in RECOMPUTE:
                raise PlanError(f"stage {i}: recompute must be one of {', '.join(RECOMPUTE)}")
            if stage.recompute_blocks is not None and not 0 <= stage.recompute_blocks <= stage.num_blocks:
                raise PlanError(f"stage {i}: recompute_blocks must be between 0 and {stage.num_blocks}")
            expected = stage.last_block
