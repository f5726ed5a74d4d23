"""Whether a block computes on tp ranks' shards what it computes whole.

A forward that runs on the local shards (smplan/model/tp_forward.py) can still compute another
function. The classic case is a fused projection split by position: `q, k, v =
self.qkv(x).chunk(3, -1)` under ColwiseParallel gives rank 0 the first third of the fused
columns, all of q and part of k for tp=2, so each rank's "q" is not the q heads it should own.
Training from scratch still runs (it is the same model with its weights permuted), but a
checkpoint or pretrained weights loaded at another tp compute garbage, silently. Megatron-LM
lays the fused weight out per head group for this reason (examples/gpt.py does the same), and
transformers gathers such outputs (Phi-3's "colwise_gather_output", "due to the slicing of qkv").

The check: materialise one block on the CPU with random weights, run it whole on a few tokens,
then run it as tp ranks would (one thread per rank, each with its slice of every column- and
row-parallel weight; a row-parallel linear sums the ranks' partial outputs, as its all-reduce
does) and compare. Blocks past `MAX_TRIAL_PARAMS` are not checked (memory, and seconds of init).
"""

from __future__ import annotations

import copy
import threading

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

# At most 2**28 parameters (1 GiB in fp32) are materialised: a 7B-8B model's block (Llama 3 8B:
# 218M) is checked in about a second; a 70B model's (856M) is not (chosen: memory and time).
MAX_TRIAL_PARAMS = 2**28
# fp32 sums in another order differ by ~1e-6 relative; a misplaced slice by O(1) (chosen between).
RELATIVE_TOLERANCE = 1e-3
BARRIER_TIMEOUT_S = 60.0  # a rank that never reaches the all-reduce (its code took another path)

TP_EQUIVALENCE_FIX = ("lay a fused weight out per head group and split it after a view by heads, as examples/gpt.py "
                      "does, or use separate linears, to allow tp")


def tp_equivalence_problem(block: nn.Module, args: tuple, kwargs: dict, styled: dict[str, tuple[nn.Module, str]],
                           tp: int, fix: str = TP_EQUIVALENCE_FIX) -> str | None:
    """Why `block` (meta, called as forward(*args, **kwargs) on meta inputs) computes something
    else on `tp` ranks' shards of the linears in `styled` (name -> (module, "col" | "row"), those
    whose style hands the block local shards), or None: equal, or not checked (too large, a
    non-Linear style, outputs that cannot be compared)."""
    if tp < 2 or not styled or any(not isinstance(m, nn.Linear) for m, _ in styled.values()):
        return None
    if sum(p.numel() for p in block.parameters()) > MAX_TRIAL_PARAMS:
        return None
    generator = torch.Generator().manual_seed(0)
    whole = _materialised(block, generator)
    args, kwargs = tree_map(lambda t: _filled(t, generator) if isinstance(t, torch.Tensor) else t, (args, kwargs))
    try:
        with torch.no_grad():
            expected = _float_leaves(whole(*_cloned(args), **_cloned(kwargs)))
        outputs = _run_ranks(whole, args, kwargs, styled, tp)
    except Exception:  # noqa: BLE001 - the user's forward on real values: not this check's question
        return None
    if not expected or not all(t.isfinite().all() for t in expected):
        return None
    error = 0.0
    for got in outputs:
        if len(got) != len(expected) or any(g.shape != e.shape for g, e in zip(got, expected, strict=True)):
            return None  # a sharded output (not the block's usual contract): nothing to compare
        for g, e in zip(got, expected, strict=True):
            error = max(error, float((g - e).norm() / e.norm().clamp_min(1e-30)))
    if error <= RELATIVE_TOLERANCE:
        return None
    return (f"the block computes something else on tp={tp}'s shards than whole (relative error {error:.2g} on random "
            "weights): code that splits a column-parallel linear's output by position (a fused q/k/v or gate/up "
            f".chunk() or .split()) gives each rank a slice of every part; {fix}")


def _materialised(block: nn.Module, generator: torch.Generator) -> nn.Module:
    """A CPU fp32 copy of the meta `block`: weights uniform in +-1/sqrt(fan-in) (nn.Linear's
    default init range), vectors (norms, biases) near 1, buffers random (both runs read the same)."""
    real = copy.deepcopy(block).to_empty(device="cpu").float().eval()
    with torch.no_grad():
        for p in real.parameters():
            if p.dim() >= 2:
                bound = p.shape[-1] ** -0.5
                p.uniform_(-bound, bound, generator=generator)
            else:
                p.uniform_(0.9, 1.1, generator=generator)
        for b in real.buffers():
            _fill_(b, generator)
    return real


