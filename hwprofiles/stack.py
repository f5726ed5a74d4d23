"""Software-stack profiles: what the training framework decides, not the GPU.

A stack (Megatron-Core, torchtitan, PyTorch FSDP, Megatron-DeepSpeed) sets:

- `host_overhead_us_per_layer`: CPU time to launch one layer pass (eager Python, CUDA graphs);
- `host_overhead_us_per_moe_layer`: the extra CPU time of a routed-expert layer pass (router,
  token permutation, the dispatcher's host sync, grouped expert GEMMs);
- `elementwise_fusion`: share of the fusible element-wise traffic its kernels keep on chip;
- `overlap_grad_reduce`: whether the DP gradient reduce overlaps backward, the planner's
  default for a plan's `overlap_dp` when the user does not fix it;
- `attention_kernel`: the fused attention kernel SDPA-style attention runs on ("flash1",
  "flash2", "cudnn"), timed at the GPU's published rate for it (`gpu.attention`);
- `zero3_max_live_params`: ZeRO-3 parameters gathered at once, at most (0: FSDP's whole
  units, two at a time; DeepSpeed's `stage3_max_live_parameters`);
- `single_nic_network`: the share of one GPU's NIC that the layer-by-layer collectives of
  ZeRO-2/3 / FSDP reach across nodes (small per-module messages in DeepSpeed, one flat
  parameter per block in FSDP);
- `zero_collectives`: how those layer-by-layer collectives cross nodes: "per_nic" (each GPU's
  own NIC, at `single_nic_network`: DeepSpeed) or "ring" (NCCL's multi-rail ring: FSDP);
- `zero_granularity`: what one ZeRO-1/2 step collective covers: "bucket" (Megatron's distributed
  optimizer, DeepSpeed: many blocks per collective) or "block" (FSDP / FSDP2: one per block);
- `tp_comm_overlap`: the share of the sequence-parallel TP collectives hidden under the linear
  GEMMs (Transformer Engine userbuffers; torchtitan's async TP);
- `ep_a2a_overlap`: the share of the expert all-to-alls hidden behind the paired micro-batch's
  compute (Megatron-Core's EP A2A overlap; 0 where the framework waits for each one);
- `ep_dispatcher`: how the expert dispatch / combine crosses nodes: "all_to_all" (NCCL; every
  token copy crosses) or "node_dedup" (DeepEP / HybridEP: once per destination node, then NVLink);
- `cp_comm`: how context parallelism moves K/V: "all_gather" (NCCL collectives: torchtitan,
  Llama 3, smplan execute) or "p2p" (Transformer Engine's ring: Megatron-Core);
- `grad_reduce_dtype`: the dtype gradients cross the data-parallel group in: "weights" (bf16 /
  fp16 under mixed precision) or "fp32" (torchtitan's FSDP2 `reduce_dtype`), twice the bytes;
- `pp_send`: what a tp rank sends to the next pipeline stage without sequence parallelism:
  "full" (its whole activation: Megatron-Core, torch pipelining) or "tp_slice" (1/tp of it:
  2021 Megatron-LM's scatter/gather, Narayanan et al. 2021, section 4.1);
- `sp_saved_input`: what sequence parallelism keeps of the input a column-parallel linear
  gathers to full length: "shard" (the local slice, gathered again in backward: Megatron,
  Korthikanti et al. 2022, section 4.2.2) or "gathered" (the whole gathered tensor: DTensor's
  autograd under torchtitan's and smplan execute's TP plans);
- `cross_entropy`: how the loss's memory peaks on the last stage: "in_place" (Megatron's
  vocab-parallel cross-entropy, one fp32 copy of the logits reused in place) or "traced" (the
  model file's loss as it runs, its peak measured by the profiler: torchtitan, smplan execute).

All but `overlap_grad_reduce` are `Efficiency` fields of the Cluster (`STACK_KEYS`); `with_stack` puts a
stack's values there. Bundled stacks are TOML files in `hwprofiles/stacks/`; `--stack
NAME|PATH` loads one (`load_stack`), default `megatron-core` (`DEFAULT_STACK`), and the plan
file records it (`Plan.stack`).

Precedence, lowest first, for each key a stack sets (`loader.load_cluster` applies it):

1. the hardware profile (the `Efficiency` defaults; no bundled hardware file states these keys);
2. the stack;
3. `--hw-set efficiency.KEY=VALUE`: an explicit per-run override always wins.

A hardware file that states a stack key in its own `[efficiency]` table (a profile written
by `smplan calibrate`, which fits `host_overhead_us_per_layer` on the machine) keeps that
value over the default stack, whether megatron-core is named or not; any other stack, given
with `--stack` or recorded in a plan file, replaces it. The rule depends only on which stack
is in effect, so a plan file read back simulates as it was planned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .cluster import (
    ATTENTION_KERNELS,
    CP_COMMS,
    CROSS_ENTROPIES,
    EP_DISPATCHERS,
    GRAD_REDUCE_DTYPES,
    MAX_NUMBER,
    PP_SENDS,
    PROBED_NAMES,
    SP_SAVED_INPUTS,
    ZERO_COLLECTIVES,
    ZERO_GRANULARITIES,
    Cluster,
    Efficiency,
    HardwareProfileError,
)
from .paths import did_you_mean, is_path, looks_like_folder, read_toml, same_toml, toml_path

STACK_DIR = Path(__file__).parent / "stacks"
DEFAULT_STACK = "megatron-core"
# The Efficiency fields a stack sets (the rest of [efficiency] is the hardware's).
STACK_KEYS = ("host_overhead_us_per_layer", "host_overhead_us_per_moe_layer", "elementwise_fusion",
              "attention_kernel", "zero3_max_live_params", "single_nic_network", "zero_collectives", "zero_granularity",
              "tp_comm_overlap", "ep_a2a_overlap", "ep_dispatcher", "cp_comm", "grad_reduce_dtype", "pp_send",
              "sp_saved_input", "cross_entropy")


# A CUDA kernel launch alone takes a few microseconds of CPU time (3.8 us per short kernel launched
# back to back: NVIDIA technical blog, "Getting Started with CUDA Graphs", 2019), and a layer pass
# launches dozens: a positive host time below 1 us is seconds or milliseconds typed as microseconds.
MIN_HOST_OVERHEAD_US = 1.0
# Above 0.1 s a layer pass: ~100x eager Megatron-DeepSpeed's fitted 1,075 us (megatron-deepspeed.toml),
# a unit slip rather than a stack (chosen bound)
MAX_HOST_OVERHEAD_US = 1e5
# The keys in microseconds a stack (or a hardware file's [efficiency] table) may state.
US_KEYS = ("host_overhead_us_per_layer", "host_overhead_us_per_moe_layer")


class StackError(HardwareProfileError):
    """A stack name, file or value the user gave is wrong; the message says how to fix it."""


@dataclass(frozen=True)
class Stack:
    name: str
    description: str
    host_overhead_us_per_layer: float  # CPU launch time per layer pass; overlaps GPU work
    elementwise_fusion: float  # 0: eager PyTorch, 1: every fusible element-wise chain fused
    overlap_grad_reduce: bool  # DP gradient reduce overlapped with backward (the plan's overlap_dp default)
    # Optional in a file: then the hardware-side default (Efficiency's).
    host_overhead_us_per_moe_layer: float = Efficiency.host_overhead_us_per_moe_layer
    attention_kernel: str = Efficiency.attention_kernel
    zero3_max_live_params: float = Efficiency.zero3_max_live_params
    single_nic_network: float = Efficiency.single_nic_network
    zero_collectives: str = Efficiency.zero_collectives
    zero_granularity: str = Efficiency.zero_granularity
    tp_comm_overlap: float = Efficiency.tp_comm_overlap
    ep_a2a_overlap: float = Efficiency.ep_a2a_overlap
    ep_dispatcher: str = Efficiency.ep_dispatcher
    cp_comm: str = Efficiency.cp_comm
    grad_reduce_dtype: str = Efficiency.grad_reduce_dtype
    pp_send: str = Efficiency.pp_send
    sp_saved_input: str = Efficiency.sp_saved_input
    cross_entropy: str = Efficiency.cross_entropy
    source: str = ""  # where it was read: "bundled stack 'megatron-core'" or "stack file 'PATH'"

    def efficiency(self) -> dict[str, float | str]:
        """The `Efficiency` fields this stack sets."""
        return {key: getattr(self, key) for key in STACK_KEYS}


# TOML keys: the dataclass fields but `source`, which the loader sets.
_REQUIRED = ("host_overhead_us_per_layer", "elementwise_fusion", "overlap_grad_reduce")
_KEYS = ("name", "description", *_REQUIRED, "host_overhead_us_per_moe_layer", "attention_kernel",
         "zero3_max_live_params", "single_nic_network", "zero_collectives", "zero_granularity", "tp_comm_overlap",
         "ep_a2a_overlap",
         "ep_dispatcher", "cp_comm", "grad_reduce_dtype", "pp_send", "sp_saved_input",
         "cross_entropy")


# Keys only a stack file has at its top level (a hardware file states them under [efficiency]),
# and the tables only a hardware file has: each tells a file passed to the wrong option.
STACK_ONLY_KEYS = frozenset(_KEYS) - {"name", "description"}
HARDWARE_ONLY_TABLES = frozenset({"gpu", "intra_node", "inter_node", "reliability", "cost"})


def bundled_stacks() -> list[str]:
    return sorted(p.stem for p in STACK_DIR.glob("*.toml"))


def same_stack(a: str, b: str) -> bool:
    """Whether two --stack values name one stack file (a bundled name, a path to it)."""
    return same_toml(a, b, STACK_DIR)


def stack_path(name_or_path: str) -> Path:
    """The file behind `--stack NAME|PATH` (a bundled name, or a path to a .toml file)."""
    path = toml_path(name_or_path, STACK_DIR)
    if path is None and looks_like_folder(name_or_path):
        raise StackError(f"stack file {name_or_path!r} is a folder; give the .toml file in it")
    if path is None:
        raise StackError(f"unknown stack {name_or_path!r}{did_you_mean(name_or_path, bundled_stacks())}; use one of {', '.join(bundled_stacks())} "
                         "or a path to a .toml file (smplan stack list)")
    if path.is_dir():
        raise StackError(f"stack file {str(path)!r} is a folder; give the .toml file")
    if not path.is_file():
        raise StackError(f"stack file {str(path)!r} does not exist; check the path or use a bundled stack "
                         f"({', '.join(bundled_stacks())})")
    return path


def read_stack(name_or_path: str) -> dict:
    """Parsed TOML of a bundled stack name (`torchtitan`) or of a path to a .toml file."""
    path = stack_path(name_or_path)
    data = read_toml(path, "stack file", StackError)
    tables = sorted(set(data) & HARDWARE_ONLY_TABLES)
    if tables:
        raise StackError(f"{str(path)!r} looks like a hardware file (it has a [{tables[0]}] table); pass it with --hw, "
                         "and a stack with --stack")
    return data


def load_stack(name_or_path: str | None = None) -> Stack:
    """The Stack of a bundled name or a .toml path (None: the default, megatron-core)."""
    name_or_path = name_or_path or DEFAULT_STACK
    path = stack_path(name_or_path)
    bundled = not is_path(name_or_path)
    source = f"bundled stack {name_or_path!r}" if bundled else f"stack file {str(path)!r}"
    return stack_from_dict(read_stack(name_or_path), source, default_name=path.stem)


def stack_from_dict(data: dict, source: str = "stack", default_name: str = "stack") -> Stack:
    """A Stack from parsed TOML, with one clear error per problem (unknown keys refused)."""
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise StackError(f"{source}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], list(_KEYS))}; "
                         f"valid keys: {', '.join(_KEYS)}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise StackError(f"{source}: missing key {missing[0]!r}; add it (`smplan stack show {DEFAULT_STACK}` "
                         "shows a bundled stack's values)")
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise StackError(f"{source}: {key!r} must be text, got {data[key]!r}")
    if not isinstance(data["overlap_grad_reduce"], bool):
        raise StackError(f"{source}: 'overlap_grad_reduce' must be true or false, got {data['overlap_grad_reduce']!r}")
    host = _number(data, "host_overhead_us_per_layer", source, 0.0, MAX_NUMBER, "microseconds per layer pass")
    moe_host = _number(data, "host_overhead_us_per_moe_layer", source, 0.0, MAX_NUMBER,
                       "extra microseconds per MoE layer pass", Stack.host_overhead_us_per_moe_layer)
    fusion = _number(data, "elementwise_fusion", source, 0.0, 1.0, "a share from 0 to 1")
    kernel = _choice(data, "attention_kernel", source, ATTENTION_KERNELS, Stack.attention_kernel)
    live = _number(data, "zero3_max_live_params", source, 0.0, MAX_NUMBER, "parameters; 0 for no cap",
                   Stack.zero3_max_live_params)
    nic = _number(data, "single_nic_network", source, 1e-3, 1.0, "a share of one NIC, up to 1", Stack.single_nic_network)
    zero_coll = _choice(data, "zero_collectives", source, ZERO_COLLECTIVES, Stack.zero_collectives)
    zero_granularity = _choice(data, "zero_granularity", source, ZERO_GRANULARITIES, Stack.zero_granularity)
    tp_overlap = _number(data, "tp_comm_overlap", source, 0.0, 1.0, "a share from 0 to 1", Stack.tp_comm_overlap)
    a2a = _number(data, "ep_a2a_overlap", source, 0.0, 1.0, "a share from 0 to 1", Stack.ep_a2a_overlap)
    dispatcher = _choice(data, "ep_dispatcher", source, EP_DISPATCHERS, Stack.ep_dispatcher)
    cp_comm = _choice(data, "cp_comm", source, CP_COMMS, Stack.cp_comm)
    reduce_dtype = _choice(data, "grad_reduce_dtype", source, GRAD_REDUCE_DTYPES, Stack.grad_reduce_dtype)
    pp_send = _choice(data, "pp_send", source, PP_SENDS, Stack.pp_send)
    sp_saved = _choice(data, "sp_saved_input", source, SP_SAVED_INPUTS, Stack.sp_saved_input)
    entropy = _choice(data, "cross_entropy", source, CROSS_ENTROPIES, Stack.cross_entropy)
    return Stack(name=data.get("name", default_name), description=data.get("description", ""),
                 host_overhead_us_per_layer=host, host_overhead_us_per_moe_layer=moe_host,
                 elementwise_fusion=fusion,
                 overlap_grad_reduce=data["overlap_grad_reduce"], attention_kernel=kernel,
                 zero3_max_live_params=live, single_nic_network=nic, zero_collectives=zero_coll, zero_granularity=zero_granularity,
                 tp_comm_overlap=tp_overlap, ep_a2a_overlap=a2a, ep_dispatcher=dispatcher,
                 cp_comm=cp_comm, grad_reduce_dtype=reduce_dtype, pp_send=pp_send,
                 sp_saved_input=sp_saved, cross_entropy=entropy, source=source)


def us_unit_warning(where: str, key: str, value: object) -> str | None:
    """One warning line when a microseconds value of `key` looks like seconds or milliseconds, or
    like nanoseconds, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if 0 < value < MIN_HOST_OVERHEAD_US:
        return (f"warning: {where}: {key} = {value:g} looks like another unit; it is read in microseconds, and one "
                "kernel launch alone takes a few (multiply a seconds figure by 1e6, a milliseconds one by 1000)")
    if value > MAX_HOST_OVERHEAD_US:
        return (f"warning: {where}: {key} = {value:g} looks like another unit; it is read in microseconds, and "
                f"{value / 1e6:g} s of host time a layer pass is far past any stack's (divide a nanoseconds figure "
                "by 1000)")
    return None


