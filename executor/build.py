"""Turn a Plan into this rank's parallelised model chunks, in torchtitan's order:

build on meta -> cut pipeline chunks by the plan's layer ranges -> FP8 linears (float8.py) ->
TP (+SP) -> CP (the model file's context_parallel hook) -> EP -> recomputation -> FSDP2 /
replicate -> materialise this rank's shards module by module (materialize.py) -> DDP ->
pipeline schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from smplan.planner.feasibility import effective_zero
from smplan.planner.grad_compress import parse as parse_grad_compress
from smplan.planner.memory_model import device_recompute_kind
from smplan.planner.plan import Plan, even_stages
from torch import nn

from smplan.model import CP_HOOK
from smplan.model.structure import (
    Layout,
    blocks_of,
    cut_chunk,
    find_layout,
    owned_blocks,
    present_parts,
    recomputable_parts_before,
)

from . import float8, grad_compress, precision
from .context_parallel import SequenceShard, apply_context_parallel
from .expert_parallel import apply_ep, expert_parameters, shard_over_edp
from .materialize import INIT_HOOK, build_meta, materialize
from .mesh import ParallelDims
from .parallelize import (
    apply_ddp,
    apply_fsdp,
    apply_recompute,
    apply_replicate,
    apply_tp,
    call_tp_plan,
    shards_logits,
)
from .pipeline import build_pipeline, chunks_of_rank


@dataclass
class ModelParts:
    chunks: list[nn.Module]  # this rank's model chunks (DDP-wrapped where used)
    stage_ids: list[int]
    schedule: object | None  # a pipelining schedule when pp > 1
    reference: nn.Module = field(repr=False)  # the meta-built full model (for batch hooks)
    layout: Layout | None = field(default=None, repr=False)  # find_layout(reference)
    loss_parallel: bool = False  # the head's logits reach the loss vocab-sharded: run it under loss_parallel()
    expert_banks: list[nn.Module] = field(default_factory=list)  # ep > 1: sharded banks, gradients reduced over edp
    powersgd: object | None = field(default=None, repr=False)  # PowerSGDState under grad_compress=powersgd
    # dtype=fp8: (float8 linears, linears, expert banks left in bf16) in this rank's blocks
    fp8_linears: tuple[int, int, int] | None = None

    def parameters(self):
        for chunk in self.chunks:
            yield from chunk.parameters()


def full_initial_state(model_file, model_args: dict, seed: int) -> dict[str, torch.Tensor]:
    """The weights a single-process run of this seed starts from (full size, on CPU)."""
    model = build_meta(model_file, model_args, seed)
    materialize(model, build_meta(model_file, model_args, seed), "cpu", seed, model_file.hook(INIT_HOOK))
    return model.state_dict()


def plan_stages(plan: Plan, num_blocks: int):
    return plan.stages or even_stages(num_blocks, plan.num_model_chunks)


def build_model_parts(plan: Plan, model_file, dims: ParallelDims, device: torch.device, seed: int,
                      loss_fn, mp_policy=None, sequence: SequenceShard | None = None) -> ModelParts:
    """`sequence`: this rank's share of each sequence under context parallelism (cp > 1)."""
    compress = parse_grad_compress(plan.grad_compress)
    mp_policy = mp_policy or precision.fsdp_policy(plan.dtype, device.type, compress)
    powersgd = None
    meta = build_meta(model_file, plan.model_args, seed)  # parameters on meta, buffers real
    if precision.keeps_fp32_master(plan.dtype, device.type):
        half_to_fp32(meta)
    layout = find_layout(meta)
    stages = plan_stages(plan, layout.num_blocks)
    stage_ids = chunks_of_rank(dims.coord("pp"), plan.pp, plan.virtual_stages)
    chunks, expert_banks = [], []
    fp8_linears = (0, 0, 0)
    # a rank recomputing a block with full / sac recomputes its stage 0's parts before the blocks too
    pre_kind = device_recompute_kind(stages, stage_ids[0], plan.pp) if 0 in stage_ids else None
    for sid in stage_ids:
        spec = stages[sid]
        chunk = cut_chunk(meta, layout, spec.first_block, spec.last_block,
                          is_first=sid == 0, is_last=sid == len(stages) - 1)
        blocks = [m for _, m in owned_blocks(chunk, layout)]
        if plan.dtype == "fp8":  # before TP and FSDP, as torchtitan's float8 converter
            counts = float8.convert_blocks(chunk, blocks, plan.fp8_scaling)
            fp8_linears = tuple(a + b for a, b in zip(fp8_linears, counts, strict=True))
            blocks = [m for _, m in owned_blocks(chunk, layout)]  # a block that was a Linear is a new module
        if dims.tp_enabled:
            apply_tp(chunk, blocks, dims["tp"], model_file.hook("tp_plan"), model_file.hook("tp_plan_outer"),
                     plan.sequence_parallel)
        if sequence is not None:
            apply_context_parallel(chunk, model_file.hook(CP_HOOK), sequence)
        banks = []
        if dims.ep_enabled:  # without SP the tp ranks hold the same tokens: they split the slots
            banks = apply_ep(chunk, dims["ep"], dims["tp"] if not plan.sequence_parallel else None)
        expert_banks += banks
        ignored = expert_parameters(banks) or None
        names = [layout.block_names[i] for i, _ in owned_blocks(chunk, layout)][: spec.num_recomputed]
        if names:
            apply_recompute(blocks_of(chunk, layout), names, spec.recompute)
        if sid == 0 and pre_kind:
            for container, name in recomputable_parts_before(chunk, layout):
                apply_recompute(container, [name], pre_kind)
        blocks = [m for _, m in owned_blocks(chunk, layout)]  # now the wrapped ones
        use_ddp = False
        # ZeRO-3 reshards after forward; with pipeline stages torchtitan keeps the parameters
        # gathered (reshard_after_forward = not pp), as pipelining keeps gradients unsharded
        # until the last backward: ZeRO-2/3 then run as ZeRO-1 (planner feasibility.effective_zero)
        reshard = effective_zero(plan.zero, plan.pp) == 3
        if dims.grad_replicas_enabled:  # gradients average over dp (x cp under context parallelism)
            if plan.zero > 0:
                if banks and dims["edp"].size() > 1:  # ZeRO shards the experts over edp too
                    shard_over_edp(banks, dims["edp"], reshard, mp_policy, plan.dp * plan.cp)
                apply_fsdp(chunk, blocks, dims.grad_mesh(), reshard_after_forward=reshard, mp_policy=mp_policy,
                           parts=present_parts(chunk, layout, "after"), ignored_params=ignored)
            elif dims.tp_enabled or dims.pp_enabled:
                # DDP takes no DTensor parameters, and its reducer breaks when a pipeline
                # schedule runs several forwards before the first backward.
                apply_replicate(chunk, blocks, dims.grad_mesh(), mp_policy=mp_policy, ignored_params=ignored)
            else:
                use_ddp = True
        materialize(chunk, meta, device, seed, model_file.hook(INIT_HOOK))
        if use_ddp:
            chunk = apply_ddp(chunk, dims.grad_mesh(), ignored_params=ignored)
            powersgd = grad_compress.register(chunk, dims.grad_mesh().get_group(), compress, seed)
        chunks.append(chunk)
    schedule = None
    if dims.pp_enabled:
        schedule = build_pipeline(chunks, stage_ids, len(stages), dims["pp"], device, plan.schedule,
                                  plan.num_microbatches, loss_fn)
    return ModelParts(chunks=chunks, stage_ids=stage_ids, schedule=schedule, reference=meta, layout=layout,
                      loss_parallel=dims.tp_enabled and vocab_parallel(model_file, meta, plan.sequence_parallel),
                      expert_banks=expert_banks, powersgd=powersgd,
                      fp8_linears=fp8_linears if plan.dtype == "fp8" else None)


def half_to_fp32(model: nn.Module) -> None:
    """fp32 parameters for a model built in half precision (an hf: config's torch_dtype): an fp32
    plan runs no autocast, so the parameters' dtype computes the fp32 it was priced in (a CPU
    profile's default: feasibility.default_dtype); an autocast one updates fp32 master weights
    (executor/precision.py). Only half-precision tensors: a complex rotary buffer or an fp64 one
    stays as it is."""
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.dtype in (torch.bfloat16, torch.float16):
            tensor.data = tensor.data.float()


def vocab_parallel(model_file, meta: nn.Module, sequence_parallel: bool) -> bool:
    """Whether the model file's outer TP plan leaves the logits sharded over the vocabulary."""
    outer = model_file.hook("tp_plan_outer")
    return outer is not None and shards_logits(call_tp_plan(outer, meta, sequence_parallel, "tp_plan_outer"))
