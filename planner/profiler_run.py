"""The tracing run behind `profile_model`: build on meta, run one block, assemble parts."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from smplan.model import (
    CP_HOOK,
    DEFAULT_LOSS,
    ExpertBank,
    call_model,
    context_parallel_support_problem,
    default_loss,
    expert_bank_problem,
    find_expert_banks,
    find_layout,
    hf_config_fix,
    loss_value_problem,
    pipeline_problem,
    sequence_length,
    tensor_parallel_problem,
)
from smplan.model.structure import find_blocks, qualname, siblings
from smplan.model.tp_equivalence import MAX_TRIAL_PARAMS, tp_equivalence_problem
from smplan.model.tp_forward import InputSpec, TPTrial, tp_forward_trial, trial_degrees

from .hf_model import TPUnsupported
from .loss_memory import loss_peak_bytes
from .model_file import ModelFile, ModelFileError
from .model_profile import BlockProfile, MatmulShape, ModelProfile, TPCollective
from .profile_cache import file_sha256
from .profiler_tp import (
    hook_takes_sp,
    sequence_parallel_problem,
    sharded_params,
    tp_hooks,
    tp_modules_of,
    tp_outer_modules_of,
    uncalled_tp_module,
)
from .profiler_trace import GPUKernels, PartStats, Tracer, storage_key, tensor_bytes
from .profiler_user import user_call

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def run_profile(ref: str, mf: ModelFile, args: dict, seq_len: int | None, dtype: str) -> ModelProfile:
    from .hf_model import meta_forward  # transformers' value checks, answered on meta

    with meta_forward(mf):
        return _run_profile(ref, mf, args, seq_len, dtype)


def _run_profile(ref: str, mf: ModelFile, args: dict, seq_len: int | None, dtype: str) -> ModelProfile:
    # A builder without a seq_len argument still meets a seq_len its batch() already has: a plan
    # file records the profile's length and `simulate PLAN.json` replays it.
    batch_must_have = None
    if seq_len is not None:
        if mf.accepts("seq_len"):
            args["seq_len"] = seq_len
        else:
            batch_must_have = seq_len
    torch_dtype = TORCH_DTYPES[dtype]
    model = mf.build(args, device="meta", dtype=torch_dtype)
    model.train()  # dropout active: its masks are part of what backward keeps
    inputs, targets = _example_batch(mf, model, torch_dtype)
    first = next((t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)), None)
    samples = max(int(first.shape[0]), 1) if first is not None and first.dim() else 1
    profile_seq = sequence_length(inputs)  # execute counts its tokens by the same rule
    if batch_must_have is not None and profile_seq != batch_must_have:
        raise ModelFileError(f"{mf.path}: seq_len {batch_must_have} given (--seq-len, or a plan file's seq_len) but "
                             f"{mf.builder_name}() takes no seq_len argument and its batch() has {profile_seq or 'no'} "
                             "tokens per sample; drop --seq-len or add the argument to the builder, or plan this model "
                             "anew (a plan file made for another model)")

    container, run = find_blocks(model)
    blocks = [container.get_submodule(n) for n in run]
    try:
        tp_whole: set[str] = set()
        tp_modules, tp_refused = (tp_modules_of(mf, blocks[0], tp_whole) if blocks else {}), None
    except TPUnsupported as err:  # a plan torch's styles cannot express: tp off, with the reason
        tp_modules, tp_refused = {}, str(err)
    outer_modules = tp_outer_modules_of(mf, model, container, run) if tp_modules else {}
    excluded = {storage_key(t) for t in [*model.parameters(), *model.buffers()]}
    tracer = Tracer(profile_seq, excluded)
    parts = _Parts(tracer)
    handles = _install_hooks(model, container, run, blocks, {**tp_modules, **outer_modules}, parts, tracer)
    first_input = InputSpec()  # the first block's inputs, rebuilt after the trace to try them on tp's shards
    if tp_modules:
        handles.append(blocks[0].register_forward_pre_hook(first_input.record, with_kwargs=True))
    try:
        with torch.enable_grad(), GPUKernels(tracer), tracer, \
                torch.autograd.graph.saved_tensors_hooks(tracer.pack, lambda t: t):
            outputs = _call(model, inputs, mf)
            # the loss the executor will train with: the file's, else the default cross-entropy
            loss_fn = mf.hook("loss")
            what = "loss" if loss_fn is not None else f"the default loss ({DEFAULT_LOSS}; the file has no loss())"
            if targets is not None:
                parts.enter("loss", force_kind="post")
                # The logits count in the memory model's loss peak (memory_model.loss_buffer_bytes);
                # the loss part counts what it keeps beyond them (an fp32 log-softmax, or nothing).
                tracer.counted_elsewhere.update(storage_key(t) for t in tree_leaves(outputs)
                                                if isinstance(t, torch.Tensor))
                loss = user_call(mf, what, loss_fn or default_loss, outputs, targets)
                problem = loss_value_problem(loss) if loss_fn is not None else None
                if problem:
                    raise ModelFileError(f"{mf.path}: {problem}")
                parts.current.input_bytes = tensor_bytes((outputs, targets))
                parts.current.output_bytes = tensor_bytes(loss)
                tracer.keep(loss)
                parts.leave()
            tracer.keep(outputs)
            tracer.finish_fusion()
            tracer.finish_saved(parts.ordered())
    finally:
        for h in handles:
            h.remove()
        for b in blocks[1:]:
            b.__dict__.pop("forward", None)

    # the loss's own peak, forward and backward, beyond the logits (outside the trace: its backward
    # must not count as the model's work)
    loss_peak = loss_peak_bytes(loss_fn or default_loss, outputs, targets) if targets is not None else None
    hf = mf.is_hf_config  # transformers' own code: what a model file would change is not the user's to change
    fix = (lambda dim: {"fix": hf_config_fix(dim)}) if hf else (lambda dim: {})
    # the config's, else the blocks' SDPA calls' (a model of one's own states none)
    heads = _num_heads(model) or next((p.kv_heads for p in parts.ordered() if p.kind == "block" and p.kv_heads), 0)
    local = {n: style for n, style in tp_modules.items() if n not in tp_whole}
    trial = tp_forward_trial(blocks[0], *first_input.rebuilt(), local, heads, **fix("tp")) \
        if first_input.recorded else TPTrial()
    heads = trial.largest or heads  # a repeat_kv attention shows SDPA the query heads, not the K/V ones
    tp_problem = tp_refused or (tensor_parallel_problem({n: m for n, (m, _) in tp_modules.items()})
                  or tensor_parallel_problem({n: m for n, (m, _) in outer_modules.items()}, "tp_plan_outer")
                  or uncalled_tp_module(tp_modules, outer_modules, tracer.tp_called) or trial.problem)
    if tp_problem is None and local and first_input.recorded:
        fallback = (blocks[0], first_input, profile_seq * samples)
        tp_problem = _tp_equivalence(mf, args, torch_dtype, local, trial_degrees(local, heads), fallback, fix("tp"))
    pp_problem = pipeline_problem(model, find_layout(model), inputs, lambda chunk, x: _call(chunk, x, mf), **fix("pp"))
    cp_problem = context_parallel_support_problem(mf.hook(CP_HOOK), ref if hf else Path(str(mf.path)).name, **fix("cp"))
    ep_problem = expert_bank_problem(model, inputs, lambda m, x: _call(m, x, mf), **fix("ep"))
    sharded = sharded_params({**tp_modules, **outer_modules})
    params_of, active_of, sharded_of, expert_of = _params_by_part(model, container, run, blocks, parts, sharded)
    pre, post, block = [], [], None
    for stats in parts.ordered():
        bp = _block_profile(stats, params_of.get(stats.name, 0), samples)
        bp = dataclasses.replace(bp, params_active=round(active_of.get(stats.name, 0)),
                                 params_tp_sharded=sharded_of.get(stats.name, 0),
                                 params_expert=expert_of.get(stats.name, 0))
        if stats.name == "loss" and loss_peak is not None:
            bp = dataclasses.replace(bp, loss_peak_bytes_per_sample=loss_peak[0], loss_peak_fixed_bytes=loss_peak[1])
        if stats.kind == "block":
            block = bp
        elif bp.params or bp.forward_flops_per_sample or bp.saved_bytes_per_sample or stats.name == "loss":
            (pre if stats.kind == "pre" else post).append(bp)
    prefix = qualname(model, container)
    if run and block is None:  # its parameters would be in no part, and the totals short
        where = f"{prefix}.{run[0]}..{run[-1]}" if prefix else f"{run[0]}..{run[-1]} of the model"
        raise ModelFileError(f"{mf.path}: forward never calls the repeated blocks {where}; call each block as a "
                             "module (block(x)), not through its parameters or submodules")
    block_profiles = tuple(
        dataclasses.replace(block, name=f"{prefix}.{n}" if prefix else n) for n in run
    ) if block is not None else ()
    takes_sp = bool(tp_modules) and profile_seq > 0 and hook_takes_sp(mf, "tp_plan") and hook_takes_sp(mf, "tp_plan_outer")
    sp_problem = sequence_parallel_problem(mf, model, blocks[0]) if takes_sp else None
    return ModelProfile(
        model=ref,
        args=args,
        seq_len=profile_seq,
        dtype=dtype,
        bytes_per_element=torch.empty((), dtype=torch_dtype).element_size(),
        pre=tuple(pre),
        blocks=block_profiles,
        post=tuple(post),
        has_tp_plan=bool(tp_modules),
        supports_sequence_parallel=takes_sp and sp_problem is None,
        num_heads=heads,
        file_sha256=mf.sha256,
        unsupported={dim: why for dim, why in (("tp", tp_problem), ("pp", pp_problem), ("cp", cp_problem),
                                                ("ep", ep_problem), ("sp", sp_problem)) if why},
    )


# -- hooks: which part is running -------------------------------------------------------------

class _Parts:
    def __init__(self, tracer: Tracer):
        self.tracer = tracer
        self.by_name: dict[str, PartStats] = {}
        self.order: list[str] = []
        self.stack: list[PartStats | None] = []
        self.phase = "pre"

    @property
    def current(self) -> PartStats | None:
        return self.stack[-1] if self.stack else None

    def get(self, name: str, kind: str) -> PartStats:
        if name not in self.by_name:
            self.by_name[name] = PartStats(name=name, kind=kind)
            self.order.append(name)
        return self.by_name[name]

    def ambient(self) -> PartStats:
        return self.get("forward" if self.phase == "pre" else "forward (after blocks)", self.phase)

    def enter(self, name: str | None, force_kind: str | None = None) -> None:
        part = None if name is None else self.get(name, force_kind or self.phase)
        self.stack.append(part)
        self.tracer.part = part

    def leave(self) -> None:
        self.stack.pop()
        self.tracer.part = self.stack[-1] if self.stack else self.ambient()

    def ordered(self) -> list[PartStats]:
        return [self.by_name[n] for n in self.order]


def _install_hooks(model, container, run, blocks, tp_modules, parts: _Parts, tracer: Tracer) -> list:
    handles = []
    tracer.part = parts.ambient()
    # TP hooks first: torch runs a module's hooks in registration order, so on a module that is
    # both a part and TP-styled (a top-level vocab-parallel embedding or head) the collective is
    # recorded, and the output tagged sharded, while its part is still the current one
    for mod_name, (module, style) in tp_modules.items():
        handles += tp_hooks(mod_name, module, style, tracer)

    def part_hooks(module: nn.Module, name: str | None, kind: str | None = None, first_block: bool = False):
        def pre(mod, args, kwargs):
            parts.enter(name, kind)
            if parts.current is not None and parts.current.input_bytes is None:
                parts.current.input_bytes = tensor_bytes((args, kwargs))

        def post(mod, args, kwargs, output):
            tracer.keep(output)
            if parts.current is not None:
                parts.current.output_bytes = tensor_bytes(output)
                leaves = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)]
                parts.current.output_sharded = bool(leaves) and all(tracer.is_sharded(t) for t in leaves)
                parts.current.calls += 1
            if first_block:
                parts.phase = "post"
            parts.leave()

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))

    for name, module in siblings(model, container, run).items():
        part_hooks(module, name)
    if blocks:
        part_hooks(blocks[0], "block", "block", first_block=True)
        for b in blocks[1:]:
            part_hooks(b, None, first_block=True)  # stubbed, or ignored if it must really run
        handles.append(_stub_identical_blocks(blocks))
    handles += _expert_hooks(model, tracer)
    return handles


def _expert_hooks(model: nn.Module, tracer: Tracer) -> list:
    """Tag the expert banks' GEMMs and FLOPs, their input (the all-to-all dispatch buffer), and
    the routers' FLOPs, on the part that is running."""
    handles = []

    def bank_hooks(bank: ExpertBank):
        def pre(mod, args, kwargs):
            part = tracer.part
            if part is not None and not tracer.in_experts:
                part.num_experts, part.top_k = bank.num_experts, bank.top_k
                part.dispatch_bytes += tensor_bytes((args, kwargs))
            tracer.in_experts += 1

        def post(mod, args, kwargs, output):
            tracer.in_experts -= 1

        return [bank.module.register_forward_pre_hook(pre, with_kwargs=True),
                bank.module.register_forward_hook(post, with_kwargs=True)]

    def router_hooks(router: nn.Module):
        def pre(mod, args):
            tracer.in_router += 1

        def post(mod, args, output):
            tracer.in_router -= 1

        return [router.register_forward_pre_hook(pre), router.register_forward_hook(post)]

    for bank in find_expert_banks(model):
        handles += bank_hooks(bank)
        for router in bank.routers:
            handles += router_hooks(router)
    return handles


