"""The one object that maps (pp, dp, tp) coordinates to ranks, nodes and links.

Rank order follows Megatron-LM and `init_device_mesh(("pp", "dp", "tp"))`: tp varies
fastest, then dp, then pp; consecutive ranks share a node. The planner, the simulator
and the executor all ask this class; nobody else does rank arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

MESH_DIMS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class GroupSpan:
    """How one communication group lies on the cluster."""

    size: int  # ranks in the group
    ranks_per_node: int  # group members that share one node

    @property
    def nodes(self) -> int:
        return -(-self.size // self.ranks_per_node)

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


def strided_span(size: int, stride: int, gpus_per_node: int) -> GroupSpan:
    """How a group of `size` ranks `stride` apart (consecutive ranks share a node) lies on nodes.

    Also the expert and context-parallel groups, which fold into the (pp, dp, tp) ranks:
    Megatron-Core orders tp fastest, then cp, then dp (a cp group is `tp` apart, the dense
    gradient group dp x cp), and the expert grid etp, ep, edp (an ep group is consecutive
    ranks without etp) (megatron/core/parallel_state.py, RankGenerator orders "tp-cp-ep-dp-pp").
    """
    if size < 1 or stride < 1:
        raise ValueError(f"group size and stride must be at least 1, got {size} and {stride}")
    per_node = max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1
    return GroupSpan(size=size, ranks_per_node=per_node)


@dataclass(frozen=True)
class ParallelLayout:
    pp: int
    dp: int
    tp: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        for name in ("pp", "dp", "tp", "gpus_per_node"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    @classmethod
    def folded(cls, pp: int, dp: int, cp: int, tp: int, gpus_per_node: int) -> ParallelLayout:
        """The layout of a plan with context parallelism: cp sits between tp and dp in the rank
        order (Megatron-Core's RankGenerator "tp-cp-ep-dp-pp"), so (pp, dp x cp, tp) gives the
        stage boundaries and the dense gradient group dp x cp; ep folds into the same ranks."""
        return cls(pp=pp, dp=dp * cp, tp=tp, gpus_per_node=gpus_per_node)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        return (self.pp, self.dp, self.tp)

    @property
    def nodes(self) -> int:
        return -(-self.world_size // self.gpus_per_node)

    def rank(self, pp: int, dp: int, tp: int) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    def coords(self, rank: int) -> dict[str, int]:
        tp = rank % self.tp
        dp = (rank // self.tp) % self.dp
        pp = rank // (self.tp * self.dp)
        return {"pp": pp, "dp": dp, "tp": tp}

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def _stride(self, dim: str) -> int:
        return {"tp": 1, "dp": self.tp, "pp": self.tp * self.dp}[dim]

    def size(self, dim: str) -> int:
        if dim not in MESH_DIMS:
            raise ValueError(f"unknown mesh dimension {dim!r}; use one of {MESH_DIMS}")
        return getattr(self, dim)

    def group_ranks(self, dim: str, rank: int = 0) -> list[int]:
        """The ranks of `rank`'s group along `dim`."""
        coords = self.coords(rank)
        out = []
        for i in range(self.size(dim)):
            coords[dim] = i
            out.append(self.rank(**coords))
        return out

    def span(self, dim: str) -> GroupSpan:
        """How a `dim` group lies on nodes (all groups of a dim lie alike)."""
        return strided_span(self.size(dim), self._stride(dim), self.gpus_per_node)

    def stage_boundary_crosses_node(self, stage: int) -> bool:
        """Whether the send from pipeline stage `stage` to `stage + 1` leaves the node."""
        nxt = (stage + 1) % self.pp
        return self.node_of(self.rank(stage, 0, 0)) != self.node_of(self.rank(nxt, 0, 0))