def _filled(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    real = torch.empty(t.shape, dtype=torch.float32 if t.is_floating_point() else t.dtype)
    return _fill_(real, generator)


def _fill_(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    # floats random; a bool mask all True (attend everywhere: no row fully masked); integers 0
    # (positions, indices valid at any size)
    with torch.no_grad():
        if t.is_floating_point():
            t.uniform_(-1.0, 1.0, generator=generator)
        elif t.dtype == torch.bool:
            t.fill_(True)
        else:
            t.zero_()
    return t


def _cloned(tree):
    # every run gets its own inputs: a forward may write into them (x += ...)
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


def _float_leaves(out) -> list[torch.Tensor]:
    return [t.float() for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]


class _AllReduce:
    """A sum over `ranks` threads: every rank passes its partial, every rank gets the total
    (in rank order, so each gets the same bits)."""

    def __init__(self, ranks: int):
        self.slots: list[torch.Tensor | None] = [None] * ranks
        self.barrier = threading.Barrier(ranks, timeout=BARRIER_TIMEOUT_S)

    def __call__(self, rank: int, partial: torch.Tensor) -> torch.Tensor:
        self.slots[rank] = partial
        self.barrier.wait()
        total = self.slots[0]
        for t in self.slots[1:]:
            total = total + t
        self.barrier.wait()  # nobody overwrites a slot before every rank has summed
        return total


class _RowParallel(nn.Linear):
    """One rank's row-parallel linear: its input columns' partial product, summed over ranks,
    then the bias once (torch's RowwiseParallel keeps the bias replicated)."""

    def __init__(self, whole: nn.Linear, rank: int, tp: int, all_reduce: _AllReduce):
        width = whole.in_features // tp
        super().__init__(width, whole.out_features, bias=False, device="meta")
        self.weight = nn.Parameter(whole.weight[:, rank * width:(rank + 1) * width], requires_grad=False)
        self.whole_bias, self.rank, self.all_reduce = whole.bias, rank, all_reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.all_reduce(self.rank, F.linear(x, self.weight))
        return out if self.whole_bias is None else out + self.whole_bias


def _column_parallel(whole: nn.Linear, rank: int, tp: int) -> nn.Linear:
    width = whole.out_features // tp
    local = nn.Linear(whole.in_features, width, bias=whole.bias is not None, device="meta")
    rows = slice(rank * width, (rank + 1) * width)
    local.weight = nn.Parameter(whole.weight[rows], requires_grad=False)
    if whole.bias is not None:
        local.bias = nn.Parameter(whole.bias[rows], requires_grad=False)
    return local


def _rank_copy(whole: nn.Module, styled: dict, rank: int, tp: int, all_reduce: _AllReduce) -> nn.Module:
    """`whole` as rank `rank` holds it: every tensor shared, the styled linears sliced."""
    memo = {id(t): t for t in [*whole.parameters(), *whole.buffers()]}
    local = copy.deepcopy(whole, memo)
    for name, (_, kind) in styled.items():
        parent_name, _, attr = name.rpartition(".")
        parent = local.get_submodule(parent_name) if parent_name else local
        linear = whole.get_submodule(name)
        if kind == "col":
            setattr(parent, attr, _column_parallel(linear, rank, tp))
        else:
            setattr(parent, attr, _RowParallel(linear, rank, tp, all_reduce))
    return local


def _run_ranks(whole: nn.Module, args: tuple, kwargs: dict, styled: dict, tp: int) -> list[list[torch.Tensor]]:
    """Every rank's float outputs, the ranks run as threads (a rank's error aborts the others'
    all-reduce and is raised)."""
    all_reduce = _AllReduce(tp)
    ranks = [_rank_copy(whole, styled, r, tp, all_reduce) for r in range(tp)]
    outputs: list = [None] * tp
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            with torch.no_grad():
                outputs[rank] = _float_leaves(ranks[rank](*_cloned(args), **_cloned(kwargs)))
        except BaseException as err:  # noqa: BLE001 - handed to the caller below
            errors.append(err)
            all_reduce.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BARRIER_TIMEOUT_S * 2)
    if errors:
        raise errors[0]
    if any(o is None for o in outputs):
        raise TimeoutError("a rank did not finish")
    return outputs