def _stub_identical_blocks(blocks: list[nn.Module]):
    """Blocks 1.. return block 0's output for the same input shapes instead of running."""
    seen: dict = {}

    def shapes(args, kwargs):
        return tuple((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t for t in tree_leaves((args, kwargs)))

    def remember(mod, args, kwargs, output):
        seen[shapes(args, kwargs)] = output

    handle = blocks[0].register_forward_hook(remember, with_kwargs=True)
    for b in blocks[1:]:
        real = b.forward

        def stub(*args, _real=real, **kwargs):
            out = seen.get(shapes(args, kwargs))
            return out if out is not None else _real(*args, **kwargs)

        b.forward = stub
    return handle


# -- the TP equivalence check (smplan/model/tp_equivalence.py) ------------------------------------

EQUIVALENCE_SEQ = 16  # tokens the check runs the block on, the model rebuilt at this seq_len (chosen: cheap)
# Without a seq_len argument the profile's own call is used while parameters x tokens stay under
# 2**34 (~70 GFLOP for the whole run and the ranks': a second or two on 2 CPU cores; chosen).
EQUIVALENCE_MAX_PARAM_TOKENS = 2**34


class _FirstBlockReached(Exception):
    pass


# The verdicts of _tp_equivalence in this process, by what they depend on but the sequence length:
# `plan` profiles a model at its default length, then ranks its plans at the length they record
# (one check of a 7B model's block is seconds).
_EQUIVALENCE_VERDICTS: dict[tuple, str | None] = {}


def _tp_equivalence(mf: ModelFile, args: dict, dtype: torch.dtype, local: dict, degrees: list[int],
                    fallback: tuple, fix: dict) -> str | None:
    """tp_equivalence_problem at the smallest degree, on the first block as it is called at
    EQUIVALENCE_SEQ tokens (the model rebuilt so on meta and stopped at that block), else on the
    profile's own block and call (`fallback`: block, InputSpec, tokens) when its builder takes no
    seq_len and the call is small enough. None when not checked."""
    block, spec, tokens = fallback
    if not degrees or sum(p.numel() for p in block.parameters()) > MAX_TRIAL_PARAMS:
        return None  # before a second build of a large model
    if not mf.accepts("seq_len"):
        return _checked(mf, args, dtype, local, degrees, fallback, fix)
    # each module the model file imported from its folder, by its digest (None once it is gone)
    imported = tuple((str(f), file_sha256(f)) for f in getattr(mf, "local_files", ()))
    key = (str(mf.path), getattr(mf, "builder_name", ""), mf.sha256, imported, dtype, degrees[0],
           repr(sorted((k, repr(v)) for k, v in args.items() if k != "seq_len")),
           tuple(sorted((n, kind) for n, (_, kind) in local.items())), repr(fix))
    if key not in _EQUIVALENCE_VERDICTS:
        _EQUIVALENCE_VERDICTS[key] = _checked(mf, args, dtype, local, degrees, fallback, fix)
    return _EQUIVALENCE_VERDICTS[key]


def _checked(mf: ModelFile, args: dict, dtype: torch.dtype, local: dict, degrees: list[int],
             fallback: tuple, fix: dict) -> str | None:
    block, spec, tokens = fallback
    if mf.accepts("seq_len"):
        try:
            small = mf.build({**args, "seq_len": EQUIVALENCE_SEQ}, device="meta", dtype=dtype)
            container, run = find_blocks(small)
            block, spec = container.get_submodule(run[0]), InputSpec()

            def stop(module, a, kw):
                spec.record(module, a, kw)
                raise _FirstBlockReached

            handle = block.register_forward_pre_hook(stop, with_kwargs=True)
            try:
                call_model(small, _example_batch(mf, small, dtype)[0])
            except _FirstBlockReached:
                pass
            finally:
                handle.remove()
        except Exception:  # noqa: BLE001 - a model that cannot be built so short is not checked
            return None
        if not spec.recorded:
            return None
    elif sum(p.numel() for p in block.parameters()) * tokens > EQUIVALENCE_MAX_PARAM_TOKENS:
        return None
    styled = {name: (block.get_submodule(name), kind) for name, (_, kind) in local.items()}
    return tp_equivalence_problem(block, *spec.rebuilt(), styled, degrees[0], **fix)


# -- running user code -------------------------------------------------------------------------

def _example_batch(mf: ModelFile, model: nn.Module, dtype: torch.dtype):
    fn = mf.hook("batch")
    if fn is None:
        raise ModelFileError(f"{mf.path}: no batch() function; define batch(micro_batch_size, model=None, seed=0) "
                             "returning example (inputs, targets)")
    try:
        takes_model = "model" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_model = False
    data = user_call(mf, "batch", fn, 1, model=model) if takes_model else user_call(mf, "batch", fn, 1)
    if not isinstance(data, tuple | list) or len(data) != 2:
        raise ModelFileError(f"{mf.path}: batch() returned {type(data).__name__}; return a pair (inputs, targets)")

    def to_meta(t):
        if not isinstance(t, torch.Tensor):
            return t
        return t.to(device="meta", dtype=dtype if t.is_floating_point() else t.dtype)

    return tree_map(to_meta, data[0]), tree_map(to_meta, data[1])


def _call(model: nn.Module, inputs, mf: ModelFile):
    return user_call(mf, "forward", call_model, model, inputs)


# -- assembling -------------------------------------------------------------------------------

def _params_by_part(model, container, run, blocks, parts: _Parts, sharded: set[int]
                    ) -> tuple[dict[str, int], dict[str, float], dict[str, int], dict[str, int]]:
    """(parameters, parameters one token uses, tp-sharded parameters, routed-expert parameters) per part; shared ones
    count once, for the first part that owns them."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    active: dict[str, float] = {}
    split: dict[str, int] = {}
    expert: dict[str, int] = {}
    used = _expert_fractions(model)

    def count(name: str, params) -> None:
        for p in params:
            if id(p) not in seen:
                seen.add(id(p))
                out[name] = out.get(name, 0) + p.numel()
                active[name] = active.get(name, 0.0) + p.numel() * used.get(id(p), 1.0)
                if id(p) in sharded:
                    split[name] = split.get(name, 0) + p.numel()
                if id(p) in used:
                    expert[name] = expert.get(name, 0) + p.numel()

    if blocks:
        count("block", blocks[0].parameters())
        for b in blocks[1:]:
            seen.update(id(p) for p in b.parameters())
    for name, module in siblings(model, container, run).items():
        # a module never called still holds its parameters: keep them in the totals
        count(parts.get(name, "post").name, module.parameters())
    rest = [p for p in model.parameters() if id(p) not in seen]
    if rest:
        count(parts.get("forward", "pre").name, rest)
    return out, active, split, expert


def _expert_fractions(model: nn.Module) -> dict[int, float]:
    """id(parameter) -> the fraction one token uses: top_k / num_experts for the parameters of
    a bank of routed experts (`find_expert_banks`), else absent (all)."""
    out: dict[int, float] = {}
    for bank in find_expert_banks(model):
        for p in bank.module.parameters():
            out[id(p)] = min(out.get(id(p), 1.0), bank.top_k / bank.num_experts)
    return out


def _block_profile(stats: PartStats, params: int, samples: int) -> BlockProfile:
    per = 1.0 / samples
    matmuls = tuple(  # shapes of the batch(1) call
        MatmulShape(m=m, n=n, k=k, batch=b, count=c, tp_dim=d, kernel=kern)
        for (m, n, k, b, d, kern), c in sorted(stats.matmuls.items(), key=lambda kv: -2 * kv[0][0] * kv[0][1] * kv[0][2])
    )
    ew = stats.elementwise_bytes
    return BlockProfile(
        name=stats.name,
        kind=stats.kind,
        params=int(params),
        forward_flops_per_sample=stats.flops * per,
        saved_bytes_tp_sharded_per_sample=stats.saved["tp_sharded"] * per,
        saved_bytes_replicated_per_sample=stats.saved["replicated"] * per,
        saved_bytes_attention_core_per_sample=stats.saved["attention_core"] * per,
        output_bytes_per_sample=stats.output_bytes * per,
        output_tp_sharded=stats.output_sharded,
        input_bytes_per_sample=(stats.input_bytes or 0.0) * per,
        elementwise_bytes_per_sample=ew * per,
        elementwise_tp_sharded_fraction=stats.elementwise_sharded_bytes / ew if ew else 0.0,
        elementwise_fusible_bytes_per_sample=stats.fusible_bytes * per,
        forward_kernels=stats.kernels / max(1, stats.calls),
        matmuls=matmuls,
        tp_collectives=tuple(
            TPCollective(c.kind, c.phase, c.bytes_per_sample * per, c.module) for c in stats.collectives
        ),
        num_experts=stats.num_experts,
        top_k=stats.top_k,
        expert_flops_per_sample=stats.expert_flops * per,
        router_flops_per_sample=stats.router_flops * per,
        all_to_all_bytes_per_sample=stats.dispatch_bytes * per,
        attention_kv_bytes_per_sample=stats.kv_bytes * per,
        saved_bytes_expert_per_sample=stats.saved_expert * per,
        saved_bytes_gathered_per_sample=stats.saved_gathered * per,
        saved_bytes_fp8_input_tp_sharded_per_sample=stats.saved_fp8_input["tp_sharded"] * per,
        saved_bytes_fp8_input_replicated_per_sample=stats.saved_fp8_input["replicated"] * per,
        saved_bytes_fp8_shared_tp_sharded_per_sample=stats.saved_fp8_shared["tp_sharded"] * per,
        saved_bytes_fp8_shared_replicated_per_sample=stats.saved_fp8_shared["replicated"] * per,
        saved_bytes_refusable_tp_sharded_per_sample=stats.saved_refusable["tp_sharded"] * per,
        saved_bytes_refusable_replicated_per_sample=stats.saved_refusable["replicated"] * per,
        saved_bytes_sac_tp_sharded_per_sample=stats.sac_saved["tp_sharded"] * per,
        saved_bytes_sac_replicated_per_sample=stats.sac_saved["replicated"] * per,
        saved_bytes_sac_unsplit_per_sample=stats.sac_saved["unsplit"] * per,
        sac_recompute_matmuls=tuple(
            MatmulShape(m=m, n=n, k=k, batch=b, count=c, tp_dim=d, kernel=kern)
            for (m, n, k, b, d, kern), c in stats.sac_matmuls.items()
        ),
    )


def _num_heads(model: nn.Module) -> int:
    cfg = getattr(model, "config", None)
    if cfg is None:
        return 0
    for key in ("kv_heads", "num_key_value_heads", "heads", "num_heads", "n_head", "num_attention_heads"):
        value = cfg.get(key) if isinstance(cfg, dict) else getattr(cfg, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0
