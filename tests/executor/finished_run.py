"""A finished run folder of `smplan execute`, written in this process (no launch, no torch.distributed
group): what the launcher's checks before a continuation read, in a second rather than a real run's 15."""

from __future__ import annotations

import json
from pathlib import Path

from smplan.executor import checkpoint
from smplan.executor.metrics import METRICS_FILE, RUN_CONFIG_FILE, SUMMARY_FILE
from smplan.executor.run import ExecuteOptions, prepare, resolve_plan

from tests.executor.runs import GPT_TINY

PLAN = "mbs=1,gbs=2"


def write_checkpoint(root: Path, step: int, cfg, model_args: dict | None = None, run_dir: str | None = None) -> Path:
    """root/step-N as `checkpoint.save` leaves it, with the weights of cfg's model built with `model_args`
    (the run's own by default) under `cfg`'s fingerprint, written by the run in `run_dir` (cfg's)."""
    import torch.distributed.checkpoint as dcp
    from smplan.planner.model_file import load_model_file

    model = load_model_file(cfg.model_ref).build({**cfg.plan["model_args"], **(model_args or {})}, device="cpu")
    path = root / f"step-{step}"
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(path))  # train_state's "model" part, as DCP keys it
    meta = {"fingerprint": cfg.fingerprint, checkpoint.FINGERPRINT_INPUTS: cfg.fingerprint_inputs, "plan": cfg.plan,
            "model": cfg.model_ref, "recipe": cfg.recipe().to_dict(), checkpoint.RUN_DIR: run_dir or cfg.out_dir,
            "step": step}
    (path / checkpoint.META).write_text(json.dumps(meta))
    (path / checkpoint.MARKER).write_text("ok\n")
    return path


def finished_run(out: Path, steps: int = 2, model: str = GPT_TINY, plan_text: str = PLAN, **opts) -> Path:
    """OUT as `smplan execute PLAN --model MODEL -o OUT --steps S --checkpoint-every S` leaves it:
    run_config.json, metrics.jsonl, summary.json and checkpoints/step-S."""
    plan, model_file = resolve_plan(plan_text, model=model)
    cfg = prepare(plan, model_file, ExecuteOptions(steps=steps, out=str(out), checkpoint_every=steps, **opts))
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(out / RUN_CONFIG_FILE)
    record = {"loss": 5.0, "step_time_s": 0.01, "tokens_per_s": 3200.0, "samples_per_s": 200.0,
              "peak_memory_gib": 0.3, "grad_norm": 1.0, "lr": 1e-3, "phases_s": {"forward": 0.004}}
    (out / METRICS_FILE).write_text("".join(json.dumps({"step": s, **record}) + "\n" for s in range(1, steps + 1)))
    (out / SUMMARY_FILE).write_text(json.dumps({"steps": steps}) + "\n")
    write_checkpoint(Path(cfg.checkpoint_dir), steps, cfg)
    return out
