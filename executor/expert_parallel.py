"""Expert parallelism: every expert bank's experts split over the ep ranks (GShard,
Lepikhin et al. 2020, section 2.2; torchtitan's `ExpertParallel`).

`apply_ep` shards dim 0 (the expert index) of every parameter of each bank as a DTensor
`Shard(0)` over the ep mesh: rank j holds experts [j*E/ep, (j+1)*E/ep), materialised only
there (materialize.py fills DTensor shards from the same per-module seeded init), and DCP
saves them as the full tensors, so checkpoints reshard across ep. Clipping and the
gradient-norm metrics already reduce DTensor norms over their mesh.

A bank takes the [E, slots, hidden] dispatch buffer its MoE layer built from this rank's
tokens (the model-file contract: smplan.model.capabilities.expert_bank_problem). Around
its forward:

- dispatch: the slots are padded to the ep group's largest count (dropless routing sizes
  them by the busiest expert, which differs by rank), then one all-to-all sends rank j the
  rows of its experts: it receives [E/ep, ep*slots, hidden], every ep rank's tokens for
  its experts, and runs them as one batched GEMM per weight;
- combine: the inverse all-to-all brings every token's output back to the rank it came
  from, and the padding is cut off.

Both are torch's autograd-aware all_to_all_single (the backward is the inverse exchange).
No token is dropped and the buffer only changes place, so ep is a pure layout change:
the loss equals the ep=1 run's within float tolerance.

Under tensor parallelism (ep folds into dp x tp, mesh.py) every tp rank of a replica holds
the same tokens; as in Megatron-Core, each tp rank dispatches only its 1/tp of the slots
and the combined outputs are all-gathered over tp again. The gradient arriving at the
gathered output is the same on every tp rank (replicated activations), so the gather's
backward keeps this rank's part and the split's backward all-gathers the input gradient.

Gradients: the data-parallel wrapper (DDP / FSDP2) ignores the expert parameters, and
`reduce_expert_grads` sums their gradients over the edp group (the ranks holding the same
experts) and divides by dp: each rank's expert gradient already holds the contributions of
the tokens of its ep group, so summed over edp it covers every dp rank's tokens, and dp is
the divisor the dense gradients' average uses (torchtitan's `gradient_divide_factor`).

Under ZeRO (zero >= 1, edp > 1) `shard_over_edp` also gives each bank its own FSDP2
`fully_shard` over the edp mesh, as torchtitan does for MoE experts (`dp_mod_ep` mesh) and
as Megatron-Core's distributed optimizer shards expert parameters over the expert data
parallel group: the parameters become 2-D DTensors (edp, ep), so each rank keeps 1/edp of
its experts' optimizer states (and for zero 3 of their weights). FSDP's reduce-scatter then
sums the expert gradients over edp with divide factor dp, and `reduce_expert_grads` leaves
those banks alone.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from smplan.model import expert_banks


def apply_ep(chunk: nn.Module, ep_mesh, tp_mesh=None) -> list[nn.Module]:
    """Shard every expert bank of `chunk` over `ep_mesh` (a 1-D mesh); returns the banks.
    `tp_mesh`: the tp ranks hold the same tokens and split the slots between them (no SP)."""
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

    def shard_experts(name, module, mesh):  # every parameter of a bank has the experts in dim 0
        for pname, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(pname, nn.Parameter(distribute_tensor(param, mesh, [Shard(0)]),
                                                          requires_grad=param.requires_grad))

    banks = [m for _, m in expert_banks(chunk)]
    for bank in banks:
        if bank.num_experts % ep_mesh.size():
            raise ValueError(f"ep={ep_mesh.size()} does not divide the {bank.num_experts} experts of a bank; "
                             "pick a divisor")
        tp = tp_mesh if tp_mesh is not None and tp_mesh.size() > 1 else None
        distribute_module(bank, ep_mesh, shard_experts, *_hooks(tp))
    return banks


def _hooks(tp_mesh):
    """(input_fn, output_fn) for distribute_module, which takes hooks of exactly three arguments."""
    def input_fn(module, inputs, mesh):
        return _dispatch(module, inputs, mesh, tp_mesh)

    def output_fn(module, outputs, mesh):
        return _combine(module, outputs, mesh, tp_mesh)

    return input_fn, output_fn


def _dispatch(module: nn.Module, inputs: tuple, mesh, tp_mesh=None):
    """[E, slots, hidden] of this rank's tokens -> a Shard(0) DTensor whose local part is
    [E/ep, ep*slots_max, hidden]: every ep rank's tokens for this rank's experts."""
    from torch.distributed.tensor import DTensor, Shard

    (x,) = inputs
    ep, group = mesh.size(), mesh.get_group()
    tp = tp_mesh.size() if tp_mesh is not None else 1
    slots = torch.tensor([x.shape[1]], device=x.device)
    dist.all_reduce(slots, op=dist.ReduceOp.MAX, group=group)
    most = -(-int(slots) // tp) * tp  # a multiple of tp: each tp rank takes an equal part
    module._ep_slots = x.shape[1]  # for _combine; recomputation re-runs both in the same order
    x = nn.functional.pad(x, (0, 0, 0, most - x.shape[1]))
    if tp_mesh is not None:
        x = _SplitSlots.apply(x, tp_mesh)
        most //= tp
    e, hidden = x.shape[0], x.shape[2]
    # dim 0 in ep equal pieces, piece j (experts of rank j) to rank j; received in rank order
    received = _all_to_all(x.reshape(ep, -1), mesh).view(ep, e // ep, most, hidden)
    local = received.transpose(0, 1).reshape(e // ep, ep * most, hidden)
    return (DTensor.from_local(local, mesh, [Shard(0)], run_check=False),)


def _combine(module: nn.Module, outputs, mesh, tp_mesh=None):
    """The inverse of _dispatch: [E/ep, ep*slots_max, hidden] -> [E, slots, hidden] of this rank's tokens."""
    local = outputs.to_local()
    ep = mesh.size()
    e_local, hidden = local.shape[0], local.shape[2]
    most = local.shape[1] // ep
    pieces = local.view(e_local, ep, most, hidden).transpose(0, 1).reshape(ep, -1)
    back = _all_to_all(pieces, mesh).view(ep * e_local, most, hidden)
    if tp_mesh is not None:
        back = _GatherSlots.apply(back, tp_mesh)
    return back[:, : module._ep_slots]


