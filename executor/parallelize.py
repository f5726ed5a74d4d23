"""One small function per parallelism, applied in torchtitan's order by `build.py`:
TP of the whole model (blocks, and the embedding / head from the model file's
tp_plan_outer, with sequence parallelism), activation recomputation, data parallelism (FSDP2 for
ZeRO 1-3, DDP or FSDP2-`replicate` for ZeRO 0); materialisation is `materialize.py`'s.

Each takes the module(s), a mesh and primitives, never the whole plan.
"""

from __future__ import annotations

import fnmatch
import inspect
from functools import partial

import torch
from torch import nn

# Korthikanti et al. 2022 "selective" recomputation re-runs only the attention core: the
# QK^T product, scale, mask, softmax and dropout over the s x s scores, and the product
# with V (section 5). Everything else -- linears, norms, activations, TP collectives --
# is kept, as the cost model assumes (planner: BlockProfile.saved_bytes_attention_core).
# Fused attention kernels keep no s x s tensor, so they are kept whole.
_BMM_OPS = {torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default}


def _square(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() >= 3 and t.shape[-1] == t.shape[-2] > 1


def _attention_core(op, args) -> bool:
    """Whether `op` (an aten op inside a block) works on the s x s attention scores."""
    if op in _BMM_OPS:
        a, b = args[-2], args[-1]
        scores_out = a.shape[-2] == b.shape[-1] and a.shape[-1] != a.shape[-2]  # q @ k^T
        return scores_out or _square(a)  # probs @ v
    return any(_square(t) and t.dim() >= 4 for t in args)  # scale, mask, softmax, dropout


# Row reductions a block recomputes even under "selective": torch's composite RMSNorm (CPU;
# torch/_refs rms_norm) updates its mean in place (`mean(...).add_(eps)`), and a cached output
# that is mutated makes selective checkpointing raise. They are [.., 1] rows: nothing to save;
# the in-place op that mutates them is recomputed with them.
_RECOMPUTED_REDUCTIONS = {torch.ops.aten.mean.dim, torch.ops.aten.sum.dim_IntList, torch.ops.aten.var.correction}


def _selective_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    if _attention_core(op, args) or op in _RECOMPUTED_REDUCTIONS or op._schema.is_mutable:  # in-place: its input is recomputed
        return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


# torchtitan's op-level selective activation checkpointing (`selective_ac_option = "op"`,
# torchtitan/models/llama3/parallelize_llama.py `_save_list` and `_custom_policy`): save the
# outputs of the matmuls, attention kernels, reduce-scatters and max, except every second
# matmul of a block, which backward recomputes with the element-wise ops. aten.addmm (a linear
# with a bias; torchtitan's Llama has none) counts as a matmul, as the planner's profile does.
_SAC_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
_SAC_SAVE = _SAC_MATMULS | {
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.max.default,
}


def _sac_context():
    """A fresh pair of SAC contexts per checkpointed call, each counting its own matmuls."""
    from collections import defaultdict

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    count: dict[str, int] = defaultdict(int)

    def policy(ctx, op, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if op in _SAC_MATMULS:
            count[mode] += 1
        save = op in _SAC_SAVE and not (op in _SAC_MATMULS and count[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def call_tp_plan(fn, module: nn.Module, sequence_parallel: bool, name: str = "tp_plan") -> dict:
    """`fn(module, sequence_parallel=...)`, or `fn(module)` for a plan without SP."""
    takes_sp = "sequence_parallel" in inspect.signature(fn).parameters
    if sequence_parallel and not takes_sp:
        raise ValueError(f"the model file's {name}() has no sequence_parallel argument; set sp=0")
    return fn(module, sequence_parallel=sequence_parallel) if takes_sp else fn(module)


def present_styles(module: nn.Module, styles: dict) -> dict:
    """The entries of a model-level plan that name a module of `module` (fnmatch patterns);
    those under a part this pipeline chunk lacks (None) are dropped."""
    names = [n for n, _ in module.named_modules() if n]
    return {key: style for key, style in styles.items() if any(fnmatch.fnmatchcase(n, key) for n in names)}


def shards_logits(styles: dict) -> bool:
    """Whether a model-level plan leaves a column-parallel output as a DTensor (a
    vocab-parallel head whose logits go sharded into the loss: run it under loss_parallel)."""
    from torch.distributed.tensor.parallel import ColwiseParallel

    return any(isinstance(s, ColwiseParallel) and not s.use_local_output for s in styles.values())


def apply_tp(chunk: nn.Module, blocks: list[nn.Module], tp_mesh, tp_plan, outer_plan=None,
             sequence_parallel: bool = False) -> None:
    """Megatron TP on the whole chunk: every block with the model file's
    `tp_plan(block, sequence_parallel)`, the parts around them (embedding, final norm, head)
    with `tp_plan_outer(model, sequence_parallel)` (entries the chunk lacks skipped).

    Under SP the outer plan hands the first block sequence shards and gathers them before
    the head, so a model without one cannot run SP (the blocks would see full sequences)."""
    from torch.distributed.tensor.parallel import parallelize_module

    if sequence_parallel and outer_plan is None:
        raise ValueError("sequence parallelism needs the model file's tp_plan_outer(model, sequence_parallel) "
                         "to shard the sequence around the blocks; set sp=0 or define it")
    for block in blocks:
        parallelize_module(block, tp_mesh, call_tp_plan(tp_plan, block, sequence_parallel))
    if outer_plan is not None:
        styles = present_styles(chunk, call_tp_plan(outer_plan, chunk, sequence_parallel, "tp_plan_outer"))
        if styles:
            parallelize_module(chunk, tp_mesh, styles)


def apply_recompute(container: nn.Module, names: list[str], mode: str) -> None:
    """Wrap the blocks `names` (children of `container`) in checkpoint_wrapper.

    full: the whole block is recomputed in backward (only its input is kept).
    selective: the attention core is recomputed (`_selective_policy`).
    sac: torchtitan's op-level policy, every other matmul recomputed (`_sac_context`).
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    if mode == "none":
        return
    if mode not in ("full", "selective", "sac"):
        raise ValueError(f"recompute must be none, selective, sac or full, got {mode!r}")
    for name in names:
        block = container._modules[name]
        if mode == "full":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=True)
        elif mode == "sac":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=True, context_fn=_sac_context)
        else:
            wrapped = checkpoint_wrapper(
                block,
                preserve_rng_state=True,
                context_fn=partial(create_selective_checkpoint_contexts, _selective_policy),
            )
        container._modules[name] = wrapped


def apply_fsdp(model: nn.Module, blocks: list[nn.Module], dp_mesh, reshard_after_forward: bool,
               mp_policy=None, parts: list[nn.Module] = (), ignored_params: set | None = None) -> None:
    """FSDP2 `fully_shard` per block and per given part (`parts`: the head), then the root
    (ZeRO 3: reshard after forward; ZeRO 1/2: keep the gathered parameters until backward;
    gradients are sharded either way).

    The head gets a unit of its own, as torchtitan gives norm+output: left to the root it
    would be gathered whole, with its full gradient, for the whole backward (measured: a
    128k-vocabulary head set the peak of a tp2 x dp2 run). The embedding stays with the
    root: as a unit of its own, its sequence-parallel output (a view of the local shard)
    makes FSDP2 warn that an in-place op could skip its all-gather. A part sharing a
    parameter with another (tied embedding and head) stays with the root, which keeps one
    sharded parameter for both names. `ignored_params` (expert-parallel experts, reduced
    over edp by expert_parallel.py) are left alone.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp_policy = mp_policy or MixedPrecisionPolicy()
    for part in _untied(parts, model):
        fully_shard(part, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy,
                    ignored_params=ignored_params)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy,
                ignored_params=ignored_params)


def _untied(parts: list[nn.Module], model: nn.Module) -> list[nn.Module]:
    """The parts with parameters, none of which the model also holds under another name."""
    names: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        names[id(p)] = names.get(id(p), 0) + 1
    return [m for m in parts if any(True for _ in m.parameters())
            and all(names[id(p)] == 1 for p in m.parameters())]


def apply_replicate(model: nn.Module, blocks: list[nn.Module], dp_mesh, mp_policy=None,
                    ignored_params: set | None = None) -> None:
    """ZeRO 0 under TP or PP: FSDP2's `replicate` (DDP cannot take DTensor parameters,
    nor several forwards in flight before a backward); per block so gradient
    all-reduces overlap backward."""
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp_policy = mp_policy or MixedPrecisionPolicy()
    for block in blocks:
        replicate(block, mesh=dp_mesh, mp_policy=mp_policy, ignored_params=ignored_params)
    replicate(model, mesh=dp_mesh, mp_policy=mp_policy, ignored_params=ignored_params)


def apply_ddp(model: nn.Module, dp_mesh, bucket_cap_mb: float = 25.0,  # torch DDP's default
                 ignored_params: set | None = None) -> nn.Module:
    """ZeRO 0 without TP: classic DDP (bucketed all-reduce overlapping backward); it neither
    broadcasts nor reduces `ignored_params`."""
    from torch.nn.parallel import DistributedDataParallel

    if ignored_params:
        names = [n for n, p in model.named_parameters() if p in ignored_params]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)

    device = next(model.parameters()).device
    return DistributedDataParallel(
        model,
        process_group=dp_mesh.get_group(),
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
    )
