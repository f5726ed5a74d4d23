"""The training recipe: learning-rate schedule and AdamW parameter groups (pure functions).

The schedule is a pure function of the step (and the recipe), so a resumed run needs only
the step it resumes from, which every checkpoint holds: no scheduler state is saved, and
each step sets every group's lr from `lr_at` before the optimizer steps.

Steps are 1-based, as in metrics.jsonl: `lr_at(k)` is the rate step k updates with.
  constant: warmup, then `lr`.
  cosine:   warmup, then half a cosine from `lr` to `min_lr` at the last step
            (Loshchilov & Hutter 2017, SGDR, without restarts; nanoGPT's get_lr).
  wsd:      warmup-stable-decay: warmup, `lr` until the last `decay_fraction` of the steps
            (default 0.2), then linear to `min_lr` at the last step (Hu et al. 2024, MiniCPM;
            Hägele et al. 2024 use the same 20% linear cooldown).
Warmup is linear, reaching `lr` at step `warmup_steps` (Goyal et al. 2017, section 2.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where the groups are built, so the constants read without it
    from torch import nn

SCHEDULES = ("constant", "cosine", "wsd")
# Hägele et al. 2024 ("Scaling Laws and Compute-Optimal Training Beyond Fixed Training
# Durations") cool down over the last 20% of the steps.
DEFAULT_DECAY_FRACTION = 0.2


class RecipeError(ValueError):
    """A recipe setting is out of range (one line, exit 2 on the CLI)."""


@dataclass(frozen=True)
class Recipe:
    lr: float = 1e-3
    schedule: str = "constant"
    total_steps: int = 10
    warmup_steps: int = 0
    min_lr: float = 0.0
    decay_fraction: float = DEFAULT_DECAY_FRACTION
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)  # torch.optim.AdamW's defaults
    grad_clip: float = 1.0  # 0: off

    def check(self) -> None:
        """Raise RecipeError naming the first bad setting."""
        finite = {"--lr": self.lr, "--min-lr": self.min_lr, "--weight-decay": self.weight_decay,
                  "--grad-clip": self.grad_clip, "--decay-fraction": self.decay_fraction}
        for name, value in finite.items():
            if not (isinstance(value, int | float) and math.isfinite(value)):
                raise RecipeError(f"{name} must be a finite number, got {value}")
        if self.lr <= 0:
            raise RecipeError(f"--lr must be greater than 0, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise RecipeError(f"--min-lr must be between 0 and --lr ({self.lr}), got {self.min_lr}")
        if self.weight_decay < 0:
            raise RecipeError(f"--weight-decay must be >= 0, got {self.weight_decay}")
        if self.grad_clip < 0:
            raise RecipeError(f"--grad-clip must be >= 0 (0: off), got {self.grad_clip}")
        if self.schedule not in SCHEDULES:
            raise RecipeError(f"--lr-schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if not 0 < self.decay_fraction <= 1:
            raise RecipeError(f"--decay-fraction must be in (0, 1], got {self.decay_fraction}")
        if self.warmup_steps < 0:
            raise RecipeError(f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        if self.total_steps < 1:
            raise RecipeError(f"--steps must be at least 1, got {self.total_steps}")
        if self.warmup_steps >= self.total_steps and self.schedule != "constant":
            raise RecipeError(f"--warmup-steps ({self.warmup_steps}) must be below --steps ({self.total_steps}) "
                              f"for --lr-schedule {self.schedule}, which decays after the warmup")
        b1, b2 = self.betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):  # torch.optim.AdamW refuses others
            raise RecipeError(f"--adam-betas must be two numbers in [0, 1), got {b1},{b2}")

    def to_dict(self) -> dict:
        return {"lr": self.lr, "schedule": self.schedule, "total_steps": self.total_steps,
                "warmup_steps": self.warmup_steps, "min_lr": self.min_lr, "decay_fraction": self.decay_fraction,
                "weight_decay": self.weight_decay, "betas": list(self.betas), "grad_clip": self.grad_clip}


def parse_betas(text: str) -> tuple[float, float]:
    """"0.9,0.95" -> (0.9, 0.95)."""
    parts = text.split(",")
    try:
        b1, b2 = (float(p) for p in parts)
    except ValueError:
        raise RecipeError(f"--adam-betas must be B1,B2 (e.g. 0.9,0.95), got {text!r}") from None
    return b1, b2


def decay_start(recipe: Recipe) -> int:
    """wsd: the last step at the full lr; decay runs over the steps after it."""
    decay_steps = max(1, round(recipe.decay_fraction * recipe.total_steps))
    return max(recipe.warmup_steps, recipe.total_steps - decay_steps)


def lr_at(step: int, recipe: Recipe) -> float:
    """The learning rate of 1-based step `step` (steps past total_steps keep the last rate)."""
    base, low, total, warm = recipe.lr, recipe.min_lr, recipe.total_steps, recipe.warmup_steps
    step = min(max(step, 1), total)
    if step <= warm:
        return base * step / warm
    if recipe.schedule == "constant":
        return base
    if recipe.schedule == "cosine":
        progress = (step - warm) / (total - warm)
        return low + 0.5 * (base - low) * (1 + math.cos(math.pi * progress))
    start = decay_start(recipe)
    if step <= start:
        return base
    return base + (low - base) * (step - start) / (total - start)


def decays(name: str, param, owner: nn.Module | None) -> bool:
    """Whether AdamW decays this parameter: matrices do; biases, norms and 1-D tensors do not."""
    from torch import nn

    if param.dim() < 2 or name.rsplit(".", 1)[-1] == "bias":
        return False
    # Normalization layers' weights and biases get no weight decay (nanoGPT's configure_optimizers;
    # Loshchilov & Hutter 2019 decay the weight matrices).
    return not isinstance(owner, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.modules.batchnorm._NormBase))


def param_groups(model: nn.Module, weight_decay: float) -> tuple[list[dict], list[bool]]:
    """AdamW groups, decayed first ({params, weight_decay}, {params, weight_decay: 0}), and
    whether each decays. An empty group is left out: DCP's flattened optimizer state names a
    group by its first parameter, so it cannot hold an empty one."""
    owners = {}
    for mod_name, module in model.named_modules():
        for p_name, _ in module.named_parameters(recurse=False):
            owners[f"{mod_name}.{p_name}" if mod_name else p_name] = module
    decay, plain = [], []
    for name, param in model.named_parameters():
        (decay if decays(name, param, owners.get(name)) else plain).append(param)
    pairs = [(True, {"params": decay, "weight_decay": weight_decay}), (False, {"params": plain, "weight_decay": 0.0})]
    kept = [(flag, group) for flag, group in pairs if group["params"]]
    return [group for _, group in kept], [flag for flag, _ in kept]


def apply(optimizer, step: int, recipe: Recipe, decayed: list[bool]) -> float:
    """Set every group's lr, betas and weight decay for `step` (a resumed checkpoint's groups
    carry the settings of the run that wrote it); returns the lr."""
    lr = lr_at(step, recipe)
    for group, decay in zip(optimizer.param_groups, decayed, strict=True):
        group["lr"] = lr
        group["betas"] = tuple(recipe.betas)
        group["weight_decay"] = recipe.weight_decay if decay else 0.0
    return lr
