"""The coefficients of one model chunk, affine in its blocks n and recomputed blocks r: what the
cost model (`CostModel.chunk`) computes once per mesh and chunk, and what the ILP
(`smplan.planner.ilp`) and a plan's stage costs (`ChunkModel.stage_costs`) read."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .costs import StageCosts, ZeroUnit
from .memory_model import ChunkMemory


@dataclass(frozen=True)
class PassSeconds:
    """Seconds of one kind inside a chunk's passes, affine in n (blocks) and r (recomputed
    blocks): forward f0 + f_blk n + rf_blk r, backward b0 + b_blk n + rb_blk r."""

    f0: float = 0.0
    f_blk: float = 0.0
    rf_blk: float = 0.0
    b0: float = 0.0
    b_blk: float = 0.0
    rb_blk: float = 0.0

    @classmethod
    def of(cls, parts: list, block, forward: str, backward: str, rf_blk: float = 0.0, rb_blk: float = 0.0):
        """From the PassTimes fields `forward` / `backward` of the chunk's other parts and its block."""
        return cls(sum(getattr(p, forward) for p in parts), getattr(block, forward), rf_blk,
                   sum(getattr(p, backward) for p in parts), getattr(block, backward), rb_blk)

    def forward(self, n: int, r: int) -> float:
        return self.f0 + self.f_blk * n + self.rf_blk * r

    def backward(self, n: int, r: int) -> float:
        return self.b0 + self.b_blk * n + self.rb_blk * r


@dataclass(frozen=True)
class ChunkModel:
    """Costs of one model chunk as affine functions of n (blocks) and r (recomputed)."""

    f0: float
    f_blk: float
    b0: float
    b_blk: float
    r_blk: float  # extra backward seconds per recomputed block
    send_bytes: float
    send_s: float
    send_crosses_node: bool
    dp_bytes0: float
    dp_bytes_blk: float
    dp_s0: float
    dp_s_blk: float
    dp_overlappable: bool
    opt0: float
    opt_blk: float
    rec_flops_blk: float  # FLOPs per sample re-run per recomputed block
    memory: ChunkMemory
    # of f / b: the TP collectives (rb_blk: what a recomputed block re-runs)
    tp: PassSeconds = PassSeconds()
    # expert all-to-all and context-parallel seconds: exposed (inside f/b) and hidden under compute
    ep: PassSeconds = PassSeconds()
    cp: PassSeconds = PassSeconds()
    ep_hidden: PassSeconds = PassSeconds()
    cp_hidden: PassSeconds = PassSeconds()
    ep_crosses_node: bool = False
    cp_crosses_node: bool = False
    # ZeRO-2/3 units (ZeroUnit: the passes' time without their collectives, and the collectives):
    # the first chunk's embedding, one per block (a recomputed block's backward adds zero_rec_s),
    # the last chunk's head.
    zero_pre: tuple = ()
    zero_blk: ZeroUnit | None = None
    zero_rec_s: float = 0.0
    zero_post: tuple = ()
    zero_crosses_node: bool = False
    # of f / b: the GPU waiting for the host's launches (PassTimes.host_wait_*); rb_blk what a
    # recomputed block takes off it (<= 0: its recomputed work fills the wait)
    host_wait: PassSeconds = PassSeconds()
    # The parts before the blocks recomputed (memory_model.pre_recompute): rec0_s the backward
    # seconds it adds where applied (a plan's device recomputes a block with full / sac);
    # pre_rec_s what it would add, for the ILP, which applies it with that device's binary.
    rec0_s: float = 0.0
    pre_rec_s: float = 0.0
    rec0_flops: float = 0.0  # FLOPs per sample the applied recompute of those parts re-runs

    @property
    def _rerun_comm_blk(self) -> float:
        """Of a recomputed block's extra backward seconds, the collectives it re-runs or exposes
        again (TP, expert all-to-alls, CP), which the breakdown counts as communication, not as
        recompute."""
        return self.tp.rb_blk + self.ep.rb_blk + self.cp.rb_blk

    def _zero_units(self, n: int, r: int) -> tuple:
        if self.zero_blk is None:
            return ()
        rec = dataclasses.replace(self.zero_blk, backward_s=self.zero_blk.backward_s + self.zero_rec_s,
                                  recompute_s=max(0.0, self.zero_rec_s - self._rerun_comm_blk))
        return (*self.zero_pre, *([rec] * r), *([self.zero_blk] * (n - r)), *self.zero_post)

    def stage_costs(self, n: int, r: int) -> StageCosts:
        return StageCosts(
            forward_s=self.f0 + self.f_blk * n,
            backward_s=self.b0 + self.rec0_s + self.b_blk * n + self.r_blk * r,
            recompute_s=self.rec0_s + max(0.0, self.r_blk - self._rerun_comm_blk) * r,
            tp_comm_forward_s=self.tp.forward(n, r),
            tp_comm_backward_s=self.tp.backward(n, r),
            send_bytes=self.send_bytes,
            send_s=self.send_s,
            send_crosses_node=self.send_crosses_node,
            dp_comm_bytes=self.dp_bytes0 + self.dp_bytes_blk * n,
            dp_comm_s=self.dp_s0 + self.dp_s_blk * n,
            dp_overlappable=self.dp_overlappable,
            optimizer_s=self.opt0 + self.opt_blk * n,
            memory=self.memory.breakdown(n, r),
            ep_comm_forward_s=self.ep.forward(n, r),
            ep_comm_backward_s=self.ep.backward(n, r),
            cp_comm_forward_s=self.cp.forward(n, r),
            cp_comm_backward_s=self.cp.backward(n, r),
            ep_hidden_forward_s=self.ep_hidden.forward(n, r),
            ep_hidden_backward_s=self.ep_hidden.backward(n, r),
            cp_hidden_forward_s=self.cp_hidden.forward(n, r),
            cp_hidden_backward_s=self.cp_hidden.backward(n, r),
            ep_crosses_node=self.ep_crosses_node,
            cp_crosses_node=self.cp_crosses_node,
            zero_units=self._zero_units(n, r),
            zero_crosses_node=self.zero_crosses_node,
            host_wait_forward_s=self.host_wait.forward(n, r),
            host_wait_backward_s=max(0.0, self.host_wait.backward(n, r)),
        )
