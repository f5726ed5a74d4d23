"""The plan's `grad_compress` on the data-parallel gradients (planner/grad_compress.py prices it).

- DDP (zero=0 without tp or pp): torch's DDP communication hooks
  (`torch.distributed.algorithms.ddp_comm_hooks`): `default_hooks.bf16_compress_hook`, or
  `powerSGD_hook.powerSGD_hook` with a `PowerSGDState` (Vogels et al. 2019).
- FSDP2 (zero 1-3) and FSDP2's `replicate` (zero=0 under tp or pp): bf16 is the
  `MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)` of their reduce-scatter / all-reduce
  (executor/precision.py's fsdp_policy).
  PowerSGD has no equivalent there (a reduce-scatter of shards), so it is refused before launch.

PowerSGD keeps state across steps: per DDP bucket the error-feedback residual and the warm-start
P and Q matrices, its step counter and its random generator. `PowerSGD.state_dict` /
`load_state_dict` carry them through a checkpoint (each rank's own, in `step-N/rank-N.pt`,
beside its RNG states), so a resumed run continues the compression as an uninterrupted one
would. The per-bucket tensors are saved per parameter name: DDP lays its buckets out by
parameter order in a fresh process and rebuilds them in gradient-ready order after the first
step, so a resumed process sees other layouts than the one that saved (tested bit for bit in
tests/executor/test_grad_compress_execute.py).
"""

from __future__ import annotations

import math

import torch
from smplan.planner.grad_compress import GradCompress

# PowerSGD's first compressed step: torch's hook all-reduces plainly for `start_powerSGD_iter`
# steps and refuses fewer than 2 with error feedback or warm start, since DDP rebuilds its
# buckets after the first step (torch powerSGD_hook.PowerSGDState docstring). Its default (1000)
# is a warm-up for accuracy; smplan compresses from the earliest step torch allows, as the plan
# says, and the planner prices every step compressed.
POWERSGD_START_STEP = 2


def register(ddp_model, dp_group, spec: GradCompress, seed: int) -> PowerSGD | None:
    """Register the DDP communication hook of `spec`; returns the PowerSGD state (None otherwise)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if spec.kind == "bf16":
        # DDP refuses torch's hook by its name unless NCCL >= 2.10 runs it (older NCCL had no
        # bf16); gloo all-reduces bf16 too, so on gloo the same hook runs under another name.
        nccl = torch.distributed.get_backend(dp_group) == "nccl"
        ddp_model.register_comm_hook(dp_group, default_hooks.bf16_compress_hook if nccl else _bf16_on_gloo)
        return None
    if spec.kind != "powersgd":
        return None
    powersgd = PowerSGD(ddp_model, dp_group, spec.rank, seed)
    ddp_model.register_comm_hook(powersgd.state, powersgd.hook)
    return powersgd


def _bf16_on_gloo(process_group, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(process_group, bucket)


class PowerSGD:
    """torch's PowerSGDState and hook, with the per-bucket tensors kept movable between bucket
    layouts: each call records the bucket's (name, shape) list; when a layout changes, every
    bucket's tensors are split per parameter and rebuilt in the bucket's new order."""

    def __init__(self, ddp_model, dp_group, rank: int, seed: int):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        self.state = powerSGD_hook.PowerSGDState(
            process_group=dp_group, matrix_approximation_rank=rank, start_powerSGD_iter=POWERSGD_START_STEP,
            min_compression_rate=2, use_error_feedback=True, warm_start=True, random_seed=seed)
        self.names = {id(p): n for n, p in ddp_model.module.named_parameters()}
        self.layouts: dict[int, tuple] = {}  # bucket index -> ((name, shape), ...) at its last call
        self.pending: dict[str, dict] = {}  # name -> {"error", "p", "q"} not yet placed in a bucket

    def hook(self, state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        index = bucket.index()
        layout = tuple((self.names[id(p)], tuple(p.shape)) for p in bucket.parameters())
        if self.layouts.get(index, layout) != layout:
            self._unpack_all()
        self.layouts[index] = layout
        if index not in state.error_dict and self.pending:
            self._pack(index, layout)
        return powerSGD_hook.powerSGD_hook(state, bucket)

    # -- per-parameter form ------------------------------------------------------------------
    def _segments(self, layout) -> dict[str, dict[str, tuple[int, int]]]:
        """name -> {"error": (offset, length), "p": ..., "q": ...} in a bucket's flat tensors,
        in the order torch's powerSGD_hook lays them out (compressed matrices grouped by shape)."""
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

        out, offset, by_shape = {}, 0, {}
        for name, shape in layout:
            numel = math.prod(shape)
            out[name] = {"error": (offset, numel)}
            offset += numel
            n = shape[0] if shape else 1
            m = numel // n if n else 0
            r = min(n, m, self.state.matrix_approximation_rank)
            if shape and _should_compress(n, m, r, self.state.min_compression_rate)[0]:
                by_shape.setdefault((n, m), []).append((name, n * r, m * r))
        p_off = q_off = 0
        for group in by_shape.values():
            for name, p_len, q_len in group:
                out[name]["p"], out[name]["q"] = (p_off, p_len), (q_off, q_len)
                p_off, q_off = p_off + p_len, q_off + q_len
        return out

    def _unpack_all(self) -> None:
        st = self.state
        for index, layout in self.layouts.items():
            flats = {"error": st.error_dict.pop(index, None), "p": st.p_memory_dict.pop(index, None),
                     "q": st.q_memory_dict.pop(index, None)}
            for name, segs in self._segments(layout).items():
                for kind, (off, length) in segs.items():
                    if flats[kind] is not None:
                        self.pending.setdefault(name, {})[kind] = flats[kind][off:off + length].clone()

    def _pack(self, index: int, layout) -> None:
        segs = self._segments(layout)
        if not all(name in self.pending and all(k in self.pending[name] for k in seg) for name, seg in segs.items()):
            return  # some of this bucket's parameters have no saved state: torch starts it afresh
        st = self.state
        for kind, target in (("error", st.error_dict), ("p", st.p_memory_dict), ("q", st.q_memory_dict)):
            parts = sorted((seg[kind][0], self.pending[name][kind]) for name, seg in segs.items() if kind in seg)
            if parts:
                target[index] = torch.cat([t for _, t in parts])
        for name in segs:
            del self.pending[name]

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Scalars and generator of the state, and its tensors per parameter name."""
        self._unpack_all()
        skip = ("process_group", "error_dict", "p_memory_dict", "q_memory_dict")
        scalars = {slot: getattr(self.state, slot) for slot in type(self.state).__slots__ if slot not in skip}
        out = {"state": scalars, "params": {n: dict(v) for n, v in self.pending.items()}}
        for index, layout in self.layouts.items():  # put them back for the next step
            self._pack(index, layout)
        return out

    def load_state_dict(self, saved: dict) -> None:
        for slot, value in saved["state"].items():
            setattr(self.state, slot, value)
        self.pending = {n: dict(v) for n, v in saved["params"].items()}
        for kept in (self.state.error_dict, self.state.p_memory_dict, self.state.q_memory_dict):
            kept.clear()
