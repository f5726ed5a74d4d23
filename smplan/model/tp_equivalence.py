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
then run it as tp ranks would (one thread per rank, the same modules as torch's styles leave
them, each with its slice of every column- and row-parallel weight; a row-parallel linear's
output summed over the ranks, as its all-reduce does) and compare. Blocks past
`MAX_TRIAL_PARAMS` are not checked (memory, and seconds of init), nor forwards that are random
or fail on these values: the check refuses only what it has seen compute something else.
"""

from __future__ import annotations

import copy
import threading
import time

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

# At most 2**28 parameters (1 GiB in fp32) are materialised: a 7B-8B model's block (Llama 3 8B:
# 218M) is checked in a few seconds on 2 CPU cores; a 70B model's (856M) is not (chosen: memory, time).
MAX_TRIAL_PARAMS = 2**28
# fp32 sums in another order differ by ~1e-6 relative; a misplaced slice by O(1) (chosen between).
RELATIVE_TOLERANCE = 1e-3
# A weight past this many elements is a tiling of POOL_SIZE uniform draws (a fresh pool per weight)
# rather than one draw per element (~6 ns each on these cores: seconds for a 7B model's block). A
# prime: no two rows of a weight with fewer rows than it read the same window (chosen: 4 MiB).
POOL_SIZE = 1_048_573  # the largest prime below 2**20
BARRIER_TIMEOUT_S = 60.0  # a rank stuck in its forward (ranks that return early are caught at once)

TP_EQUIVALENCE_FIX = ("lay a fused weight out per head group and split it after a view by heads, as examples/gpt.py "
                      "does, or use separate linears, to allow tp")


def tp_equivalence_problem(block: nn.Module, args: tuple, kwargs: dict, styled: dict[str, tuple[nn.Module, str]],
                           tp: int, fix: str = TP_EQUIVALENCE_FIX) -> str | None:
    """Why `block` (meta, called as forward(*args, **kwargs) on meta inputs) computes something
    else on `tp` ranks' shards of the linears in `styled` (name -> (module, "col" | "row"), those
    whose style hands the block local shards), or None: equal, or not checked (too large, a
    non-Linear style, a forward that is random or fails on these values, outputs that cannot be
    compared). Inputs are filled twice if need be: a bool mask all True, integers 1, then all
    False and 0 (masks of either convention, padding masks), until the whole block's output is finite."""
    if tp < 2 or not styled or any(not isinstance(m, nn.Linear) for m, _ in styled.values()):
        return None
    if sum(p.numel() for p in block.parameters()) > MAX_TRIAL_PARAMS:
        return None
    for fill in (True, False):
        generator = torch.Generator().manual_seed(0)
        whole = _materialised(block, generator, fill)
        # each rank's copy made before any run: a forward that updates a buffer starts from the same state
        ranks, all_reduce = _rank_copies(whole, styled, tp)
        call = tree_map(lambda t, g=generator, f=fill: _filled(t, g, f) if isinstance(t, torch.Tensor) else t,
                        (args, kwargs))
        try:
            with torch.no_grad():
                first = copy.deepcopy(whole, {id(p): p for p in whole.parameters()})  # buffers its own
                expected = _float_leaves(first(*_cloned(call[0]), **_cloned(call[1])))
                again = _float_leaves(whole(*_cloned(call[0]), **_cloned(call[1])))
        except Exception:  # noqa: BLE001 - the user's forward on real values: not this check's question
            return None
        if expected and all(t.isfinite().all() for t in expected):
            break
    else:
        return None  # a mask that hides every position whichever way it is filled
    if any(not torch.equal(a, b) for a, b in zip(expected, again, strict=True)):
        return None  # random in eval mode (F.dropout's training=True default): runs cannot be compared
    try:
        outputs = _run_ranks(ranks, all_reduce, *call)
    except Exception:  # noqa: BLE001 - as above
        return None
    error, compared = 0.0, 0
    for got in outputs:
        if len(got) != len(expected):
            return None
        for g, e in zip(got, expected, strict=True):
            if g.shape == e.shape:  # a head-sharded extra output (attention weights) is not the contract
                error, compared = max(error, float((g - e).norm() / e.norm().clamp_min(1e-30))), compared + 1
    if not compared or error <= RELATIVE_TOLERANCE:
        return None
    return (f"the block computes something else on tp={tp}'s shards than whole (relative error {error:.2g} on random "
            "weights): code that splits a column-parallel linear's output by position (a fused q/k/v or gate/up "
            f".chunk() or .split()) gives each rank a slice of every part; {fix}")


