"""The JSON schema of a plan file, checked before a Plan is built.

Every problem is one line naming the key, what was given and what is expected; all of them
are collected and raised as one PlanError. Unknown keys are rejected (naming the nearest
known key, as the hardware TOML loader names the known ones). A plan FILE must give the
shape keys (`REQUIRED`), and one stating version 2 the layout keys (`REQUIRED_V2`); the rest
have the defaults of the Plan dataclass. Keys that
`Plan.to_dict` derives (`recompute`, `num_microbatches`, `stage_blocks`) are accepted and
must agree with the plan.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import sys

REQUIRED = ("model", "hw", "nodes", "dp", "tp", "pp", "micro_batch", "global_batch")
# What a file stating "version": 2 must also give: the layout keys `smplan plan -o` writes, whose
# default would run another plan than the one planned (review: a deleted "cp" of a cp=2 plan
# read as cp=1 and failed on the node count; a deleted "zero" re-priced it at ZeRO-0). A file
# without "version" is a hand-written one: those keys take the Plan dataclass's defaults.
REQUIRED_V2 = ("ep", "cp", "zero", "schedule", "virtual_stages", "sequence_parallel", "dtype")
DERIVED = ("recompute", "num_microbatches", "stage_blocks")
# Llama 4 Scout (Meta, 2025) has the longest published context, 10M tokens; a longer seq_len
# is a typo, and the profiler's example batch (seq_len tokens) would take its memory for real.
MAX_SEQ_LEN = 2**24
# A parallel degree (dp, tp, pp, ep, cp, v) is at most the GPUs of the largest cluster anyone plans;
# 2**20 (a million GPUs): a typo guard, so that a hint never suggests an absurd batch.
MAX_DEGREE = 2**20
# --nodes: a million nodes, past any cluster built (chosen: a typo guard; the search would take minutes)
MAX_NODES = 2**20
# --global-batch: 2**24 sequences a step, 256x the largest published batch in sequences (LAMB's
# 65,536, You et al. 2019); more is a typo whose micro-batch schedule would not fit in memory.
MAX_GLOBAL_BATCH = 2**24
# every whole-number field's cap, for a plan file's values and inline keys alike (plan.count_problem)
COUNT_CAPS = {"nodes": MAX_NODES, "dp": MAX_DEGREE, "tp": MAX_DEGREE, "pp": MAX_DEGREE, "ep": MAX_DEGREE,
              "cp": MAX_DEGREE, "virtual_stages": MAX_DEGREE, "micro_batch": MAX_GLOBAL_BATCH,
              "global_batch": MAX_GLOBAL_BATCH, "num_microbatches": MAX_GLOBAL_BATCH}
REGENERATE = "regenerate the plan with `smplan plan -o plan.json`"


class _Problems(list):
    def add(self, key: str, value, expected: str) -> None:
        self.append(f"{key}: got {_given(value)}, expected {expected}")


def _given(value) -> str:
    kind = {dict: "an object", list: "a list", str: "text", bool: "a boolean", type(None): "null"}.get(type(value))
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{text} ({kind})" if kind and value is not None else text


def _name(key: str) -> str:
    """A key as a message shows it: quoted (JSON escapes) when it is empty, has control
    characters or line breaks, or starts or ends with spaces, so every problem stays one line."""
    return key if key and key.isprintable() and key.strip() == key else json.dumps(key)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    # abs() <= the largest float is False for NaN and infinities, and compares a huge int exactly
    return isinstance(value, int | float) and not isinstance(value, bool) and abs(value) <= sys.float_info.max


def _whole(p: _Problems, key: str, value, minimum: int, maximum: int | None = None):
    if not _is_int(value) or value < minimum or (maximum is not None and value > maximum):
        p.add(key, value, f"a whole number >= {minimum}" + (f" and <= {maximum}" if maximum is not None else ""))
        return None
    return value


def _capacity(p: _Problems, key: str, value):
    from .feasibility import MAX_CAPACITY_FACTOR

    if not _is_number(value) or not 0 < value <= MAX_CAPACITY_FACTOR:
        p.add(key, value, f"a number in (0, {MAX_CAPACITY_FACTOR:g}] (1.0 = balanced routing)")
        return None
    return float(value)


def _grad_compress(p: _Problems, key: str, value):
    from .grad_compress import parse

    try:
        return str(parse(value))
    except ValueError:
        p.add(key, value, '"none", "bf16" or "powersgd:R" (R a whole number >= 1)')
        return None


def _text(p: _Problems, key: str, value):
    if not isinstance(value, str) or not value:
        p.add(key, value, "non-empty text")
        return None
    return value


def _choice(p: _Problems, key: str, value, options):
    if value not in options or not isinstance(value, str | int) or isinstance(value, bool):
        p.add(key, value, "one of " + ", ".join(json.dumps(o) for o in options))
        return None
    return value


def _boolean(p: _Problems, key: str, value):
    if isinstance(value, bool):
        return value
    if _is_int(value) and value in (0, 1):
        return bool(value)
    p.add(key, value, "true or false (or 0 / 1)")
    return None


def _scalars(p: _Problems, key: str, value, allow_null: bool):
    if not isinstance(value, dict):
        p.add(key, value, "an object of key: value")
        return None
    ok = (str, int, float, bool) + ((type(None),) if allow_null else ())
    for k, v in value.items():
        if not isinstance(v, ok) or (isinstance(v, float) and not math.isfinite(v)):
            p.add(f"{key}.{_name(k)}", v, "a number, true/false or text")
    return dict(value)


def _unknown(p: _Problems, where: str, data: dict, known) -> None:
    for key in data:
        if key in known:
            continue
        near = difflib.get_close_matches(str(key), list(known), n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"known keys: {', '.join(known)}"
        p.append(f"{where}{_name(key)}: unknown key; {hint}")


def _stages(p: _Problems, value):
    from .plan import RECOMPUTE, Stage

    if not isinstance(value, list | tuple):  # a tuple when the dict comes from Plan.to_dict in memory
        p.add("stages", value, "a list of {first_block, last_block, recompute, recompute_blocks}")
        return None
    known = [f.name for f in dataclasses.fields(Stage)]
    out, before = [], len(p)
    for i, entry in enumerate(value):
        key = f"stages[{i}]"
        if isinstance(entry, Stage):
            entry = dataclasses.asdict(entry)
        if not isinstance(entry, dict):
            p.add(key, entry, "an object {first_block, last_block, recompute, recompute_blocks}")
            continue
        _unknown(p, key + ".", entry, known)
        kw = {}
        for name, minimum in (("first_block", 0), ("last_block", 1)):
            if name not in entry:
                p.append(f"{key}.{name}: missing, expected a whole number >= {minimum}")
            else:
                kw[name] = _whole(p, f"{key}.{name}", entry[name], minimum)
        if "recompute" in entry:
            kw["recompute"] = _choice(p, f"{key}.recompute", entry["recompute"], RECOMPUTE)
        if entry.get("recompute_blocks") is not None:
            kw["recompute_blocks"] = _whole(p, f"{key}.recompute_blocks", entry["recompute_blocks"], 0)
        if len(p) == before:
            out.append(Stage(**kw))
    return tuple(out) if len(p) == before else None


def _figures(p: _Problems, value):
    from .plan import Figures

    if value is None:
        return None
    if not isinstance(value, dict):
        p.add("predicted", value, "an object of predicted figures, or null")
        return None
    fields = {f.name: f for f in dataclasses.fields(Figures)}
    _unknown(p, "predicted.", value, list(fields))
    before = len(p)
    kw = {}
    for name, f in fields.items():
        key = f"predicted.{name}"
        if name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                p.append(f"{key}: missing, expected a number")
            continue
        v = value[name]
        if name in ("breakdown", "memory_breakdown_gib"):
            if not isinstance(v, dict) or not all(_is_number(x) for x in v.values()):
                p.add(key, v, "an object of name: number")
            kw[name] = v
        elif not _is_number(v):
            p.add(key, v, "a number")
        else:
            kw[name] = float(v)
    return Figures(**kw) if len(p) == before else None


def _version(p: _Problems, value):
    from .plan import PLAN_VERSION, READABLE_VERSIONS

    if value not in READABLE_VERSIONS or not _is_int(value):
        p.add("version", value, f"{PLAN_VERSION} (this smplan reads plan versions "
              f"{', '.join(map(str, READABLE_VERSIONS))})")
    return None


def check_plan_dict(data, source: str = "plan") -> dict:
    """Plan keyword arguments from a plan's JSON object; raise PlanError listing every problem."""
    from .plan import DTYPES, FP8_SCALINGS, RECOMPUTE, SCHEDULES, Plan

    p = _Problems()
    if not isinstance(data, dict):
        p.add("the plan", data, "one JSON object")
        raise _error(source, p)
    fields = [f.name for f in dataclasses.fields(Plan)]
    _unknown(p, "", data, fields + list(DERIVED))
    for key in REQUIRED:
        if key not in data:
            p.append(f"{key}: missing; a plan file must give it")
    if data.get("version") == 2:
        for key in REQUIRED_V2:
            if key not in data:
                p.append(f"{key}: missing; a version-2 plan file gives every layout key (without \"version\" "
                         "it takes the default)")
    check = {
        "model": _text,
        "hw": _text,
        "nodes": lambda p, k, v: _whole(p, k, v, 1, COUNT_CAPS[k]),
        "dp": lambda p, k, v: _whole(p, k, v, 1, COUNT_CAPS[k]),
        "tp": lambda p, k, v: _whole(p, k, v, 1, COUNT_CAPS[k]),
        "pp": lambda p, k, v: _whole(p, k, v, 1, COUNT_CAPS[k]),
        "ep": lambda p, k, v: _whole(p, k, v, 1, COUNT_CAPS[k]),
        "cp": lambda p, k, v: _whole(p, k, v, 1, COUNT_CAPS[k]),
        "capacity_factor": lambda p, k, v: _capacity(p, k, v),
        "micro_batch": lambda p, k, v: _whole(p, k, v, 1, COUNT_CAPS[k]),
        "global_batch": lambda p, k, v: _whole(p, k, v, 1, COUNT_CAPS[k]),
        "virtual_stages": lambda p, k, v: _whole(p, k, v, 1, COUNT_CAPS[k]),
        "schedule": lambda p, k, v: _choice(p, k, v, SCHEDULES),
        "zero": lambda p, k, v: _choice(p, k, v, (0, 1, 2, 3)),
        "sequence_parallel": _boolean,
        "overlap_dp": _boolean,
        "dtype": lambda p, k, v: _choice(p, k, v, DTYPES),
        "grad_compress": _grad_compress,
        "fp8_scaling": lambda p, k, v: _choice(p, k, v, FP8_SCALINGS),
        "stages": lambda p, k, v: _stages(p, v),
        "model_args": lambda p, k, v: _scalars(p, k, v, allow_null=True),
        "seq_len": lambda p, k, v: None if v is None else _whole(p, k, v, 1, MAX_SEQ_LEN),
        "hw_overrides": lambda p, k, v: _scalars(p, k, v, allow_null=False),
        "stack": _text,
        "predicted": lambda p, k, v: _figures(p, v),
        "version": lambda p, k, v: _version(p, v),
        "recompute": lambda p, k, v: _choice(p, k, v, RECOMPUTE),
        "num_microbatches": lambda p, k, v: _whole(p, k, v, 1, COUNT_CAPS[k]),
        "stage_blocks": lambda p, k, v: v,
    }
    kwargs = {}
    for key, value in data.items():
        if key in check:
            parsed = check[key](p, key, value)
            if key in fields and key != "version":
                kwargs[key] = parsed
    if p:
        raise _error(source, p)
    return kwargs


