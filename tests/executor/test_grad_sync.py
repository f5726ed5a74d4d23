"""Gradient accumulation under each ZeRO stage, on the FSDP2 units `build_model_parts` makes:
the collectives of one step of 4 micro-batches, counted on 2 gloo ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.executor.gloo_group import gloo_group
from tests.executor.runs import spawn_workers
from tests.executor.test_materialize import GPT_TINY, _parts

MICRO_BATCHES = 4
# ZeRO stage -> (all-gathers, reduce-scatters) of one step per FSDP unit:
# ZeRO-1 gathers once and reduces once (full gradients accumulate, as it keeps them);
# ZeRO-2 gathers once and reduce-scatters every micro-batch (only the shard stays);
# ZeRO-3 gathers in every forward and again in every backward, and reduce-scatters each time.
PER_UNIT = {1: (1, 1), 2: (1, MICRO_BATCHES), 3: (2 * MICRO_BATCHES, MICRO_BATCHES)}


def _worker(rank: int, world: int, spec: str, init_file: str) -> None:
    from smplan.executor.train import _grad_sync

    with gloo_group(init_file, rank, world):
        plan, _, parts = _parts(spec, GPT_TINY, world)
        chunk = parts.chunks[0]
        units = len(chunk._get_fsdp_state()._fsdp_param_groups) + sum(
            1 for m in chunk.modules() if m is not chunk and hasattr(m, "_get_fsdp_state")
            and m._get_fsdp_state()._fsdp_param_groups)
        counts = {"all_gather_single": 0, "reduce_scatter_single": 0}
        for name in counts:
            real = getattr(dist, name)

            def counted(*args, _real=real, _name=name, **kwargs):
                counts[_name] += 1
                return _real(*args, **kwargs)

            setattr(dist, name, counted)
        gen = torch.Generator().manual_seed(rank)
        for i in range(MICRO_BATCHES):
            tokens = torch.randint(0, 64, (1, 17), generator=gen)
            with _grad_sync(chunk, i == MICRO_BATCHES - 1, plan.zero):
                logits = chunk(tokens[:, :-1])
                torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        gathers, scatters = PER_UNIT[plan.zero]
        got = (counts["all_gather_single"], counts["reduce_scatter_single"])
        assert got == (gathers * units, scatters * units), f"{spec}: {got} over {units} FSDP units"
        if plan.zero >= 2:  # the accumulated gradients are the shard, not the whole tensor
            assert all(p.grad._local_tensor.numel() < p.numel() for p in chunk.parameters() if p.numel() > 1)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_each_zero_stage_reduces_and_gathers_as_priced(zero, tmp_path):
    spawn_workers(_worker, 2, f"dp=2,zero={zero},mbs=1,gbs={2 * MICRO_BATCHES}", tmp_path, timeout_s=120)