def _materialised(block: nn.Module, generator: torch.Generator, fill: bool) -> nn.Module:
    """A CPU fp32 copy of the meta `block` in eval mode: weights uniform in +-1/sqrt(fan-in)
    (nn.Linear's default init range), vectors (norms, biases) near 1, buffers and plain tensor
    attributes filled as inputs are (both runs read the same)."""
    real = copy.deepcopy(block).float().to_empty(device="cpu").eval()  # fp32 on meta: no bf16 copy made
    with torch.no_grad():
        for p in real.parameters():
            if p.dim() >= 2:
                bound = p.shape[-1] ** -0.5
                _uniform_(p, -bound, bound, generator)
            else:
                _uniform_(p, 0.9, 1.1, generator)
        for b in real.buffers():
            _fill_(b, generator, fill)
        for module in real.modules():  # `self.scale = torch.tensor(...)`: neither parameter nor buffer
            for name, value in list(vars(module).items()):
                if isinstance(value, torch.Tensor) and value.device.type == "meta":
                    setattr(module, name, _filled(value, generator, fill))
    return real


def _uniform_(t: torch.Tensor, low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    """`t` (contiguous) uniform in [low, high): one draw per element up to POOL_SIZE, past it
    the pool's draws tiled."""
    flat = t.view(-1)
    if flat.numel() <= POOL_SIZE:
        return t.uniform_(low, high, generator=generator)
    pool = torch.empty(POOL_SIZE, dtype=t.dtype).uniform_(low, high, generator=generator)
    for start in range(0, flat.numel(), POOL_SIZE):
        window = flat[start:start + POOL_SIZE]
        window.copy_(pool[:window.numel()])
    return t


def _filled(t: torch.Tensor, generator: torch.Generator, fill: bool) -> torch.Tensor:
    real = torch.empty(t.shape, dtype=torch.float32 if t.is_floating_point() else t.dtype)
    return _fill_(real, generator, fill)


def _fill_(t: torch.Tensor, generator: torch.Generator, fill: bool) -> torch.Tensor:
    # floats and complex (rotary freqs_cis) random; bools all `fill`, integers 1 or 0: a mask either
    # way round, a padding mask, positions and indices valid at any size
    with torch.no_grad():
        if t.is_floating_point():
            t.uniform_(-1.0, 1.0, generator=generator)
        elif t.is_complex():
            torch.view_as_real(t).uniform_(-1.0, 1.0, generator=generator)
        elif t.dtype == torch.bool:
            t.fill_(fill)
        else:
            t.fill_(int(fill))
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


def _rank_copies(whole: nn.Module, styled: dict, tp: int) -> tuple[list[nn.Module], _AllReduce]:
    """`whole` as each rank holds it, as torch's ColwiseParallel / RowwiseParallel leave it: the
    same modules (a subclass keeps its forward, `out_features` its global value), parameters
    shared, buffers the rank's own; a column-parallel weight and bias sliced by output rows, a
    row-parallel weight by input columns, its output summed over the ranks (the all-reduce) and
    its bias on rank 0 only (added once)."""
    all_reduce = _AllReduce(tp)
    ranks = []
    for rank in range(tp):
        local = copy.deepcopy(whole, {id(p): p for p in whole.parameters()})
        for name, (_, kind) in styled.items():
            module = local.get_submodule(name)
            if kind == "col":
                width = module.out_features // tp
                rows = slice(rank * width, (rank + 1) * width)
                module.weight = nn.Parameter(module.weight[rows], requires_grad=False)
                if module.bias is not None:
                    module.bias = nn.Parameter(module.bias[rows], requires_grad=False)
            else:
                width = module.in_features // tp
                module.weight = nn.Parameter(module.weight[:, rank * width:(rank + 1) * width], requires_grad=False)
                if module.bias is not None and rank:
                    module.bias = nn.Parameter(torch.zeros_like(module.bias), requires_grad=False)
                module.register_forward_hook(lambda m, a, out, r=rank: all_reduce(r, out))
        ranks.append(local)
    return ranks, all_reduce


def _run_ranks(ranks: list[nn.Module], all_reduce: _AllReduce, args: tuple, kwargs: dict) -> list[list[torch.Tensor]]:
    """Every rank's float outputs, the ranks run as threads. A rank's error aborts the others'
    all-reduce and is raised; so is a rank that returns while the others wait in one (its code
    took another path)."""
    tp = len(ranks)
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
    deadline = time.monotonic() + 2 * BARRIER_TIMEOUT_S
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        alive = [t for t in threads if t.is_alive()]
        alive[0].join(0.05)
        waiting = all_reduce.barrier.n_waiting
        if 0 < waiting == sum(t.is_alive() for t in threads) < tp:  # the rest returned: none will come
            all_reduce.barrier.abort()
    if errors:
        raise errors[0]
    if any(o is None for o in outputs):
        raise TimeoutError("a rank did not finish")
    return outputs
