"""The baseline: a plain torchrun DDP training script, as one would write it by hand.

    torchrun --standalone --nproc-per-node 2 benchmarks/plain_ddp.py --steps 30 \
        --model examples/gpt.py --arg layers=4 --arg hidden=256 --mbs 4 --gbs 16

Same model file, same synthetic batches, AdamW, clipping and loss logging as
`smplan execute` does for a dp-only ZeRO-0 plan; prints the median step time (after the
first step) as one JSON line on rank 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from smplan.planner import load_model_file, parse_model_args  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--arg", action="append", default=[])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--gbs", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model_file = load_model_file(args.model)
    torch.manual_seed(args.seed)
    model = model_file.build(parse_model_args(args.arg), device="cpu")
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.01)
    batch, loss_fn = model_file.hook("batch"), model_file.hook("loss")
    n_micro = args.gbs // (world * args.mbs)
    times = []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        total = torch.zeros(())
        for i in range(n_micro):
            x, y = batch(args.mbs, model=model, seed=(step * 1_000_003 + rank * n_micro + i))
            sync = contextlib.nullcontext() if i == n_micro - 1 else ddp.no_sync()
            with sync:
                loss = loss_fn(ddp(x), y)
                (loss / n_micro).backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        total /= n_micro
        dist.all_reduce(total)
        _ = total.item() / world
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"median_step_time_s": statistics.median(times[1:]), "steps": args.steps,
                          "omp_threads": os.environ.get("OMP_NUM_THREADS")}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
