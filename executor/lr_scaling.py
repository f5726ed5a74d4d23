"""Learning-rate scaling when a plan's global batch differs from the batch the lr was tuned at
(`smplan execute --reference-batch N --lr-scaling linear|sqrt`).

    linear: lr * B / B_ref   (Goyal et al. 2017, "Accurate, Large Minibatch SGD", section 2.1:
                              SGD, k times the batch -> k times the lr)
    sqrt:   lr * sqrt(B / B_ref)  (Malladi et al. 2022, "On the SDEs and Scaling Rules for
                              Adaptive Gradient Algorithms", NeurIPS: Adam's square-root rule)

sqrt is the default: the executor trains with AdamW. The same factor multiplies --min-lr, so a
decaying schedule keeps its shape; warmup steps are left as given.
"""

from __future__ import annotations

import math

RULES = ("linear", "sqrt")


class LrScalingError(ValueError):
    """--lr-scaling or --reference-batch that cannot scale an lr: the user's, shown in one line."""


def lr_scale(global_batch: int, reference_batch: int | None, rule: str = "sqrt") -> float:
    """The factor the lr is multiplied by (1.0 without a reference batch or when they agree)."""
    if rule not in RULES:
        raise LrScalingError(f"--lr-scaling must be linear or sqrt, got {rule!r}")
    if reference_batch is None:
        return 1.0
    if not isinstance(reference_batch, int) or reference_batch < 1:
        raise LrScalingError(f"--reference-batch must be a whole number >= 1, got {reference_batch!r}")
    ratio = global_batch / reference_batch
    return ratio if rule == "linear" else math.sqrt(ratio)


def describe(lr: float, factor: float, global_batch: int, reference_batch: int, rule: str) -> str:
    """The stderr line of a scaled run."""
    formula = f"{global_batch}/{reference_batch}" if rule == "linear" else f"sqrt({global_batch}/{reference_batch})"
    source = "Goyal et al. 2017" if rule == "linear" else "Malladi et al. 2022, Adam"
    return (f"lr scaled {rule} ({source}): the plan's global batch {global_batch} vs --reference-batch "
            f"{reference_batch}: --lr {lr:g} x {formula} = {lr * factor:g} (and --min-lr by the same {factor:.4g})")
