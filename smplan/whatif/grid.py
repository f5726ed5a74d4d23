"""The grid of a what-if sweep: `--vary KEY=V1,V2,...` items and the points they span.

A KEY is one of (checked in this order):
- `nodes`, `hw` (a profile name or path: compare GPU types), `stack` (a software stack name
  or path: compare frameworks), `seq_len`, `global_batch`
  (also `gbs`), `checkpoint_interval_min`;
- a plan dimension (`tp`, `pp`, `dp`, `mbs`, `recompute`, `schedule`, `v`, `sp`, `zero`,
  `overlap_dp`, `grad_compress`): fixed in the search at that value, or replaced in the --plan;
- a cluster dotted key (`inter_node.bandwidth_gbps`, `gpu.peak_tflops.bf16`,
  `reliability.gpu_mtbf_hours`, ... see `smplan.hwprofiles.settable_keys()`);
- a model argument: `arg.NAME`, or a parameter name of the model's builder.
"""

from __future__ import annotations

import difflib
import itertools
import math
from dataclasses import dataclass, field

from smplan.hwprofiles import HardwareProfileError, load_cluster, load_stack, settable_keys
from smplan.hwprofiles.loader import parse_scalar
from smplan.planner.plan import INLINE_KEYS, PlanError, field_problem, parse_inline

MAX_POINTS = 512
# every plan key but the global batch (its own axis) and the stage split (a list per chunk, fixed
# with --plan's stages=, not swept)
PLAN_KEYS = {k: v for k, v in INLINE_KEYS.items() if v not in ("global_batch", "stages")}
SPECIAL = ("nodes", "hw", "stack", "seq_len", "global_batch", "gbs", "checkpoint_interval_min")


class VaryError(ValueError):
    """A --vary item that cannot be swept; the message names the key or value and the fix."""


@dataclass(frozen=True)
class Vary:
    key: str  # as given (the label uses it)
    kind: str  # "nodes", "hw", "stack", "seq_len", "global_batch", "checkpoint", "plan", "cluster", "arg"
    target: str  # the field the value goes to: plan field, cluster key, builder argument
    values: tuple


@dataclass(frozen=True)
class PointSpec:
    """Everything one point needs besides the question's fixed inputs."""

    id: int
    settings: dict  # the varied values, KEY -> value, in --vary order
    hw: str | None = None
    stack: str | None = None
    nodes: int | None = None
    seq_len: int | None = None
    global_batch: int | None = None
    checkpoint_interval_min: float | None = None
    plan_keys: dict = field(default_factory=dict)  # plan field -> value
    cluster_overrides: dict = field(default_factory=dict)
    model_args: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return " ".join(f"{k}={fmt_value(v)}" for k, v in self.settings.items()) or "base"


def parse_vary(item: str, builder_accepts=None) -> Vary:
    """`KEY=V1,V2,...` -> Vary; `builder_accepts(name)` says whether the model takes an argument."""
    if "=" not in item:
        raise VaryError(f"--vary {item!r} needs the form KEY=V1,V2,..., e.g. --vary nodes=4,8,16")
    key, raw = (s.strip() for s in item.split("=", 1))
    texts = [v.strip() for v in raw.split(",")]
    if len(texts) > 1 and not texts[-1]:
        texts.pop()  # a trailing comma, as --plan takes one
    if not any(texts):
        raise VaryError(f"--vary {key}= lists no values; give at least one, e.g. {key}=1,2")
    if not all(texts):  # "1,,2": a value left out by mistake, not a two-point sweep
        raise VaryError(f"--vary {key}={raw} has an empty value between commas; list each value once, e.g. {key}=1,2")
    kind, target = classify(key, builder_accepts)
    values = tuple(_loaded(kind, t) if kind in ("hw", "stack") else _value(key, kind, t) for t in texts)
    if len(set(values)) != len(values):
        raise VaryError(f"--vary {key} lists a value twice: {raw}")
    return Vary(key, kind, target, values)


