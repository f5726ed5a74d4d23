"""Closed-form checkpoint intervals and expected run times (Young 1974; Daly 2006).

All times in one unit (seconds here). delta: checkpoint cost, M: mean time between
failures of the whole job, R: restart time, T_s: failure-free compute time.
"""

from __future__ import annotations

import math


def young_interval(delta: float, mtbf: float) -> float:
    """Young (1974), first order: tau = sqrt(2 delta M)."""
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly (2006), eq. 37, higher order:
    tau = sqrt(2 delta M) [1 + 1/3 sqrt(delta / 2M) + 1/9 (delta / 2M)] - delta  (delta < 2M), else M.
    """
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def daly_expected_time(work: float, tau: float, delta: float, restart: float, mtbf: float) -> float:
    """Daly (2006), eq. 20: T_w = M e^{R/M} (e^{(tau + delta)/M} - 1) T_s / tau.

    Exponential failures that may also strike during a restart (which then starts over),
    every segment of tau compute followed by a checkpoint of delta.
    """
    try:
        return mtbf * math.exp(restart / mtbf) * math.expm1((tau + delta) / mtbf) * work / tau
    except OverflowError:  # e^{R/M} past the largest float: failures far faster than restarts
        return math.inf


def job_mtbf(gpu_mtbf: float, num_gpus: int) -> float:
    """Independent exponential GPU failures: the job fails at the sum of the rates."""
    return gpu_mtbf / max(num_gpus, 1)
