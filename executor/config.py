"""RunConfig: everything a worker process needs, written once by the launcher as JSON."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from smplan.planner.model_file import split_ref
from smplan.planner.plan import Plan

from .recipe import DEFAULT_DECAY_FRACTION, Recipe

FAIL_ENV = "SMPLAN_FAIL_AT_STEP"  # test hook: SIGKILL one rank at the start of this step
FAIL_RANK_ENV = "SMPLAN_FAIL_RANK"
SLOW_ENV = "SMPLAN_SLOW_RANK"  # test hook: "RANK:SECONDS", that rank sleeps this long every step


@dataclass
class RunConfig:
    plan: dict
    model_ref: str
    out_dir: str
    steps: int = 10
    seed: int = 0
    # chosen defaults for short checks on small models (torch.optim.AdamW's default weight decay, GPT-3's clip of 1.0,
    # Brown et al. 2020 appendix B)
    lr: float = 1e-3
    weight_decay: float = 0.01
    clip: float = 1.0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0  # 0: no checkpoints
    keep_checkpoints: int = 0  # the newest K step-N checkpoints stay after each save; 0: all
    force_resume: bool = False
    fail_at_step: int | None = None
    fail_rank: int | None = None  # None: the last rank
    # how long a collective waits for a rank that stopped taking part: torch's NCCL default and
    # Megatron-LM's --distributed-timeout-minutes (10 min); checkpoint saves on a slow shared file
    # system hold every rank at DCP's gathers and barriers for as long as the slowest writer
    collective_timeout_s: float = 600.0
    fingerprint: str = ""
    fingerprint_inputs: dict = dataclasses.field(default_factory=dict)  # what the fingerprint hashes (checkpoint meta keeps it)
    tensorboard: bool = False  # RUN_DIR/tensorboard event files (rank 0)
    grad_norms_every: int = 10  # per-block gradient norms every K steps; 0: never
    slow_rank: str | None = None  # test hook, see SLOW_ENV
    # the training recipe (executor/recipe.py); lr, weight_decay and clip above are its base values
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    decay_fraction: float = DEFAULT_DECAY_FRACTION
    adam_betas: tuple[float, float] = (0.9, 0.999)
    # token data from disk (executor/token_data.py); None: the model file's batch()/data()
    data: str | None = None
    data_bytes: int | None = None  # --data's size when the run started: a continuation refuses another file there
    data_digest: str | None = None  # and its sampled content (token_data.stream_digest): a same-size rewrite too
    data_dtype: str = "uint16"
    val_data: str | None = None
    eval_every: int = 0  # 0: no validation
    eval_batches: int = 4
    data_seq_len: int | None = None  # resolved before launch: plan.seq_len or the model's batch()
    vocab: int | None = None
    init_from: str | None = None  # --init-from, resolved (executor/init_from.py); a fresh run starts from it
    # --reference-batch / --lr-scaling (executor/lr_scaling.py): lr and min_lr above are already
    # multiplied by lr_scale; the --lr given is lr / lr_scale
    reference_batch: int | None = None
    lr_scaling: str | None = None
    lr_scale: float = 1.0

    def recipe(self) -> Recipe:
        return Recipe(lr=self.lr, schedule=self.lr_schedule, total_steps=self.steps, warmup_steps=self.warmup_steps,
                      min_lr=self.min_lr, decay_fraction=self.decay_fraction, weight_decay=self.weight_decay,
                      betas=tuple(self.adam_betas), grad_clip=self.clip)

    def plan_obj(self) -> Plan:
        return Plan.from_dict(self.plan)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @staticmethod
    def load(path: str | Path) -> RunConfig:
        return RunConfig(**json.loads(Path(path).read_text()))


class HookError(ValueError):
    """A test hook's setting is malformed (one line, exit 2, like any user error)."""


def parse_slow_rank(text: str | None) -> tuple[int, float] | None:
    """"1:0.3" -> (1, 0.3): rank 1 sleeps 0.3 s per step (the straggler test hook)."""
    if not text:
        return None
    rank, _, seconds = text.partition(":")
    try:
        parsed = int(rank), float(seconds)
    except ValueError:
        parsed = None
    if parsed is None or parsed[0] < 0 or parsed[1] < 0:
        raise HookError(f"{SLOW_ENV}={text!r} must be RANK:SECONDS, e.g. 1:0.3")
    return parsed


# Plan fields that change what is computed; predicted figures, hardware and node counts
# do not (a checkpoint moves between clusters; DCP reshards it). "model" counts as its builder.
_FINGERPRINT_FIELDS = ("model", "model_args", "seq_len")


def fingerprint(plan: Plan, model_sha256: str) -> str:
    """What a checkpoint must match to be resumed: the model file's bytes, its arguments and
    the whole parallel layout (DCP could reshard across layouts; --force-resume allows it)."""
    return hash_key(fingerprint_inputs(plan, model_sha256))


def fingerprint_inputs(plan: Plan, model_sha256: str) -> dict:
    """The key fingerprint() hashes, as JSON holds it (a checkpoint's meta keeps it, so a
    refusal can say what changed)."""
    return as_json(_fingerprint_key(plan, model_sha256))


def _fingerprint_key(plan: Plan, model_sha256: str) -> dict:
    data = plan.to_dict()
    key = {k: data[k] for k in _FINGERPRINT_FIELDS}
    # The file by its bytes (model_sha256) and its builder, not by the path it was reached by:
    # a plan run from its own folder and resumed from another names it two ways.
    key["model"] = split_ref(plan.model)[1]
    key["layout"] = {k: data[k] for k in ("dp", "tp", "pp", "micro_batch", "global_batch", "schedule",
                                          "virtual_stages", "zero", "sequence_parallel", "stage_blocks")}
    key["layout"].update({k: data[k] for k, default in _LATER_KEYS.items() if data.get(k, default) != default})
    key["model_sha256"] = model_sha256
    return key


