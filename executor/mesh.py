"""ParallelDims: the one object that owns the executor's DeviceMesh.

The rank arithmetic itself lives in `smplan.hwprofiles.topology.ParallelLayout` (tp fastest,
then dp, then pp); this class only turns that layout into a named `DeviceMesh` and hands
out its sub-meshes and this rank's coordinates (torchtitan's `ParallelDims`).

Context parallelism (cp > 1) adds a "cp" dimension between dp and tp (Megatron-Core's
order tp, cp, dp, pp), i.e. the layout's dp ranks split into dp x cp; gradients average over
both, through the flattened "dp_cp" mesh (torchtitan's dp_shard_cp). With cp = 1 the mesh
is the plain (pp, dp, tp) one, as before.

Expert parallelism (ep > 1) folds the expert layers' grid ep x edp into the dp x cp x tp ranks
of a stage (Megatron-Core MoE parallel folding, no expert tensor parallelism): the (dp, cp, tp)
dimensions are flattened and unflattened into (edp, ep), ep the faster one, so an ep group
is ep consecutive ranks (NVLink first, as the planner's cost model assumes) and `["ep"]`,
`["edp"]` are sub-meshes of the same root mesh.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from smplan.hwprofiles.topology import MESH_DIMS, ParallelLayout


class MeshError(ValueError):
    """The degrees do not fit the processes that were started."""


@dataclass
class ParallelDims:
    pp: int
    dp: int
    tp: int
    world_size: int
    gpus_per_node: int = 1
    cp: int = 1
    ep: int = 1  # expert parallel, folded into the dp x cp x tp ranks of a stage
    _mesh: object = field(default=None, repr=False)
    _expert_mesh: object = field(default=None, repr=False)
    # The flattened dp x cp mesh, kept as _flatten returns it: slicing a flattened dim from the
    # root mesh is deprecated (torch 2.11+ warns "users need to bookkeep the flattened mesh").
    _dp_cp_mesh: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.pp * self.dp * self.cp * self.tp != self.world_size:
            raise MeshError(
                f"pp*dp*cp*tp={self.pp}*{self.dp}*{self.cp}*{self.tp}={self.pp * self.dp * self.cp * self.tp} but "
                f"{self.world_size} processes were started; start dp*tp*pp*cp processes"
            )
        if (self.dp * self.cp * self.tp) % self.ep:
            raise MeshError(f"ep={self.ep} must divide dp*cp*tp={self.dp * self.cp * self.tp} "
                            "(the expert grid folds into them)")

    @property
    def layout(self) -> ParallelLayout:
        """The rank arithmetic; the cp ranks fold into the layout's dp (cp varies faster than dp)."""
        return ParallelLayout.folded(self.pp, self.dp, self.cp, self.tp, self.gpus_per_node)

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def grad_replicas_enabled(self) -> bool:
        """Whether gradients are averaged over other ranks (dp x cp > 1)."""
        return self.dp * self.cp > 1

    def grad_mesh(self):
        """The 1-D mesh over which gradients are averaged and ZeRO shards: dp, or dp x cp."""
        return self["dp_cp"] if self.cp_enabled else self.mesh["dp"]

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    def build_mesh(self, device_type: str):
        from torch.distributed.device_mesh import init_device_mesh

        if not self.cp_enabled:
            self._mesh = init_device_mesh(device_type, self.layout.mesh_shape, mesh_dim_names=MESH_DIMS)
            folded = ("dp", "tp")
        else:
            self._mesh = init_device_mesh(device_type, (self.pp, self.dp, self.cp, self.tp),
                                          mesh_dim_names=("pp", "dp", "cp", "tp"))
            self._dp_cp_mesh = self._mesh["dp", "cp"]._flatten("dp_cp")
            folded = ("dp", "cp", "tp")
        if self.ep_enabled:  # the expert grid ep x edp folds into the stage's dp x cp x tp ranks
            grid = self._mesh[folded]._flatten("_".join(folded))
            ranks = self.dp * self.cp * self.tp
            self._expert_mesh = grid._unflatten(0, (ranks // self.ep, self.ep), ("edp", "ep"))
        return self._mesh

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    @property
    def mesh(self):
        if self._mesh is None:
            raise RuntimeError("call build_mesh() first")
        return self._mesh

    def __getitem__(self, dim: str):
        """The 1-D sub-mesh of `dim` ("pp", "dp", "tp"; "cp" and "dp_cp" when cp > 1; "ep", "edp" when ep > 1) this rank belongs to."""
        if dim in ("ep", "edp"):
            if self._expert_mesh is None:
                raise RuntimeError(f"no {dim} mesh: ep=1 or build_mesh() not called")
            return self._expert_mesh[dim]
        if dim == "dp_cp" and self._dp_cp_mesh is not None:
            return self._dp_cp_mesh
        return self.mesh[dim]

    def coord(self, dim: str) -> int:
        """This rank's index along `dim` (0 along "cp" when cp = 1)."""
        if dim == "cp" and not self.cp_enabled:
            return 0
        return self.mesh.get_local_rank(dim)

    @property
    def is_last_stage(self) -> bool:
        return self.coord("pp") == self.pp - 1

    @property
    def is_first_stage(self) -> bool:
        return self.coord("pp") == 0
