"""ParallelDims: the one object that owns the executor's DeviceMesh.

The rank arithmetic itself lives in `smplan.hwprofiles.topology.ParallelLayout` (tp fastest,
then dp, then pp); this class only turns that layout into a named `DeviceMesh` and hands
out its sub-meshes and this rank's coordinates (torchtitan's `ParallelDims`).
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
    _mesh: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.pp * self.dp * self.tp != self.world_size:
            raise MeshError(
                f"pp*dp*tp={self.pp}*{self.dp}*{self.tp}={self.pp * self.dp * self.tp} but "
                f"{self.world_size} processes were started; start dp*tp*pp processes"
            )

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(pp=self.pp, dp=self.dp, tp=self.tp, gpus_per_node=self.gpus_per_node)

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    def build_mesh(self, device_type: str):
        from torch.distributed.device_mesh import init_device_mesh

        self._mesh = init_device_mesh(device_type, self.layout.mesh_shape, mesh_dim_names=MESH_DIMS)
        return self._mesh

    @property
    def mesh(self):
        if self._mesh is None:
            raise RuntimeError("call build_mesh() first")
        return self._mesh

    def __getitem__(self, dim: str):
        """The 1-D sub-mesh of `dim` ("pp", "dp", "tp") this rank belongs to."""
        return self.mesh[dim]

    def coord(self, dim: str) -> int:
        """This rank's index along `dim`."""
        return self.mesh.get_local_rank(dim)

    @property
    def is_last_stage(self) -> bool:
        return self.coord("pp") == self.pp - 1

    @property
    def is_first_stage(self) -> bool:
        return self.coord("pp") == 0