class _SplitSlots(torch.autograd.Function):
    """Forward: this tp rank's equal part of dim 1. Backward: the parts all-gathered, so the
    replicated input gets its full gradient on every tp rank (Megatron-Core's
    scatter_to_sequence_parallel_region, along the slots)."""

    @staticmethod
    def forward(ctx, x, tp_mesh):
        ctx.tp_mesh = tp_mesh
        return x.chunk(tp_mesh.size(), dim=1)[tp_mesh.get_local_rank()].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _gather_dim1(grad, ctx.tp_mesh), None


class _GatherSlots(torch.autograd.Function):
    """Forward: the tp ranks' parts all-gathered along dim 1. Backward: this rank's part of a
    gradient that is the same on every tp rank (Megatron-Core's
    gather_from_sequence_parallel_region with tensor_parallel_output_grad=False)."""

    @staticmethod
    def forward(ctx, x, tp_mesh):
        ctx.tp_mesh = tp_mesh
        return _gather_dim1(x, tp_mesh)

    @staticmethod
    def backward(ctx, grad):
        mesh = ctx.tp_mesh
        return grad.chunk(mesh.size(), dim=1)[mesh.get_local_rank()].contiguous(), None


def _gather_dim1(x: torch.Tensor, tp_mesh) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(tp_mesh.size())]
    dist.all_gather(parts, x.contiguous(), group=tp_mesh.get_group())
    return torch.cat(parts, dim=1)


def _all_to_all(x: torch.Tensor, mesh) -> torch.Tensor:
    """Row i of x to rank i of the mesh, row j of the result from rank j (equal splits); autograd-aware."""
    from torch.distributed import _functional_collectives as funcol

    return funcol.wait_tensor(funcol.all_to_all_single_autograd(x.contiguous(), None, None, mesh))


def shard_over_edp(banks: list[nn.Module], edp_mesh, reshard_after_forward: bool, mp_policy, dp: int) -> None:
    """FSDP2 `fully_shard` of every bank over `edp_mesh` (before the chunk's own fully_shard,
    which then skips them); gradients summed over edp and divided by dp."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    for bank in banks:
        fully_shard(bank, mesh=edp_mesh, reshard_after_forward=reshard_after_forward,
                    mp_policy=mp_policy or MixedPrecisionPolicy())
        bank.set_gradient_divide_factor(float(dp))
        # plain sum then /dp: PREMUL_SUM (FSDP's choice for a custom factor) is NCCL-only
        bank.set_force_sum_reduction_for_comms(True)


def expert_parameters(banks: list[nn.Module]) -> set[nn.Parameter]:
    """What the data-parallel wrappers must leave alone (reduced over edp instead)."""
    return {p for bank in banks for p in bank.parameters()}


@torch.no_grad()
def reduce_expert_grads(banks: list[nn.Module], edp_mesh, dp: int) -> None:
    """Sum the expert gradients over edp and divide by dp (see the module docstring); banks
    sharded over edp by `shard_over_edp` were reduced by FSDP already."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    banks = [bank for bank in banks if not isinstance(bank, FSDPModule)]
    grads = [p.grad for bank in banks for p in bank.parameters() if p.grad is not None]
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    if not local:
        return
    if edp_mesh.size() > 1:
        flat = torch.cat([g.reshape(-1) for g in local])  # one collective for all banks
        dist.all_reduce(flat, group=edp_mesh.get_group())
        offset = 0
        for g in local:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()
    torch._foreach_div_(local, float(dp))