def check_derived(plan, data: dict, source: str = "plan") -> None:
    """The derived keys a plan file gives must agree with the plan they describe."""
    p = _Problems()
    derived = plan.to_dict()
    how = {"recompute": "the strongest of the stages' recompute",
           # name the sum, so that an edited dp (or mbs, gbs) points at the key that moved
           "num_microbatches": f"global_batch / (dp x micro_batch) = {plan.global_batch} / ({plan.dp} x "
                               f"{plan.micro_batch})"}
    for key, expected in (("recompute", derived["recompute"]), ("num_microbatches", derived["num_microbatches"])):
        if key in data and data[key] != expected:
            p.add(key, data[key], f"{json.dumps(expected)} ({how[key]}, derived from the plan; drop the key or "
                                  "fix the plan)")
    if "stage_blocks" in data and data["stage_blocks"] != derived["stage_blocks"]:
        if not data.get("stages"):  # the stages were dropped, not the split edited: say which key is gone
            wanted = ("the stages that stage_blocks lists (each chunk's first_block, last_block, recompute, "
                      "recompute_blocks); drop stage_blocks too for an even split")
            if "stages" in data:
                p.add("stages", data["stages"], wanted)
            else:
                p.append(f"stages: missing, expected {wanted}")
        else:
            # either may be the edit (a review's stages[0].last_block = 9 was blamed on stage_blocks): name both
            p.add("stage_blocks", data["stage_blocks"],
                  f"{json.dumps(derived['stage_blocks'])}, what stages give (each chunk's first_block and "
                  "last_block); fix whichever of the two was edited by mistake, or drop stage_blocks to keep stages")
    if p:
        raise _error(source, p)


def _error(source: str, problems: list[str]):
    from .plan import PlanError

    if len(problems) == 1:
        return PlanError(f"{source}: {problems[0]}; fix it or {REGENERATE}")
    lines = "".join(f"\n  - {problem}" for problem in problems)
    return PlanError(f"{source} has {len(problems)} problems; fix them or {REGENERATE}:{lines}")
