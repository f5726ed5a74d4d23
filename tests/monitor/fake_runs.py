"""Run directories written by hand in the executor's format, for tests that need no
processes: `write_run(tmp_path, steps=6, slow_rank=1)`."""

from __future__ import annotations

import json
from pathlib import Path

PREDICTED = {"step_time_s": 0.05, "tokens_per_s": 1000.0, "samples_per_s": 80.0, "model_tflops_per_gpu": 0.1,
             "hardware_tflops_per_gpu": 0.1, "mfu": 0.1, "peak_memory_gib": 1.0, "bubble_fraction": 0.0}


def write_run(run_dir: Path, steps: int = 6, ranks: int = 2, total_steps: int | None = None,
              slow_rank: int | None = None, delay_s: float = 0.05, memory_gib: float = 0.5,
              memory_source: str = "rss", finished: bool = True, blocks: int = 4, val_every: int = 0,
              lr_warmup: int | None = None) -> Path:
    """metrics.jsonl, ranks/rank-N.jsonl, run_config.json (and summary.json when finished).
    Every rank works 40 ms a step; `slow_rank` works `delay_s` more and the others wait.
    `val_every`: a val_loss every that many steps; `lr_warmup`: an lr on every step, linear
    to 1e-3 over that many steps, then halving each step (None: no lr, as older runs)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "ranks").mkdir(exist_ok=True)
    plan = {"dp": ranks, "tp": 1, "pp": 1, "micro_batch": 1, "global_batch": 4, "zero": 0, "predicted": PREDICTED}
    config = {"plan": plan, "steps": total_steps or steps, "out_dir": str(run_dir)}
    if lr_warmup is not None:
        config.update(lr=1e-3, lr_schedule="cosine", warmup_steps=lr_warmup)
    (run_dir / "run_config.json").write_text(json.dumps(config))
    files = {r: (run_dir / "ranks" / f"rank-{r:05d}.jsonl").open("w") for r in range(ranks)}
    with (run_dir / "metrics.jsonl").open("w") as metrics:
        for step in range(1, steps + 1):
            work = 0.04
            step_time = work + (delay_s if slow_rank is not None else 0.0)
            loss, norm = 4.0 - 0.1 * step, 1.0 / step
            for r, fh in files.items():
                wait = delay_s if slow_rank is not None and r != slow_rank else 0.0005
                fh.write(json.dumps({"step": step, "rank": r, "step_time_s": step_time, "sync_wait_s": wait,
                                     "phases_s": {"forward": 0.01, "backward": 0.02}, "tokens_per_s": 64 / step_time,
                                     "peak_memory_gib": memory_gib + 0.01 * r, "peak_memory_source": memory_source,
                                     "loss": loss, "grad_norm": norm}) + "\n")
            record = {"step": step, "loss": loss, "step_time_s": step_time, "tokens_per_s": 64 / step_time,
                      "samples_per_s": 4 / step_time, "peak_memory_gib": memory_gib, "grad_norm": norm}
            if val_every and step % val_every == 0:
                record["val_loss"] = 5.0 - 0.1 * step if step < 4 else 4.7 + 0.01 * step  # best at step 3
            if lr_warmup is not None:
                record["lr"] = 1e-3 * min(1.0, step / max(1, lr_warmup)) * 0.5 ** max(0, step - lr_warmup)
            if step == 1 or step % 2 == 0:
                record["block_grad_norms"] = [norm / (b + 1) for b in range(blocks)]
            metrics.write(json.dumps(record) + "\n")
    for fh in files.values():
        fh.close()
    if finished:
        (run_dir / "summary.json").write_text(json.dumps({"steps": steps}))
    return run_dir
