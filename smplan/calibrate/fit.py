"""Fit the global efficiency factors of a profile to measured step times.

Pure: no plans, no executor. The caller passes `predict(cluster) -> step times`, one per
measured run, so any model of a run (the planner's closed form, the simulator) can be
calibrated, and hardware profiles stay ignorant of plans (DESIGN.md ownership table).

What is fitted is the handful of `Efficiency` fields that every run shares, never a term
per run: with K runs and F factors, F stays fixed however many runs there are.

Loss (log-space least squares with a weak prior, i.e. ridge regression on log factors,
Hoerl & Kennard 1970): sum_i log(pred_i / meas_i)^2 + w * sum_j log(f_j / f0_j)^2.
Log ratios treat "2x too slow" and "2x too fast" alike; the prior keeps factors that the
runs cannot tell apart (say memory_bound vs host overhead with two runs) at the probe's
values instead of letting them wander.
Search, in log space: Levenberg-Marquardt (Marquardt 1963) with forward-difference
Jacobians and bounds by projection, then a Hooke-Jeeves pattern search (Hooke & Jeeves
1961) to polish, which needs no derivatives where the cost model's max(GPU, host) kinks.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from smplan.hwprofiles.cluster import Cluster, Efficiency, HardwareProfileError

# The time factors of `Efficiency`; `memory_reserve_gib` is a size, not a speed.
FIT_KEYS = ("matmul_max", "matmul_half_dim", "memory_bound", "network", "host_overhead_us_per_layer")
FRACTIONS = ("matmul_max", "memory_bound", "network")  # must stay in (0, 1]
# Floors keep log() finite; a half-dim of 0.01 or a host time of 0.01 us is "none" in effect.
FLOOR = {"matmul_half_dim": 1e-2, "host_overhead_us_per_layer": 1e-2}
MIN_FRACTION = 1e-3
# A factor is determined by the runs when changing it by INFORM_STEP (log space, ~10%, either way
# within its bounds) moves some plan's predicted step by more than INFORM_TOLERANCE (log, ~0.1%).
# Host time overlaps GPU work (a max, not a sum): plans whose GPU work hides it say nothing of it,
# and the prior alone keeps its start value, which must not then be called fitted.
INFORM_STEP = 0.1
INFORM_TOLERANCE = 1e-3


class CalibrationError(ValueError):
    """Calibration inputs that cannot be fitted; the message says what to change."""


@dataclass(frozen=True)
class FitResult:
    efficiency: Efficiency
    keys: tuple[str, ...]
    loss_before: float
    loss_after: float
    evaluations: int
    undetermined: tuple[str, ...] = ()  # keys no plan's prediction depends on (see `undetermined_keys`)

    @property
    def determined(self) -> tuple[str, ...]:
        """The keys the runs set (the rest kept their start values)."""
        return tuple(k for k in self.keys if k not in self.undetermined)

    def changes(self, before: Efficiency) -> dict[str, tuple[float, float]]:
        """key -> (before, after) for the fitted keys."""
        return {k: (getattr(before, k), getattr(self.efficiency, k)) for k in self.keys}


def fit_efficiency(
    cluster: Cluster,
    predict: Callable[[Cluster], Sequence[float]],
    measured_s: Sequence[float],
    keys: Sequence[str] = FIT_KEYS,
    prior_weight: float = 0.01,  # chosen: only breaks ties among fits the measurements cannot tell apart
    tolerance: float = 1e-3,
    max_evaluations: int = 3000,
) -> FitResult:
    """The efficiency factors (of `keys`) that make `predict` match `measured_s` best.

    `predict(c)` returns one predicted step time per measured run on cluster `c`;
    `tolerance` is the final step in log space (1e-3 ~ 0.1% of a factor).
    """
    keys = tuple(keys)
    unknown = [k for k in keys if k not in FIT_KEYS]
    if unknown:
        raise CalibrationError(f"cannot fit {unknown[0]!r}; fit a subset of {', '.join(FIT_KEYS)}")
    if not keys:
        raise CalibrationError(f"nothing to fit; name at least one of {', '.join(FIT_KEYS)}")
    meas = [float(m) for m in measured_s]
    if not meas or any(not m > 0 or not math.isfinite(m) for m in meas):
        raise CalibrationError(f"measured step times must be positive numbers, got {meas}")
    start = cluster.efficiency
    x0 = [_to_x(k, getattr(start, k)) for k in keys]
    evaluations = 0

    def residuals(x: list[float]) -> np.ndarray:
        nonlocal evaluations
        evaluations += 1
        pred = list(predict(_with(cluster, keys, x)))
        if len(pred) != len(meas):
            raise CalibrationError(f"predict returned {len(pred)} times for {len(meas)} measured runs")
        data = [_log_ratio(p, m) for p, m in zip(pred, meas, strict=True)]
        prior = [math.sqrt(prior_weight) * (a - b) for a, b in zip(x, x0, strict=True)]
        return np.array(data + prior)

    def loss(x: list[float]) -> float:
        return float(np.sum(residuals(x) ** 2))

    x = _levenberg_marquardt(residuals, _clip(keys, x0), keys, max_evaluations // 2)
    x, best = _pattern_search(loss, x, keys, tolerance, max_evaluations - evaluations)
    undetermined = undetermined_keys(_with(cluster, keys, x), predict, keys, start)
    if undetermined:  # kept exactly as given: the search may have nudged them, within the tolerance
        x = [a if k in undetermined else b for k, a, b in zip(keys, x0, x, strict=True)]
        best = loss(x)
    fitted = dataclasses.replace(_with(cluster, keys, x).efficiency, **{k: getattr(start, k) for k in undetermined})
    return FitResult(fitted, keys, loss(x0), best, evaluations, undetermined)


def undetermined_keys(cluster: Cluster, predict: Callable[[Cluster], Sequence[float]], keys: Sequence[str],
                      start: Efficiency | None = None, step: float = INFORM_STEP,
                      tolerance: float = INFORM_TOLERANCE) -> tuple[str, ...]:
    """The keys whose change by `step` (log space, up and down within the bounds, one key at a
    time) moves no prediction of `predict` on `cluster` by more than `tolerance` (log ratio), nor
    does putting back their value in `start`, where the fit began: runs that moved a key to where
    it no longer matters (matmul_half_dim far below every GEMM's size, say) did determine it."""
    base = list(predict(cluster))

    def tried(key: str) -> list[float]:
        return _neighbours(key, getattr(cluster.efficiency, key), step) + ([getattr(start, key)] if start else [])

    return tuple(k for k in keys if not any(_moves(predict, base, _with_one(cluster, k, v), tolerance) for v in tried(k)))


def _neighbours(key: str, value: float, step: float) -> list[float]:
    """`value` moved by `step` either way in log space, clipped to the key's bounds (unmoved ones dropped)."""
    x = _to_x(key, value)
    moved = (_clip((key,), [x + sign * step])[0] for sign in (1.0, -1.0))
    return [math.exp(m) for m in moved if m != x]


def _moves(predict, base: list[float], cluster: Cluster, tolerance: float) -> bool:
    return any(abs(_log_ratio(p, b)) > tolerance for p, b in zip(predict(cluster), base, strict=True))


def _with_one(cluster: Cluster, key: str, value: float) -> Cluster:
    return dataclasses.replace(cluster, efficiency=dataclasses.replace(cluster.efficiency, **{key: value}))


def _levenberg_marquardt(residuals, x0: list[float], keys, budget: int, h: float = 1e-4) -> list[float]:
    """Damped Gauss-Newton steps, projected onto the bounds; stops when no step helps."""
    x = np.array(x0, dtype=float)
    r = residuals(list(x))
    cost, lam, used = float(r @ r), 1e-2, 1
    while used + len(x) + 1 < budget:
        jac = np.empty((len(r), len(x)))
        for j in range(len(x)):
            step = x.copy()
            dx = -h if keys[j] in FRACTIONS and x[j] + h > 0 else h  # stay inside (0, 1]
            step[j] += dx
            jac[:, j] = (residuals(list(step)) - r) / dx
        used += len(x)
        grad_n = jac.T @ jac
        improved = False
        while lam < 1e8 and used < budget:
            delta = np.linalg.solve(grad_n + lam * (np.diag(np.diag(grad_n)) + np.eye(len(x))), -jac.T @ r)
            trial = np.array(_clip(keys, list(x + delta)))
            r_trial = residuals(list(trial))
            used += 1
            if float(r_trial @ r_trial) < cost:
                improved = cost - float(r_trial @ r_trial) > 1e-12 * max(cost, 1e-30)
                x, r, cost, lam = trial, r_trial, float(r_trial @ r_trial), max(lam / 3, 1e-9)
                break
            lam *= 4
        if not improved:
            break
    return list(x)


def _pattern_search(loss, x0: list[float], keys, tolerance: float, budget: int) -> tuple[list[float], float]:
    """Hooke-Jeeves: probe +-step per coordinate, jump along the improvement, halve the step."""
    x, best, step = list(x0), loss(x0), 0.5
    evaluations = 1
    while step >= tolerance and evaluations < budget:
        trial, trial_loss = _explore(loss, x, best, keys, step)
        evaluations += 2 * len(x)
        if trial_loss < best:
            # pattern move: keep going in the direction that helped while it helps
            while True:
                jump = _clip(keys, [2 * t - o for t, o in zip(trial, x, strict=True)])
                x, best = trial, trial_loss
                trial, trial_loss = _explore(loss, jump, loss(jump), keys, step)
                evaluations += 2 * len(x) + 1
                if trial_loss >= best or evaluations >= budget:
                    break
        else:
            step /= 2
    return x, best


def _explore(loss, base: list[float], base_loss: float, keys, step: float) -> tuple[list[float], float]:
    x, best = list(base), base_loss
    for j in range(len(x)):
        for sign in (1.0, -1.0):
            trial = list(x)
            trial[j] += sign * step
            trial = _clip(keys, trial)
            if trial == x:
                continue
            value = loss(trial)
            if value < best:
                x, best = trial, value
                break
    return x, best


def _to_x(key: str, value: float) -> float:
    return math.log(max(value, FLOOR.get(key, MIN_FRACTION)))


def _clip(keys, x: list[float]) -> list[float]:
    """Fractions stay <= 1, the others >= their floor (log space)."""
    out = []
    for k, v in zip(keys, x, strict=True):
        low = math.log(FLOOR.get(k, MIN_FRACTION))
        out.append(min(max(v, low), 0.0) if k in FRACTIONS else max(v, low))
    return out


def _with(cluster: Cluster, keys, x: list[float]) -> Cluster:
    values = {k: math.exp(v) for k, v in zip(keys, x, strict=True)}
    try:
        return dataclasses.replace(cluster, efficiency=dataclasses.replace(cluster.efficiency, **values))
    except HardwareProfileError as err:  # pragma: no cover - _clip keeps fractions in (0, 1]
        raise CalibrationError(f"fitted factors left their valid range: {err}") from None


def _log_ratio(pred: float, meas: float) -> float:
    if not pred > 0 or not math.isfinite(pred):
        return 10.0  # a non-positive prediction is as wrong as a factor of e^10
    return math.log(pred / meas)


# ----------------------------------------------------------------- error measures


def ape(predicted: float, measured: float) -> float:
    """Absolute percentage error |p - m| / m, as a fraction (0.1 = 10%)."""
    return abs(predicted - measured) / measured


def median(values: Sequence[float]) -> float:
    """statistics.median, NaN for no values (a report row with nothing to summarise)."""
    values = list(values)
    return statistics.median(values) if values else float("nan")


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (Spearman 1904): Pearson's r of the ranks, ties averaged."""
    if len(a) != len(b):
        raise CalibrationError(f"spearman needs two lists of one length, got {len(a)} and {len(b)}")
    if len(a) < 2:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va and vb else float("nan")


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks
