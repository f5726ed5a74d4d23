"""What sequence parallelism keeps for backward under execute's DTensor TP plans, on 2 gloo
ranks: the column-parallel linears save their gathered, full-length input, which is the
profile's `saved_bytes_gathered_per_sample` and why the torchtitan stack (and `hw probe`'s)
says sp_saved_input = "gathered" (Megatron keeps 1/tp and gathers again in backward)."""

from __future__ import annotations

import torch

from tests.conftest import EXAMPLES
from tests.executor.gloo_group import gloo_group
from tests.executor.runs import spawn_workers

GPT = str(EXAMPLES / "gpt.py")
ARGS = dict(layers=2, hidden=64, heads=8, kv_heads=2, ffn=96, seq_len=32, vocab=256, attention="sdpa",
            mlp="swiglu", norm="rmsnorm", learned_positions=False, dropout=0.0)
BATCH = 3  # so that the flattened (batch x seq, hidden) input differs in shape from every weight


def _worker(rank: int, world: int, spec: str, init_file: str) -> None:
    from smplan.executor.parallelize import apply_tp
    from smplan.planner import load_model_file
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from smplan.model.structure import find_layout, owned_blocks

    with gloo_group(init_file, rank, world):
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        mf = load_model_file(GPT)
        torch.manual_seed(0)
        model = mf.build(ARGS, device="cpu")
        blocks = [m for _, m in owned_blocks(model, find_layout(model))]
        apply_tp(model, blocks, mesh, mf.hook("tp_plan"), mf.hook("tp_plan_outer"), sequence_parallel=True)
        # saved whole-sequence activations on this rank: storage -> elements (the linears save their
        # input flattened to (batch x seq, hidden))
        full_length: dict[int, int] = {}
        inside = []

        def pack(t):
            whole = {(BATCH, ARGS["seq_len"], ARGS["hidden"]), (BATCH * ARGS["seq_len"], ARGS["hidden"])}
            if inside and isinstance(t, DTensor) and tuple(t._local_tensor.shape) in whole:
                full_length[t._local_tensor.untyped_storage()._cdata] = t._local_tensor.numel()
            return t

        blocks[0].register_forward_pre_hook(lambda *a: inside.append(1))
        blocks[0].register_forward_hook(lambda *a: inside.clear())
        x, _ = mf.hook("batch")(BATCH, model=model, seed=1)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x)
        gathered_elements = float(spec)
        assert sum(full_length.values()) == gathered_elements, (full_length, gathered_elements)


def test_dtensor_sequence_parallel_keeps_the_gathered_linear_inputs(tmp_path):
    from smplan.planner import profile_model

    profile = profile_model(GPT, ARGS, cache=False)
    block = profile.blocks[0]
    # the two norm outputs (attention's and the MLP's input), 2 bytes an element in the bf16 profile
    assert block.saved_bytes_gathered_per_sample == 2 * 2 * ARGS["seq_len"] * ARGS["hidden"]
    elements = block.saved_bytes_gathered_per_sample / profile.bytes_per_element * BATCH
    spawn_workers(_worker, 2, str(elements), tmp_path, timeout_s=120)
    assert block.saved_bytes_per_gpu(2, True, sp_keeps_gathered=True) - block.saved_bytes_per_gpu(2, True) == \
        block.saved_bytes_gathered_per_sample / 2
