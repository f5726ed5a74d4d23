"""Failure simulation of a whole training run, vectorised over seeds and checkpoint intervals.

Model (Daly 2006, with the Llama 3 / OPT logbooks' vocabulary):
- Hardware fails on its own clock: per-GPU lifetimes are exponential (or Weibull with
  shape k and mean the GPU MTBF, every GPU new at t=0 and again when replaced: k < 1 front-loads
  failures, infant mortality; k > 1 delays them, wear-out; Schroeder & Gibson, DSN 2006, fit
  k 0.7-0.8 to the times between failures of HPC nodes), so the failure times of one seed are drawn
  once and shared by every checkpoint interval (common random numbers: the sweep compares
  intervals on the same bad luck, which makes its minimum stable).
- The job computes in segments of `interval` seconds, each followed by a checkpoint of
  `checkpoint_s` (sync: the job waits; async: it waits only `async_blocking_s` for the
  snapshot and the checkpoint becomes durable `checkpoint_s` later).
- A failure loses the work since the last durable checkpoint and costs `restart_s`
  (detection, rescheduling, reload); a failure during a restart starts it over. With
  `spares` hot spare nodes, a failed node goes to repair for `repair_hours`; when no
  spare is free the restart also waits for the first repaired node. `spares=None` means
  the pool never runs dry (what `restart_s` alone describes).

Event stepping: failures are processed in time order for all (interval, seed) pairs at
once as numpy arrays, so a 30-day run of 16,384 GPUs with 100 seeds takes milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .daly import daly_expected_time, daly_interval, job_mtbf, young_interval

# Failures drawn per seed (8 bytes each, times every checkpoint interval swept): the 30-day
# 16,384-GPU benchmark (benchmarks/sim_speed.py) draws ~350, so this leaves 300x headroom.
MAX_FAILURES_PER_SEED = 100_000


# The Weibull shapes the simulation takes: a decade either side of the 0.7-0.8 that Schroeder &
# Gibson (DSN 2006) fit to HPC node failures, as the simulation was written (commit 4853fc6).
WEIBULL_SHAPES = (0.1, 10.0)


def weibull_shape_problem(shape: float | None) -> str | None:
    """Why `shape` is not a Weibull shape the simulation takes (0, NaN and infinities included), or None."""
    low, high = WEIBULL_SHAPES
    if shape is None or low <= shape <= high:
        return None
    return f"--weibull-shape must be between {low:g} and {high:g}, got {shape:g}"


class ReliabilityError(ValueError):
    """A run description that cannot be simulated; the message says what to change."""


class RunDoesNotFinish(ReliabilityError):
    """Failures come faster than the run makes progress: a fate of the run, not a wrong input
    (a what-if sweep marks that point and goes on)."""


@dataclass(frozen=True)
class RunSpec:
    work_s: float  # failure-free compute time the run needs
    num_gpus: int
    gpu_mtbf_hours: float
    restart_s: float
    checkpoint_s: float  # write time of one checkpoint
    async_checkpoint: bool = False
    async_blocking_s: float = 0.0  # what an async checkpoint still blocks (GPU -> host snapshot)
    weibull_shape: float | None = None  # None or 1: exponential
    spares: int | None = None  # hot spare nodes; None: never short of one
    gpus_per_node: int = 8
    repair_hours: float = 24.0  # chosen: a failed node swapped within a working day (no fleet figure here)

    def __post_init__(self) -> None:
        checks = (
            ("work", self.work_s > 0, "give --days or --tokens greater than 0"),
            ("num_gpus", self.num_gpus >= 1, "the plan must use at least one GPU"),
            ("MTBF", self.gpu_mtbf_hours > 0, "--mtbf-hours must be greater than 0"),
            ("restart time", self.restart_s >= 0, "--restart-minutes must not be negative"),
            (
                "checkpoint time",
                self.checkpoint_s >= 0,
                "--checkpoint-minutes must not be negative",
            ),
            ("spares", self.spares is None or self.spares >= 0, "--spares must not be negative"),
            ("repair time", self.repair_hours > 0, "repair hours must be greater than 0"),
        )
        for name, ok, fix in checks:
            if not ok:
                raise ReliabilityError(f"invalid {name}: {fix}")
        problem = weibull_shape_problem(self.weibull_shape)
        if problem:
            raise ReliabilityError(problem)

    @property
    def job_mtbf_s(self) -> float:
        return job_mtbf(self.gpu_mtbf_hours * 3600.0, self.num_gpus)

    @property
    def blocking_s(self) -> float:
        """Seconds a checkpoint stops training."""
        return (
            min(self.async_blocking_s, self.checkpoint_s)
            if self.async_checkpoint
            else self.checkpoint_s
        )

    @property
    def durable_lag_s(self) -> float:
        """Seconds after the blocking part until the checkpoint survives a failure."""
        return max(0.0, self.checkpoint_s - self.blocking_s) if self.async_checkpoint else 0.0


@dataclass
class SweepResult:
    """Per checkpoint interval (rows) and seed (columns)."""

    intervals_s: np.ndarray
    wall_s: np.ndarray  # (intervals, seeds) wall-clock to finish
    failures: np.ndarray  # (intervals, seeds) failures before the finish
    work_s: float
    extra: dict = field(default_factory=dict)
    spare_wait_s: np.ndarray | None = None  # (intervals, seeds) of the wall-clock spent waiting for a spare node

    @property
    def goodput(self) -> np.ndarray:
        """Per run (interval, seed): the spread over seeds."""
        return self.work_s / self.wall_s

    @property
    def mean_goodput(self) -> np.ndarray:
        """Per interval: work over the mean wall-clock, the basis of the days and the cost beside it
        (the mean of per-seed ratios is higher, by Jensen's inequality, wherever the seeds differ)."""
        return self.work_s / self.wall_s.mean(axis=1)

    def best(self) -> tuple[float, int]:
        """(interval minimising the mean wall-clock, refined by a parabola in log interval; its row)."""
        mean = self.wall_s.mean(axis=1)
        i = int(np.argmin(mean))
        lo, hi = max(0, i - 3), min(len(mean), i + 4)
        x = np.log(self.intervals_s[lo:hi])
        # a parabola needs 3 distinct intervals: a sweep may repeat one, or differ in the last bits
        # (Daly's beside a grid point), which numpy's polyfit warns of as poorly conditioned
        if len(np.unique(np.round(x, 6))) >= 3:
            centre = float(x.mean())  # centred: log intervals of ~7-12 with spreads under 1 condition badly
            a, b, _ = np.polyfit(x - centre, mean[lo:hi], 2)
            if a > 0:
                xs = centre - b / (2 * a)
                if x[0] <= xs <= x[-1]:
                    return float(np.exp(xs)), i
        return float(self.intervals_s[i]), i


# Under this closed-form goodput (Daly 2006 eq. 20, the failure model simulated here: work /
# expected wall-clock) a run is taken not to finish. The simulation follows a run up to ~3.8e5x
# its work (simulate_sweep: 1.5 x 1e3 x 2^8) and spins seconds before giving up past that (2-6 s
# a call, 800,000 H100s, measured); at 1e4x expected, no seed gets there.
HOPELESS_GOODPUT = 1e-4


def default_interval_s(spec: RunSpec) -> float:
    """The interval a run checkpoints at when none is given and too few failures are drawn to
    sweep: Daly's for what a checkpoint blocks (eq. 37; at least a second), never shorter than one
    asynchronous write (one in flight, as torch.distributed.checkpoint's async_save is used)."""
    shortest = spec.checkpoint_s if spec.async_checkpoint else 0.0
    return max(daly_interval(spec.blocking_s, spec.job_mtbf_s), 1.0, shortest)


def default_interval_text(spec: RunSpec) -> str:
    """`default_interval_s` in minutes, and what it is, for advice."""
    minutes = default_interval_s(spec) / 60.0
    if spec.async_checkpoint and spec.checkpoint_s >= default_interval_s(spec):
        return f"{minutes:.2g} (one asynchronous write, longer than Daly's interval)"
    return f"{minutes:.2g} (Daly's interval)"


def expected_wall_s(spec: RunSpec, interval_s: float | None = None) -> float:
    """Daly's closed-form expected wall-clock (eq. 20) of `spec` checkpointing every `interval_s`
    seconds (`default_interval_s` when None), as the failure simulation runs it; inf when it overflows.

    A run shorter than the interval is one segment. An asynchronous checkpoint is durable
    `durable_lag_s` (L) after its blocking copy, so every durable point comes L later: Daly's model
    with the blocking copy as the checkpoint cost and R + L as the restart, started L late (a
    failure loses the work of the last L too; tests/simulator/test_failures.py holds it to the
    simulation's mean within 1%, 400 seeds)."""
    lag = spec.durable_lag_s
    tau_s = min(interval_s or default_interval_s(spec), spec.work_s)
    return lag + daly_expected_time(spec.work_s, tau_s, spec.blocking_s, spec.restart_s + lag, spec.job_mtbf_s)


def expected_goodput(spec: RunSpec, interval_s: float | None = None) -> float:
    """Daly's closed-form goodput of `spec` (work / `expected_wall_s`); 0 when it overflows."""
    wall_s = expected_wall_s(spec, interval_s)
    return spec.work_s / wall_s if 0 < wall_s < math.inf else 0.0


def daly_failures(spec: RunSpec, interval_s: float | None = None) -> float:
    """Failures expected before `spec` finishes (expected wall-clock / job MTBF, Daly 2006) at
    `interval_s` (`default_interval_s` when None); inf when it never does."""
    good = expected_goodput(spec, interval_s)
    return spec.work_s / good / spec.job_mtbf_s if good > 0 else math.inf


def too_many_failures_reason(spec: RunSpec, interval_s: float | None = None) -> str:
    """Why the simulation does not follow `spec` at `interval_s` (past MAX_FAILURES_PER_SEED): it
    finishes on paper after that many failures (Daly's count, the one `smplan whatif` gives), or
    it never does."""
    fix = "raise --mtbf-hours (reliability.gpu_mtbf_hours), shorten --restart-minutes or use fewer GPUs"
    if spec.checkpoint_s >= spec.job_mtbf_s:  # no checkpoint completes between failures
        fix = (f"a checkpoint takes {spec.checkpoint_s:.3g} s, longer than the job runs between failures: "
               f"shorten --checkpoint-minutes, or {fix}")
    if interval_s and expected_goodput(spec, interval_s) < HOPELESS_GOODPUT <= expected_goodput(spec):
        return (f"the run does not finish: checkpointing every {interval_s / 60:.3g} min, the job (failing every "
                f"{spec.job_mtbf_s:.3g} s on average) makes no progress between failures; give a shorter "
                f"--checkpoint-interval-min, about {default_interval_text(spec)}, or none")
    if expected_goodput(spec, interval_s) >= HOPELESS_GOODPUT:
        return (f"the run fails too often to simulate: the job fails every {spec.job_mtbf_s:.3g} s on average, "
                f"about {daly_failures(spec, interval_s):.3g} times before it finishes (Daly 2006), and the "
                f"simulated horizon needs more than the {MAX_FAILURES_PER_SEED:,} failures a seed it follows; {fix}")
    return (f"the run does not finish: the job fails every {spec.job_mtbf_s:.3g} s on average, faster than "
            f"it makes progress between checkpoints; {fix}")


def failure_times(
    spec: RunSpec, seeds: int, horizon_s: float, rng: np.random.Generator, stream_seeds=None,
    interval_s: float | None = None,
) -> np.ndarray:
    """(seeds, K) sorted failure times before `horizon_s`, padded with +inf. `stream_seeds`:
    one seed per row for the exponential case (drawn from `rng` when not given); the same ones
    give the same failures, stretched by the MTBF, at any horizon. `interval_s`: the checkpoint
    interval that set the horizon, named when there are too many failures to follow."""
    expected = horizon_s / spec.job_mtbf_s  # failures per seed (Weibull renewals: counted as drawn, below)
    if expected > MAX_FAILURES_PER_SEED:
        raise RunDoesNotFinish(too_many_failures_reason(spec, interval_s))
    shape = spec.weibull_shape
    if shape is None or shape == 1.0:
        rate_mean = spec.job_mtbf_s
        expected = horizon_s / rate_mean
        k = max(8, int(expected + 6 * math.sqrt(expected) + 8))
        # Common random numbers across MTBFs too: each seed draws its own stream of unit
        # exponentials, scaled by the job MTBF, so runs that differ only in MTBF (whatif's
        # goodput-vs-MTBF curve) see the same failures stretched, not fresh draws that can
        # make a less reliable cluster look better (a 10-seed curve once rose as MTBF fell).
        if stream_seeds is None:
            stream_seeds = rng.integers(2**63, size=seeds)
        streams = [np.random.default_rng(s) for s in stream_seeds]

        def draw() -> np.ndarray:
            return np.cumsum(np.stack([g.standard_exponential(k) for g in streams]), axis=1) * rate_mean

        times = draw()
        while times[:, -1].min() < horizon_s:  # rare: draw more, each seed's stream continued
            times = np.concatenate([times, times[:, -1:] + draw()], axis=1)
        times[times >= horizon_s] = np.inf
        keep = int(np.isfinite(times).sum(axis=1).max())
        return times[:, : max(keep, 1)]
    # Weibull lifetimes per GPU (mean = GPU MTBF), renewed on replacement.
    scale = spec.gpu_mtbf_hours * 3600.0 / math.gamma(1.0 + 1.0 / shape)
    vals = (scale * rng.weibull(shape, size=(seeds, spec.num_gpus))).ravel()
    rows = np.repeat(np.arange(seeds), spec.num_gpus)
    got_rows, got_vals = [], []
    drawn = np.zeros(seeds, dtype=np.int64)
    while vals.size:
        hit = vals < horizon_s
        vals, rows = vals[hit], rows[hit]
        got_rows.append(rows)
        got_vals.append(vals)
        # a shape under 1 fails new GPUs early and often (a 0.1 on 128 GPUs: ~1,000x the
        # exponential count), so the job MTBF does not bound the draws: they are counted
        drawn += np.bincount(rows, minlength=seeds)
        if drawn.max() > MAX_FAILURES_PER_SEED:
            raise RunDoesNotFinish(
                f"the run fails too often to simulate: with --weibull-shape {shape:g}, new GPUs fail far more "
                f"often than the job MTBF of {spec.job_mtbf_s:.3g} s says, over {MAX_FAILURES_PER_SEED:,} times "
                "in one seed's simulated horizon; give a --weibull-shape nearer 1, raise --mtbf-hours or use "
                "fewer GPUs")
        vals = vals + scale * rng.weibull(shape, size=vals.shape)
    rows, vals = np.concatenate(got_rows), np.concatenate(got_vals)
    order = np.lexsort((vals, rows))
    rows, vals = rows[order], vals[order]
    counts = np.bincount(rows, minlength=seeds)
    out = np.full((seeds, max(int(counts.max(initial=0)), 1)), np.inf)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    out[rows, np.arange(len(rows)) - starts[rows]] = vals
    return out


def spare_waits(spec: RunSpec, times: np.ndarray) -> np.ndarray:
    """(seeds, K) extra seconds each failure waits for a spare node (0 with enough spares)."""
    if spec.spares is None:
        return np.zeros_like(times)
    repair = spec.repair_hours * 3600.0
    waits = np.zeros_like(times)
    k_idx = np.arange(times.shape[1])
    for r in range(times.shape[0]):
        row = times[r]
        finite = np.isfinite(row)
        back = row + repair
        first_out = np.searchsorted(back, row, side="right")  # earliest failure still in repair
        in_repair = k_idx - first_out
        short = finite & (in_repair >= spec.spares)
        idx = first_out[short] + in_repair[short] - spec.spares
        waits[r, short] = np.maximum(0.0, back[idx] - row[short])
    return waits


def horizon_s(spec: RunSpec, worst_wall_s: float) -> float:
    """A horizon that a run expected to take `worst_wall_s` almost surely finishes in (simulate_sweep
    doubles it when not): 1.5x that, capped at 1e3x the work, plus room for ten restarts,
    checkpoints and failure intervals."""
    return 1.5 * min(worst_wall_s, 1e3 * spec.work_s) + 10 * (spec.restart_s + spec.checkpoint_s) + 10 * spec.job_mtbf_s


def simulate_sweep(spec: RunSpec, intervals_s, seeds: int = 100, seed: int = 0,
                   given_s: float | None = None) -> SweepResult:
    """Wall-clock to finish `spec.work_s` for every interval and seed. `given_s`: the interval the
    user gave, named when the failures to follow are too many (else Daly's count is given)."""
    intervals = np.atleast_1d(np.asarray(intervals_s, dtype=float))
    if (intervals <= 0).any():
        raise ReliabilityError("checkpoint intervals must be greater than 0 minutes")
    if seeds < 1:
        raise ReliabilityError(f"--seeds must be at least 1, got {seeds}")
    rng = np.random.default_rng(seed)
    # A horizon that the slowest interval almost surely finishes in; doubled if not.
    horizon = horizon_s(spec, max(expected_wall_s(spec, float(t)) for t in (intervals.min(), intervals.max())))
    stream_seeds = rng.integers(2**63, size=seeds)  # once: a longer horizon extends the same draws
    for _ in range(8):
        times = failure_times(spec, seeds, horizon, rng, stream_seeds, given_s)
        waits = spare_waits(spec, times)
        wall, fails, waited = _step(spec, intervals, times, waits)
        late = wall > horizon
        if not late.any():
            return SweepResult(intervals, wall, fails, spec.work_s, {"horizon_s": horizon}, waited)
        seen = (horizon, waited[late], fails[late])  # the runs past the horizon: what held them up
        horizon *= 2.0
    raise RunDoesNotFinish(no_finish_reason(spec, *seen))


# Over this share of the simulated wall-clock spent on one thing (waiting for a spare node, or
# restarting), that thing is named as why the run does not finish: the majority of its time.
MAIN_CAUSE_SHARE = 0.5


def no_finish_reason(spec: RunSpec, horizon_s: float, spare_wait_s: np.ndarray, failures: np.ndarray) -> str:
    """Why runs that the simulation followed for `horizon_s` did not finish, from what it saw in them
    (`spare_wait_s`, `failures`: one per unfinished run): waiting for spare nodes, restarting, or else
    failures undoing the work between checkpoints; the message names the options that change it."""
    days = horizon_s / 86400.0
    spare_share = min(float(np.mean(spare_wait_s)) / horizon_s, 1.0)
    # an upper bound: a failure during a restart cuts it short, but a share over half is still most of the time
    restart_share = min(float(np.mean(failures)) * spec.restart_s / horizon_s, 1.0)
    mtbf_h = spec.job_mtbf_s / 3600.0
    head = f"the run does not finish: followed for {days:,.0f} simulated days,"
    if spec.spares is not None and spare_share >= MAIN_CAUSE_SHARE and spare_share >= restart_share:
        # Little's law (Little 1961): nodes in repair = failure rate x repair time
        in_repair = spec.repair_hours / mtbf_h
        spares = f"{spec.spares} spare node{'' if spec.spares == 1 else 's'}"
        return (f"{head} it spent {spare_share:.0%} of them waiting for a spare node: a node fails every {mtbf_h:.3g} h "
                f"and is out {spec.repair_hours:g} h, so about {in_repair:.3g} are in repair at once against "
                f"{spares}; give --spares {max(math.ceil(in_repair), spec.spares + 1)} or more, or a shorter "
                "--repair-hours")
    if restart_share >= MAIN_CAUSE_SHARE:
        return (f"{head} it failed every {mtbf_h:.3g} h and spent {restart_share:.0%} of them restarting "
                f"({spec.restart_s / 60:.3g} min each); shorten --restart-minutes or raise --mtbf-hours")
    return (f"{head} failures every {mtbf_h:.3g} h undid the work between checkpoints faster than it was done; "
            "raise --mtbf-hours, shorten --checkpoint-minutes or give a shorter --checkpoint-interval-min")


def _step(spec: RunSpec, intervals: np.ndarray, times: np.ndarray, waits: np.ndarray):
    """Process failures in order for every (interval, seed) pair at once: (wall-clock, failures,
    seconds waited for a spare node), each (intervals, seeds)."""
    n_tau, seeds = len(intervals), times.shape[0]
    tau = np.broadcast_to(intervals[:, None], (n_tau, seeds))
    period = tau + spec.blocking_s
    lag = spec.durable_lag_s
    work = spec.work_s
    t = np.zeros((n_tau, seeds))  # when computing (re)starts
    done = np.zeros((n_tau, seeds))  # durable work
    wall = np.full((n_tau, seeds), np.inf)
    fails = np.zeros((n_tau, seeds))
    waited = np.zeros((n_tau, seeds))  # wall-clock spent waiting for a spare node
    pending = np.zeros((n_tau, seeds))  # the wait that opens the last restart (the node comes first)...
    since = np.zeros((n_tau, seeds))  # ...and when that restart began
    active = np.ones((n_tau, seeds), dtype=bool)

    def time_to_finish(done_now):
        remaining = work - done_now
        segments = np.ceil(remaining / tau - 1e-12)
        return remaining + segments * spec.blocking_s + lag

    for k in range(times.shape[1]):
        f = np.broadcast_to(times[:, k][None, :], (n_tau, seeds))
        if not np.isfinite(times[:, k]).any():
            break
        wait = np.broadcast_to(waits[:, k][None, :], (n_tau, seeds))
        restart = spec.restart_s + wait
        need = time_to_finish(done)
        finishes = active & (t + need <= f)
        wall[finishes] = (t + need)[finishes]
        active &= ~finishes
        hit = active & np.isfinite(f)
        during_restart = hit & (f < t)
        computing = hit & ~during_restart
        segs = np.floor(np.maximum(f - t - lag, 0.0) / period)
        done = np.where(computing, np.minimum(done + segs * tau, work), done)
        t = np.where(hit, f + restart, t)
        fails += hit
        # a failure in a restart cuts its wait short: only the part already waited is wall-clock spent on it
        cut = np.where(during_restart, np.maximum(pending - (f - since), 0.0), 0.0)
        waited += np.where(hit, wait, 0.0) - cut
        pending, since = np.where(hit, wait, pending), np.where(hit, f, since)
    rest = active
    wall[rest] = (t + time_to_finish(done))[rest]
    return wall, fails, waited


@dataclass
class RunReport:
    """What `smplan reliability` prints; times in seconds."""

    work_s: float
    job_mtbf_s: float
    checkpoint_s: float
    blocking_s: float
    restart_s: float
    interval_s: float
    # "auto" (the sweep's best), "given", "daly" (too few failures drawn to sweep), or "whole_run"
    # (the run is shorter than either: one segment)
    interval_source: str
    best_interval_s: float
    young_interval_s: float
    daly_interval_s: float
    goodput_mean: float
    goodput_std: float  # over the seeds (a few failures make it skewed: p10..p90 can miss the mean)
    goodput_p10: float
    goodput_p50: float
    goodput_p90: float
    wall_mean_s: float
    wall_p10_s: float
    wall_p50_s: float
    wall_p90_s: float
    failures_mean: float
    daly_expected_wall_s: float
    seeds: int
    sweep: list[dict] = field(default_factory=list)
    sweep_failures: int = 0  # failures over all seeds at the sweep's best interval
    seeds_without_failure: int = 0  # seeds that finish with no failure (a short run: most; then p10..p90 can miss the mean)
    spares: int | None = None  # hot spare nodes; None: never short of one
    repair_hours: float | None = None  # how long a failed node is out (None: without spares it never matters)
    weibull_shape: float | None = None  # None: exponential GPU lifetimes
    spare_wait_mean_s: float = 0.0  # wall-clock spent waiting for a spare node, mean over seeds

    def to_dict(self) -> dict:
        import dataclasses

        return dataclasses.asdict(self)


# The sweep simulates the grid's intervals whose closed-form wall-clock (`expected_wall_s`) is
# within this factor of the grid's best and whose horizon (`horizon_s`) holds no more failures
# than a seed follows: one further out cannot be the optimum (Daly's closed form and the
# simulation agree to noise, tests/simulator/test_failures.py), and a run that itself finishes must
# not be refused for it (a review: a 30-day run of 128 GPUs at 20 h per GPU was, for its
# 6x-Young grid point alone). The best is always simulated.
SWEEP_SPAN = 2.0

# Under this many failures over all seeds at the sweep's best interval, the auto interval is
# Daly's: a Poisson count of K is known to 1/sqrt(K) (over 22% under 20), while the mean
# wall-clock is flat around its optimum (zero derivative there), so the sweep's minimum is noise;
# with no failure drawn at all it is simply the longest interval tried.
MIN_SWEEP_FAILURES = 20


def analyse_run(
    spec: RunSpec,
    interval_s: float | None = None,
    seeds: int = 100,
    seed: int = 0,
    points: int = 33,
) -> RunReport:
    """Sweep checkpoint intervals around Young's, pick the best, report it (or the given one)."""
    m = spec.job_mtbf_s
    # Young's and Daly's delta is what a checkpoint stops training for; the sweep's grid is
    # centred on Young's interval for at least a second of it.
    cost = spec.blocking_s
    young = young_interval(cost, m)
    daly = daly_interval(cost, m)
    anchor = young_interval(max(cost, 1.0), m)
    # An asynchronous write must end before the next one starts (one in flight, as
    # torch.distributed.checkpoint's async_save is used): no interval shorter than a write.
    shortest = spec.checkpoint_s if spec.async_checkpoint else 0.0
    if interval_s and interval_s < shortest:
        raise ReliabilityError(
            f"a checkpoint interval of {interval_s / 60:.3g} min is shorter than one asynchronous checkpoint write "
            f"({shortest / 60:.3g} min): the next write would start before the last one ends; give an interval of "
            f"at least {math.ceil(shortest / 60)} min, or leave it to the sweep")
    if interval_s and expected_goodput(spec, interval_s) < HOPELESS_GOODPUT:  # before seconds of simulation
        raise RunDoesNotFinish(too_many_failures_reason(spec, interval_s))
    low = max(anchor / 10.0, 1.0, shortest)
    grid = np.geomspace(low, max(min(anchor * 6.0, spec.work_s), 2.0, low), points)
    extra = [daly] if daly >= max(shortest, 1e-9) else []
    grid = np.unique(np.concatenate([grid, extra]))
    expected = np.array([expected_wall_s(spec, float(t)) for t in grid])
    if np.isfinite(expected.min()):  # the best, and those near it whose horizon the failures followed can hold
        fits = np.array([horizon_s(spec, e) / m <= MAX_FAILURES_PER_SEED for e in expected])
        grid = grid[((expected <= SWEEP_SPAN * expected.min()) & fits) | (expected == expected.min())]
    grid = np.unique(np.concatenate([grid] + ([[interval_s]] if interval_s else [])))
    res = simulate_sweep(spec, grid, seeds, seed, given_s=interval_s)
    best, best_row = res.best()
    at_best = None
    if best != float(res.intervals_s[best_row]):
        # The parabola's vertex, run on the same failure draws: kept only where it beats the grid's
        # best (near a flat optimum the fit's vertex can land on a worse point).
        at_best = simulate_sweep(spec, [best], seeds, seed)
        if at_best.wall_s[0].mean() > res.wall_s[best_row].mean():
            best, at_best = float(res.intervals_s[best_row]), None
    drawn = int(res.failures[best_row].sum())
    source = "given" if interval_s else "auto"
    chosen = interval_s if interval_s else best
    if interval_s is None and drawn < MIN_SWEEP_FAILURES and (daly > 0 or young > 0):
        chosen, source = default_interval_s(spec), "daly"
    if interval_s is None and chosen > max(spec.work_s, shortest):
        # a run shorter than the interval is one segment, though never shorter than a write
        chosen, source = max(spec.work_s, shortest), "whole_run"
    row = int(np.argmin(np.abs(res.intervals_s - chosen)))
    if res.intervals_s[row] == chosen:  # a point of the sweep (the given one always is): its draws
        wall, fails, waited = res.wall_s[row], res.failures[row], res.spare_wait_s[row]
    else:  # the parabola's vertex, Daly's or the run's length: evaluated on the same failure draws
        one = at_best if at_best is not None and chosen == best else simulate_sweep(spec, [chosen], seeds, seed)
        wall, fails, waited = one.wall_s[0], one.failures[0], one.spare_wait_s[0]
    good = spec.work_s / wall
    mean_wall = res.wall_s.mean(axis=1)
    sweep = [
        {"interval_s": float(i), "wall_mean_s": float(w), "goodput_mean": float(spec.work_s / w)}
        for i, w in zip(res.intervals_s, mean_wall, strict=True)
    ]
    return RunReport(
        work_s=spec.work_s,
        job_mtbf_s=m,
        checkpoint_s=spec.checkpoint_s,
        blocking_s=spec.blocking_s,
        restart_s=spec.restart_s,
        interval_s=float(chosen),
        interval_source=source,
        best_interval_s=best,
        young_interval_s=young,
        daly_interval_s=daly,
        goodput_mean=float(spec.work_s / wall.mean()),  # the basis of wall_mean_s and of whatif's days and cost
        goodput_std=float(np.std(good)),
        goodput_p10=float(np.percentile(good, 10)),
        goodput_p50=float(np.percentile(good, 50)),
        goodput_p90=float(np.percentile(good, 90)),
        wall_mean_s=float(wall.mean()),
        wall_p10_s=float(np.percentile(wall, 10)),
        wall_p50_s=float(np.percentile(wall, 50)),
        wall_p90_s=float(np.percentile(wall, 90)),
        failures_mean=float(fails.mean()),
        daly_expected_wall_s=expected_wall_s(spec, float(chosen)),
        seeds=seeds,
        sweep=sweep,
        sweep_failures=drawn,
        seeds_without_failure=int((fails == 0).sum()),
        spares=spec.spares,
        repair_hours=spec.repair_hours if spec.spares is not None else None,
        weibull_shape=spec.weibull_shape,
        spare_wait_mean_s=float(waited.mean()),
    )