def implausible_stack_values(name_or_path: str | None) -> list[str]:
    """One warning line per microseconds value of a stack that looks like another unit (`us_unit_warning`)."""
    data = read_stack(name_or_path or DEFAULT_STACK)
    lines = (us_unit_warning(name_or_path or DEFAULT_STACK, key, data.get(key)) for key in US_KEYS)
    return [line for line in lines if line]


def _number(data: dict, key: str, source: str, low: float, high: float, unit: str,
            default: float | None = None) -> float:
    """`data[key]` checked to lie in [low, high]; `default` when an optional key is absent."""
    if key not in data and default is not None:
        return default
    value = data[key]
    # `not low <= value <= high` is True for NaN too
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise StackError(f"{source}: {key!r} must be a number from {low:g} to {high:g} ({unit}), got {value!r}")
    return float(value)


def _choice(data: dict, key: str, source: str, allowed: tuple[str, ...], default: str) -> str:
    """`data[key]` (default when absent) checked to be one of `allowed`."""
    value = data.get(key, default)
    if value not in allowed:
        raise StackError(f"{source}: {key!r} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def with_stack(cluster: Cluster, stack: Stack, keep: Iterable[str] = ()) -> Cluster:
    """`cluster` with the stack's efficiency fields, except the keys in `keep`."""
    values = {k: v for k, v in stack.efficiency().items() if k not in set(keep)}
    return dataclasses.replace(cluster, efficiency=dataclasses.replace(cluster.efficiency, **values))


def apply_stack(cluster: Cluster, name_or_path: str | None, stated: Iterable[str] = ()) -> Cluster:
    """`cluster` under the stack `name_or_path` (None: the default). `stated`: the efficiency
    keys the hardware file itself gives; the default stack keeps them, any other replaces them."""
    keep = set(stated) if (name_or_path or DEFAULT_STACK) == DEFAULT_STACK else set()
    return with_stack(cluster, load_stack(name_or_path), keep)


def replaced_by_stack(name_or_path: str, stack: str | None) -> str | None:
    """One line on the efficiency keys the hardware file states (a calibrated profile's fitted
    host time) where they differ from the stack's, or None: any stack but the default replaces
    them, the default keeps them (`apply_stack`). The precedence is by design, but it should not
    pass unseen: output headed "stack megatron-core" would otherwise run on the file's values."""
    from .loader import read_profile

    profile = read_profile(name_or_path)
    stated = profile.get("efficiency", {})
    theirs = load_stack(stack).efficiency()
    changed = [k for k in STACK_KEYS if k in stated and stated[k] != theirs[k]]
    if not changed:
        return None
    mine = ", ".join(f"{k}={stated[k]}" for k in changed)
    stacks = ", ".join(f"{k}={theirs[k]}" for k in changed)
    if (stack or DEFAULT_STACK) == DEFAULT_STACK:
        if profile.get("gpu", {}).get("name") in PROBED_NAMES:  # `hw probe` states smplan execute's stack on purpose
            return None
        return (f"note: {name_or_path}'s [efficiency] sets {mine}, which the default stack {DEFAULT_STACK} keeps over its "
                f"own ({stacks}); --stack NAME replaces them")
    return (f"note: --stack {stack} replaces {name_or_path}'s {mine} with its own "
            f"({stacks}); --hw-set efficiency.KEY=VALUE keeps a file's value")


def stack_toml(stack: Stack, notes: Iterable[str] = (), comments: dict[str, str] | None = None) -> str:
    """A stack TOML file that `load_stack(PATH)` reads back: `notes` as its header comment,
    `comments[key]` as the one-line comment that says where each value comes from."""
    comments = comments or {}
    values = {"name": _quoted(stack.name), "description": _quoted(stack.description),
              "host_overhead_us_per_layer": f"{stack.host_overhead_us_per_layer:.6g}",
              "host_overhead_us_per_moe_layer": f"{stack.host_overhead_us_per_moe_layer:.6g}",
              "elementwise_fusion": f"{stack.elementwise_fusion:.6g}",
              "overlap_grad_reduce": "true" if stack.overlap_grad_reduce else "false",
              "attention_kernel": _quoted(stack.attention_kernel),
              "zero3_max_live_params": f"{stack.zero3_max_live_params:.6g}",
              "single_nic_network": f"{stack.single_nic_network:.6g}",
              "zero_collectives": _quoted(stack.zero_collectives),
              "zero_granularity": _quoted(stack.zero_granularity),
              "tp_comm_overlap": f"{stack.tp_comm_overlap:.6g}",
              "ep_a2a_overlap": f"{stack.ep_a2a_overlap:.6g}",
              "ep_dispatcher": _quoted(stack.ep_dispatcher),
              "cp_comm": _quoted(stack.cp_comm),
              "grad_reduce_dtype": _quoted(stack.grad_reduce_dtype),
              "pp_send": _quoted(stack.pp_send),
              "sp_saved_input": _quoted(stack.sp_saved_input),
              "cross_entropy": _quoted(stack.cross_entropy)}
    lines = [f"# {n}" for n in notes]
    lines += [f"{k} = {v}" + (f"  # {comments[k]}" if comments.get(k) else "") for k, v in values.items()]
    return "\n".join(lines) + "\n"


def write_stack(text: str, path: str | Path, force: bool = False, option: str = "--stack-output") -> Path:
    """Write a stack TOML only if it loads back; an existing file needs `force`."""
    from .profile_file import write_checked

    return write_checked(text, path, load_stack, "stack", force, option)


def _quoted(text: str) -> str:
    import json

    return json.dumps(text)  # a JSON string is a TOML basic string
