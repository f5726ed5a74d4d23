"""Context parallelism (cp > 1): each rank of a cp group holds part of every sequence.

The split is Megatron-Core's and Llama 3's causal load balancing: the sequence is cut into
2*cp equal chunks and cp rank i holds chunks i and 2cp-1-i (megatron/training/utils.py
get_batch_on_this_cp_rank; Llama 3 paper section 3.3.2), so every rank has the same share
of the causal mask's work. Each rank computes queries for its own tokens; keys and values
are all-gathered over the cp group (Llama 3's all-gather CP, not a ring) with an autograd
function whose backward reduce-scatters their gradients back, and attention is masked by
the tokens' global positions.

Why the all-gather and not torch's `context_parallel` (ring attention): in torch 2.13 it
dispatches SDPA to a ring only for the CUDA flash / efficient / cuDNN kernels; on CPU it
has no sharding strategy for `aten._scaled_dot_product_flash_attention_for_cpu`, and it
cannot see the explicit softmax attention of examples/gpt.py at all. The all-gather runs
on gloo and on nccl alike and with any attention the model computes.

The model runs it through one model-file hook, `context_parallel(model, sequence)`, called
on each model chunk once: it hands `sequence` (a `SequenceShard`) to the modules that need
it. `sequence.positions` are this rank's tokens' global positions (for position embeddings,
RoPE and the causal mask); `sequence.gather(t, dim)` returns the whole sequence of `t`
(every cp rank's tokens, in global order) along `dim`, differentiably.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

# F.cross_entropy's default ignore_index: targets equal to it carry no loss.
IGNORE_INDEX = -100


def rank_positions(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """The global positions of cp rank `cp_rank`'s tokens: chunks i and 2cp-1-i of 2*cp
    (Megatron-Core's causal load balancing), ascending."""
    if seq_len % (2 * cp):
        raise ValueError(f"cp={cp} needs seq_len divisible by 2*cp={2 * cp}, but seq_len is {seq_len}")
    c = seq_len // (2 * cp)
    first, second = cp_rank, 2 * cp - 1 - cp_rank
    return torch.cat([torch.arange(first * c, (first + 1) * c), torch.arange(second * c, (second + 1) * c)])


def gather_order(seq_len: int, cp: int) -> torch.Tensor:
    """The permutation that puts the cp ranks' tokens, concatenated in rank order (what an
    all-gather returns), back in global order."""
    return torch.argsort(torch.cat([rank_positions(seq_len, cp, r) for r in range(cp)]))


def causal_mask(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """True where a query may not see a key (the key comes later): `masked_fill`'s convention."""
    return key_positions[None, :] > query_positions[:, None]


# torch 2.13 names them *_single (the *_into_tensor / *_tensor spellings warn as deprecated);
# older torch has only the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _AllGatherSeq(torch.autograd.Function):
    """All-gather along `dim` over `group`; backward reduce-scatters (sums) the gradient
    back to the rank that owns each slice (Llama 3's K/V all-gather)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, group) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        n = dist.get_world_size(group)
        local = x.movedim(dim, 0).contiguous()
        out = local.new_empty((n * local.shape[0], *local.shape[1:]))
        _all_gather_single(out, local, group=group)
        return out.movedim(0, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        n = dist.get_world_size(ctx.group)
        full = grad.movedim(ctx.dim, 0).contiguous()
        out = full.new_empty((full.shape[0] // n, *full.shape[1:]))
        _reduce_scatter_single(out, full, op=dist.ReduceOp.SUM, group=ctx.group)
        return out.movedim(0, ctx.dim), None, None


@dataclass
class SequenceShard:
    """What one cp rank holds of every sequence, and how to see the whole of it."""

    seq_len: int
    cp: int
    cp_rank: int
    group: object = field(default=None, repr=False)  # the cp process group
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        self.positions = rank_positions(self.seq_len, self.cp, self.cp_rank).to(self.device)
        self._order = gather_order(self.seq_len, self.cp).to(self.device)

    @property
    def key_positions(self) -> torch.Tensor:
        """The positions of `gather`'s output: the whole sequence, 0 .. seq_len-1."""
        return torch.arange(self.seq_len, device=self.device)

    def mask(self) -> torch.Tensor:
        """[local tokens, seq_len] True where this rank's query may not see the key."""
        return causal_mask(self.positions, self.key_positions)

    def split(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of a whole-sequence tensor (inputs, targets)."""
        return t.index_select(dim, self.positions.to(t.device))

    def gather(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """Every cp rank's tokens of `t` along `dim`, in global order; gradients flow back."""
        full = _AllGatherSeq.apply(t, dim, self.group)
        return full.index_select(dim, self._order.to(t.device))

    def token_weight(self, targets: torch.Tensor) -> torch.Tensor | float:
        """The factor that makes the mean over cp ranks of each rank's mean loss the mean
        over the whole sequence's tokens: local tokens * cp / all tokens (ignored targets,
        F.cross_entropy's ignore_index, do not count). Exactly 1 when none are ignored."""
        if targets.is_floating_point():
            return 1.0
        counts = torch.stack([(targets != IGNORE_INDEX).sum(), torch.tensor(targets.numel(), device=targets.device)])
        local = counts[0].to(torch.float64)
        dist.all_reduce(counts, group=self.group)
        if counts[0] == 0:
            return 1.0
        return (local * self.cp / counts[0].to(torch.float64)).to(torch.float32)


def sequence_length(plan, model_file) -> int:
    """The tokens per sequence: the plan's seq_len, else the model file's batches' (dim 1)."""
    if plan.seq_len:
        return plan.seq_len
    inputs, _ = model_file.hook("batch")(plan.micro_batch, model=model_file.build(plan.model_args, device="meta"), seed=0)
    return inputs.shape[1]


def apply_context_parallel(chunk: torch.nn.Module, hook, sequence: SequenceShard) -> None:
    """The model file's `context_parallel(model, sequence)` on one model chunk."""
    hook(chunk, sequence)


def weighted_loss(loss_fn, sequence: SequenceShard):
    """`loss_fn` on this rank's tokens, weighted so that averaging over cp gives the whole
    sequence's mean (token-count weighting; see SequenceShard.token_weight)."""

    def fn(outputs, targets):
        weight = sequence.token_weight(targets)
        if isinstance(weight, torch.Tensor) and weight.item() == 0:
            # None of this rank's targets counts (padding): a mean loss would be 0/0 and its
            # gradient NaN. A zero still tied to the outputs runs the same backward (and its
            # K/V reduce-scatters, which the other cp ranks wait for) with zero gradients.
            zero = outputs.sum() * 0.0
            return zero.full_tensor() if hasattr(zero, "full_tensor") else zero
        return loss_fn(outputs, targets) * weight

    return fn
