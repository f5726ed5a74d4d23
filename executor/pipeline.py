"""Pipeline stages and schedules from `torch.distributed.pipelining`.

Chunk c of the plan's pp*v stage list runs on pipeline rank c % pp (Megatron's looped
placement for the interleaved schedule: rank r holds chunks r, r+pp, r+2pp, ...).
"""

from __future__ import annotations

from torch import nn

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B"}


def chunks_of_rank(pp_rank: int, pp: int, virtual_stages: int) -> list[int]:
    """The plan's stage indices (model chunks) that pipeline rank `pp_rank` runs."""
    return [pp_rank + k * pp for k in range(virtual_stages)]


def build_pipeline(chunks: list[nn.Module], stage_ids: list[int], num_stages: int, pp_mesh, device,
                   schedule: str, n_microbatches: int, loss_fn):
    """PipelineStage per chunk, and the schedule the plan names.

    `loss_fn` returns the mean over one micro-batch; the schedule divides the gradients
    by the micro-batch count (scale_grads), so the update equals one over the whole batch.
    """
    from torch.distributed import pipelining

    group = pp_mesh.get_group()
    stages = [
        pipelining.PipelineStage(chunk, stage_index=sid, num_stages=num_stages, device=device, group=group)
        for chunk, sid in zip(chunks, stage_ids, strict=True)
    ]
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")
    cls = getattr(pipelining, SCHEDULES[schedule])
    if schedule == "interleaved":
        return cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True)
    return cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True)