def classify(key: str, builder_accepts=None) -> tuple[str, str]:
    if key in ("nodes", "hw", "stack", "seq_len"):
        return key, key
    if key in ("global_batch", "gbs"):
        return "global_batch", "global_batch"
    if key == "checkpoint_interval_min":
        return "checkpoint", key
    if key in PLAN_KEYS:
        return "plan", PLAN_KEYS[key]
    if key in settable_keys():
        if key in ("nodes", "gpus_per_node", "name", "description", "gpu.name", "cost.source"):
            raise VaryError(f"--vary {key} is not a number to sweep; vary nodes or hw instead")
        return "cluster", key
    if key.startswith("arg."):
        return "arg", key[4:]
    if builder_accepts is not None and builder_accepts(key):
        return "arg", key
    known = [*SPECIAL, *PLAN_KEYS, *settable_keys()]
    near = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    raise VaryError(
        f"--vary key {key!r} is unknown; {hint}use nodes, hw, stack, global_batch, seq_len, checkpoint_interval_min, "
        f"a plan key ({', '.join(sorted(PLAN_KEYS))}), a hardware key (smplan hw show NAME), or arg.NAME "
        "for a model argument"
    )


def _loaded(kind: str, text: str) -> str:
    """A profile (hw) or stack name or .toml path, loaded now so that a typo is an error, not
    an "infeasible" point in the report."""
    try:
        (load_cluster if kind == "hw" else load_stack)(text)
    except HardwareProfileError as err:
        raise VaryError(f"--vary {kind}: {err}") from None
    return text


def _plan_value(key: str, text: str):
    """A plan key's value as `--plan`/`--fix` read it (whole numbers, 0/1 flags, the named
    choices), held against the key's domain: a typo is an error, not an "infeasible" point."""
    name = PLAN_KEYS[key]
    if name == "grad_compress":
        from smplan.planner.grad_compress import parse as parse_grad_compress

        try:
            return str(parse_grad_compress(text))
        except ValueError as err:
            raise VaryError(f"--vary grad_compress: {err}") from None
    try:
        value = parse_inline(f"{key}={text}")[name]
    except PlanError as err:
        raise VaryError(f"--vary {key}: {str(err).removeprefix('plan key ')}") from None
    problem = field_problem(name, value)
    if problem:
        raise VaryError(f"--vary {key}: {problem}")
    return value


def _value(key: str, kind: str, text: str):
    if kind == "plan":
        return _plan_value(key, text)
    value = parse_scalar(text)
    if isinstance(value, float) and not math.isfinite(value):
        raise VaryError(f"--vary {key} values must be finite numbers, got {text!r}")
    whole = kind in ("nodes", "seq_len", "global_batch")
    if isinstance(value, float) and whole and value == int(value):
        value = int(value)
    if whole and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise VaryError(f"--vary {key} values must be whole numbers >= 1, got {text!r}")
    if kind == "cluster" and isinstance(value, str):
        # a text key (efficiency.ep_dispatcher, attention_kernel...): checked as --hw-set checks it,
        # on a bundled profile (the choices do not depend on the hardware)
        try:
            load_cluster("a100x8", overrides={key: value})
        except HardwareProfileError as err:
            raise VaryError(f"--vary {key}: {str(err).removeprefix('--hw-set: ')}") from None
        return value
    if kind in ("cluster", "checkpoint") and not isinstance(value, int | float):
        raise VaryError(f"--vary {key} values must be numbers, got {text!r}")
    if kind == "checkpoint" and value <= 0:
        raise VaryError(f"--vary checkpoint_interval_min values must be > 0 minutes, got {text!r}")
    return value


def grid(varies: list[Vary]) -> list[PointSpec]:
    """The cartesian product of the --vary items, first item slowest."""
    keys = [v.key for v in varies]
    twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if twice is not None:
        raise VaryError(f"--vary {twice} is given twice; list all its values in one --vary {twice}=V1,V2")
    total = 1
    for v in varies:
        total *= len(v.values)
    if total > MAX_POINTS:
        raise VaryError(f"the sweep has {total} points (limit {MAX_POINTS}); vary fewer values")
    specs = []
    for i, combo in enumerate(itertools.product(*(v.values for v in varies))):
        kw: dict = {"plan_keys": {}, "cluster_overrides": {}, "model_args": {}}
        settings = {}
        for v, value in zip(varies, combo, strict=True):
            settings[v.key] = value
            if v.kind in ("nodes", "hw", "stack", "seq_len", "global_batch"):
                kw[v.kind] = value
            elif v.kind == "checkpoint":
                kw["checkpoint_interval_min"] = float(value)
            elif v.kind == "plan":
                kw["plan_keys"][v.target] = value
            elif v.kind == "cluster":
                kw["cluster_overrides"][v.target] = value
            else:
                kw["model_args"][v.target] = value
        specs.append(PointSpec(id=i, settings=settings, **kw))
    return specs or [PointSpec(id=0, settings={})]


def fmt_value(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