# Plan keys the fingerprint gained later (a review resumed an ep=1 checkpoint as ep=2 unasked, and a
# PowerSGD run's error feedback would be dropped): each counts only away from its default, so a
# checkpoint of a plan that leaves them at it keeps its fingerprint and resumes as before. Not dtype:
# an inline plan's bf16 and a probed CPU's plan file's fp32 both compute in fp32 on a CPU.
_LATER_KEYS = {"ep": 1, "cp": 1, "grad_compress": "none"}


def continued_inputs(meta: dict, plan: Plan, model_sha256: str, inputs: dict) -> tuple[dict, str, dict]:
    """(inputs, fingerprint, compared) of a run that continues the checkpoint whose meta is `meta`.

    This run's `inputs`, or where the checkpoint has the fingerprint smplan computed before
    _LATER_KEYS and the trained sequence length joined it (from `plan` as given: an inline plan's
    seq_len null) and its plan has the _LATER_KEYS this one has, those older inputs, so its
    checkpoints resume, prune and fall back as before (a later key changed since, ep=1 -> 2, hashes
    alike in the older definition: refused). `compared`: what a refusal holds against the
    checkpoint's inputs to say what changed, in the older definition's terms for an older checkpoint
    (not "seq_len null -> 16"), with the _LATER_KEYS that did change."""
    ours, theirs = hash_key(inputs), meta.get("fingerprint")
    if theirs is None or theirs == ours:
        return inputs, ours, inputs
    older, changed = _older_inputs(plan, model_sha256), _later_keys_changed(meta, plan)
    if hash_key(older) == theirs and changed == []:  # None: unknown, so refused
        return older, theirs, older
    their_inputs = meta.get("fingerprint_inputs")
    if (isinstance(their_inputs, dict) and their_inputs.get("seq_len") == older.get("seq_len")
            and not _LATER_KEYS.keys() & (their_inputs.get("layout") or {}).keys()):
        data = plan.to_dict()
        older["layout"].update({k: data[k] for k in changed or ()})
        return inputs, ours, older
    return inputs, ours, inputs


def _later_keys_changed(meta: dict, plan: Plan) -> list[str] | None:
    """The _LATER_KEYS whose value in the checkpoint's plan (meta["plan"], kept since before they
    joined the fingerprint) differs from `plan`'s; None where the meta keeps no plan (unknown)."""
    theirs = meta.get("plan")
    if not isinstance(theirs, dict):
        return None
    data = plan.to_dict()
    return [k for k, default in _LATER_KEYS.items() if theirs.get(k, default) != data.get(k, default)]


def _older_inputs(plan: Plan, model_sha256: str) -> dict:
    """What smplan hashed before _LATER_KEYS and the trained sequence length joined: `plan` as given."""
    older = _fingerprint_key(plan, model_sha256)
    for key in _LATER_KEYS:
        older["layout"].pop(key, None)
    return as_json(older)


def hash_key(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def as_json(key: dict) -> dict:
    return json.loads(json.dumps(key, sort_keys=True, default=str))


# Named first in a refusal, in this order; a changed model file says so in words, not hashes.
_CHANGE_ORDER = ("layout", "model_args", "seq_len", "model", "model_sha256")
MAX_CHANGES_NAMED = 4  # one readable line; the rest are counted
_MAX_VALUE_CHARS = 24  # a value longer than this (a stage_blocks list) is cut


def describe_changes(theirs: dict, ours: dict) -> str:
    """What differs between a checkpoint's fingerprint inputs and this run's, in one line:
    "layout: dp 2 -> 1, tp 1 -> 2; the model file's contents differ (an edited file, or another one)" (checkpoint -> run)."""
    changes = [(key, item) for key in sorted(theirs.keys() | ours.keys(), key=_change_rank)
               for item in _changes(key, theirs.get(key), ours.get(key))]
    named, groups = changes[:MAX_CHANGES_NAMED], {}
    for key, item in named:
        groups.setdefault(key, []).append(item)
    parts = [f"{key}: {', '.join(items)}" if key in ("layout", "model_args") else items[0]
             for key, items in groups.items()]
    more = len(changes) - len(named)
    return "; ".join(parts) + (f"; and {more} more" if more else "")


def _change_rank(key: str) -> tuple[int, str]:
    return (_CHANGE_ORDER.index(key) if key in _CHANGE_ORDER else len(_CHANGE_ORDER), key)


def _changes(key: str, theirs, ours) -> list[str]:
    if theirs == ours:
        return []
    if key == "model_sha256":
        return ["the model file's contents differ (an edited file, or another one)"]
    if key == "model":
        return [f"builder {_shown(theirs)} -> {_shown(ours)}"]
    if isinstance(theirs, dict) and isinstance(ours, dict):
        pairs = [(name, _item(key, theirs, name), _item(key, ours, name)) for name in sorted(theirs.keys() | ours.keys())]
        return [f"{name} {_shown(a)} -> {_shown(b)}" for name, a, b in pairs if a != b]
    return [f"{key} {_shown(theirs)} -> {_shown(ours)}"]


_UNSET = object()


def _item(key: str, inputs: dict, name: str):
    """`inputs[name]`; a layout's _LATER_KEYS, left out at their default, are that default."""
    default = _LATER_KEYS.get(name, _UNSET) if key == "layout" else _UNSET
    return inputs.get(name, default)


def _shown(value) -> str:
    if value is _UNSET:
        return "(unset)"
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[:_MAX_VALUE_CHARS - 1] + "…"
