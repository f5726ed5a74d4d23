"""Predict every run of the validation folder (--validation-dir) and print one line per source.

Each line: rows used / skipped (with the top skip reasons), MAPE, median APE and mean signed
error of the predicted vs the measured step time, and how many runs are predicted not to fit
in their GPU's memory. How each published row becomes a CLI plan, and the per-source
framework defaults it assumes: benchmarks/sources.py (vTrain and SC21: benchmarks/published.py).

One set of global factors for all rows (the hardware profile's `efficiency.*`, which
`--hw-set efficiency.KEY=VALUE` may change for every row at once); no per-row fitting.
Default: the step simulation (contention on); `--fast`: the planner's closed form of the same
costs. `--rows` prints every row; `--by model|hw|dtype` one line per group under each source. `--loso` adds the leave-one-source-out table: the global
factors (`--fit-keys`, at most 3, smplan.calibrate.fit) are fitted on all sources but one and
the error is reported on the held-out one, next to the bundled factors' error on it.

    python benchmarks/validate_published.py [--fast] [--rows] [--by model] [--loso] [--sources a,b] [--hw-set KEY=VALUE]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from published import global_overrides, usage_error  # noqa: E402
from smplan.hwprofiles import HardwareProfileError, load_cluster  # noqa: E402
from smplan.planner import estimate, plan_costs, profile_model  # noqa: E402
from smplan.planner.memory_model import capacity_bytes  # noqa: E402
from smplan.simulator import simulate_plan  # noqa: E402
from sources import SOURCES, Mapped, Row, Skipped  # noqa: E402
from validation_data import ValidationDirError, add_validation_dir_option, resolve_validation_dir  # noqa: E402

from smplan.calibrate.fit import FIT_KEYS, CalibrationError, fit_efficiency  # noqa: E402

TARGETS = {"vtrain_multi_node.csv": 10.0, "vtrain_single_node.csv": 10.0, "megatron_sc21_table1.csv": 5.0}
DEFAULT_FIT_KEYS = ("matmul_max", "network", "host_overhead_us_per_layer")
FIT_ROWS_PER_SOURCE = 100  # rows per source the LOSO fit reads (even stride); every held-out row is scored
FIT_MAX_EVALUATIONS = 300  # closed-form passes per fit; ~0.1 s each with the capped rows
GIB = 2**30


@functools.cache
def _profile(model: str, args: tuple, dtype: str):
    """What `smplan simulate MODEL --arg ...` profiles (fp8 plans at bf16), once per shape."""
    return profile_model(model, dict(args), dtype=dtype)


RECOMPUTE_KINDS = ("selective", "sac", "full")  # what the planner may pick for a row that leaves it out


def _device_bytes(costs, device: int) -> float:
    return sum(costs.stages[c].memory.total_bytes for c in range(device, len(costs.stages), costs.pp))


def _recomputing(plan, kind: str, counts):
    return dataclasses.replace(plan, stages=tuple(dataclasses.replace(st, recompute=kind, recompute_blocks=r)
                                                  for st, r in zip(plan.stages, counts, strict=True)))


def _least_recompute(plan, profile, cluster, kind: str):
    """`plan` (its stated block split kept) with, on every GPU, the fewest blocks recomputed
    with `kind` that make it fit: memory is affine in the recomputed count from one block on
    (planner.memory_model; the first recomputed block also brings the re-materialisation
    buffer), so three evaluations give each GPU's count; None when recomputing all of them
    does not fit."""
    def with_counts(counts):
        return _recomputing(plan, kind, counts)

    cap = capacity_bytes(cluster)
    none = plan_costs(with_counts([0] * len(plan.stages)), profile, cluster)
    one = plan_costs(with_counts([int(c < plan.pp) for c in range(len(plan.stages))]), profile, cluster)
    every = plan_costs(with_counts([st.num_blocks for st in plan.stages]), profile, cluster)
    counts = [0] * len(plan.stages)
    for device in range(plan.pp):
        chunks = list(range(device, len(plan.stages), plan.pp))
        blocks = sum(plan.stages[c].num_blocks for c in chunks)
        low, first, high = _device_bytes(none, device), _device_bytes(one, device), _device_bytes(every, device)
        if low <= cap:
            continue
        if high > cap or not blocks:
            return None
        need = 1 if first <= cap else min(blocks, 1 + math.ceil((first - cap) / ((first - high) / (blocks - 1)) - 1e-9))
        for c in chunks:  # the device's chunks hold the same micro-batches: any of its blocks frees as much
            counts[c] = min(need, plan.stages[c].num_blocks)
            need -= counts[c]
    return with_counts(counts)


def complete_plan(m: Mapped, profile, cluster):
    """The row's plan with what its source leaves out (`m.choose`: recompute) picked as the
    planner would, everything the row states kept (its even block split included): for each
    recomputation kind the fewest recomputed blocks that fit every GPU, then the kind with the
    shortest simulated step (contention on: `smplan plan` ranks its best plans so,
    simulator/rank.py). Where none fits, every block fully recomputed (then counted over
    memory)."""
    if not m.choose:
        return m.plan
    if estimate(m.plan, profile, cluster).peak_memory_gib * GIB <= capacity_bytes(cluster):
        return m.plan
    kinds = [k for k in RECOMPUTE_KINDS if k != "sac" or profile.blocks[0].supports_sac]
    fits = [p for p in (_least_recompute(m.plan, profile, cluster, k) for k in kinds) if p is not None]
    if not fits:
        print(f"  {m.run}: no recomputation fits; scored with full recompute", file=sys.stderr)
        return _recomputing(m.plan, "full", [st.num_blocks for st in m.plan.stages])
    return min(fits, key=lambda p: simulate_plan(p, profile, cluster, record_events=False).step_time_s)


@dataclasses.dataclass
class Scored:
    row: Mapped
    predicted_s: float
    closed_s: float
    peak_gib: float
    capacity_gib: float
    plan: object = None  # the plan scored (the row's, completed by the planner where `choose` says)

    @property
    def error(self) -> float:
        return self.predicted_s / self.row.measured_s - 1


class Predictor:
    """Step time of a mapped row on its bundled profile, with optional global efficiency values."""

    def __init__(self, global_set: dict, simulate: bool, contention: bool):
        self.global_set, self.simulate, self.contention = global_set, simulate, contention
        self._clusters: dict = {}
        self._plans: dict = {}  # id(row) -> (row, its completed plan), chosen once with the bundled factors

    def base_cluster(self, m: Mapped):
        key = (m.hw, m.nodes, tuple(sorted(m.hw_set.items())), m.stack)
        if key not in self._clusters:  # the source's stack, then --hw-set over it, as `smplan simulate` does
            self._clusters[key] = load_cluster(m.hw, nodes=m.nodes, overrides={**m.hw_set, **self.global_set},
                                               stack=m.stack)
        return self._clusters[key]

    def cluster(self, m: Mapped, efficiency: dict | None = None):
        base = self.base_cluster(m)
        if not efficiency:
            return base
        return dataclasses.replace(base, efficiency=dataclasses.replace(base.efficiency, **efficiency))

    @staticmethod
    def profile(m: Mapped):
        return _profile(m.plan.model, tuple(sorted(m.model_args.items())), m.dtype)

    def plan(self, m: Mapped):
        if id(m) not in self._plans:  # the row is kept alongside, so its id stays its own
            self._plans[id(m)] = (m, complete_plan(m, self.profile(m), self.base_cluster(m)))
        return self._plans[id(m)][1]

    def closed(self, m: Mapped, efficiency: dict | None = None) -> float:
        return estimate(self.plan(m), self.profile(m), self.cluster(m, efficiency)).step_time_s

    def score(self, m: Mapped, efficiency: dict | None = None, simulate: bool | None = None) -> Scored:
        cluster, profile, plan = self.cluster(m, efficiency), self.profile(m), self.plan(m)
        fig = estimate(plan, profile, cluster)
        pred = fig.step_time_s
        if self.simulate if simulate is None else simulate:
            pred = simulate_plan(plan, profile, cluster, self.contention, record_events=False).step_time_s
        return Scored(m, pred, fig.step_time_s, fig.peak_memory_gib, capacity_bytes(cluster) / GIB, plan)


def stats(scored: list[Scored]) -> dict:
    """MAPE, median APE and mean signed error (%), predicted vs measured step time."""
    if not scored:
        return dict(n=0, mape=float("nan"), median=float("nan"), signed=float("nan"), over_memory=0)
    errs = [s.error for s in scored]
    return dict(n=len(errs), mape=100 * sum(abs(e) for e in errs) / len(errs),
                median=100 * statistics.median(abs(e) for e in errs), signed=100 * sum(errs) / len(errs),
                over_memory=sum(s.peak_gib > s.capacity_gib for s in scored))


def top_reasons(skipped: list[Skipped], k: int = 3) -> str:
    counts = Counter(reason for s in skipped for reason in s.reasons)
    return ", ".join(f"{reason} {n}" for reason, n in counts.most_common(k))


def score_source(name: str, rows: list[Row], pred: Predictor, show_rows: bool) -> tuple[list[Scored], list[Skipped]]:
    """Predict every mapped row; a row the cost model rejects joins the skipped ones."""
    scored, skipped = [], [r for r in rows if isinstance(r, Skipped)]
    for r in rows:
        if isinstance(r, Skipped):
            continue
        try:
            s = pred.score(r)
        except ValueError as err:  # PlanError / ProfileError: the CLI would refuse it too
            skipped.append(Skipped(r.source, r.run, f"rejected: {str(err).split(';')[0][:60]}"))
            continue
        scored.append(s)
        if show_rows:
            p = s.plan
            rec = p.recompute + (f"({sum(st.num_recomputed for st in p.stages)})" if p.recompute != "none" else "")
            print(f"  {name:>15} {r.run[:44]:<44} tp={p.tp:<2} pp={p.pp:<2} cp={p.cp} ep={p.ep:<2} dp={p.dp:<4} "
                  f"{'mxfp8' if p.fp8_scaling == 'block' else p.dtype:<5} mbs={p.micro_batch:<2} "
                  f"gbs={p.global_batch:<5} z={p.zero} rc={rec:<12} pred {s.predicted_s:9.3f} closed {s.closed_s:9.3f} "
                  f"meas {r.measured_s:9.3f} err {100 * s.error:+6.1f}% mem {s.peak_gib:5.1f}/{s.capacity_gib:.0f} GiB")
    return scored, skipped


GROUPINGS = ("model", "hw", "dtype")  # what --by splits a source's rows by


def group_label(m: Mapped, by: str) -> str:
    """The row's model (builder, layers x hidden), hardware profile or plan dtype (mxfp8: fp8 with
    block scaling), for --by."""
    if by == "hw":
        return m.hw
    if by == "dtype":
        return "mxfp8" if m.plan.fp8_scaling == "block" else m.plan.dtype
    builder = m.plan.model.rsplit(":", 1)[1] if m.plan.model.count(":") else "gpt"
    return f"{builder} {m.model_args.get('layers', '?')}x{m.model_args.get('hidden', '?')}"


def group_lines(scored: list[Scored], by: str) -> list[str]:
    """One indented summary per group of a source's rows, the largest mean signed error first:
    where a source's error comes from (a reading aid; nothing is fitted per group)."""
    groups: dict[str, list[Scored]] = {}
    for s in scored:
        groups.setdefault(group_label(s.row, by), []).append(s)
    ordered = sorted(groups.items(), key=lambda kv: -abs(stats(kv[1])["signed"]))
    return ["    " + summary_line(f"{label[:24]:<24}", stats(group), 0, "").replace("  skipped    0", "")
            for label, group in ordered]


def summary_line(name: str, st: dict, n_skipped: int, reasons: str, extra: str = "") -> str:
    head = f"{name:<16} used {st['n']:>4}  skipped {n_skipped:>4}"
    if st["n"]:
        head += (f"  MAPE {st['mape']:5.1f}%  median {st['median']:5.1f}%  signed {st['signed']:+6.1f}%"
                 f"  over-memory {st['over_memory']}")
    else:
        head += " " * 66
    return head + (f"  [{reasons}]" if reasons else "") + extra


# ----------------------------------------------------------------- leave one source out


def loso_splits(names: list[str]) -> list[tuple[str, list[str]]]:
    """(held-out source, the sources the factors are fitted on) for every source; needs >= 2."""
    if len(names) < 2:
        raise ValueError(f"leave-one-source-out needs at least 2 sources with rows, got {len(names)}")
    return [(held, [n for n in names if n != held]) for held in names]


def fit_subset(rows: list, cap: int = FIT_ROWS_PER_SOURCE) -> list:
    """At most `cap` rows at an even stride (deterministic), so no source's size buys it weight."""
    if len(rows) <= cap:
        return list(rows)
    step = len(rows) / cap
    return [rows[int(i * step)] for i in range(cap)]


def fit_factors(train: dict[str, list[Mapped]], pred: Predictor, keys: tuple[str, ...]) -> dict:
    """Global efficiency factors fitted on the training sources' rows (closed form, each source
    weighted equally: its log errors are scaled by 1/sqrt(n_source))."""
    rows = [(m, len(ms)) for ms in train.values() for m in ms]
    measured = [m.measured_s for m, _ in rows]
    start = pred.base_cluster(rows[0][0])

    def predict(cluster) -> list[float]:
        eff = {k: getattr(cluster.efficiency, k) for k in keys}
        out = []
        for m, n in rows:
            p = pred.closed(m, eff)
            # log(out / meas) = log(p / meas) / sqrt(n): equal weight per source, same loss code
            out.append(m.measured_s * (p / m.measured_s) ** (n ** -0.5))
        return out

    result = fit_efficiency(start, predict, measured, keys=keys, tolerance=1e-2,
                            max_evaluations=FIT_MAX_EVALUATIONS)
    return {k: getattr(result.efficiency, k) for k in keys}


def run_loso(used: dict[str, list[Scored]], pred: Predictor, keys: tuple[str, ...]) -> dict:
    names = [n for n, s in used.items() if s]
    print(f"\nleave-one-source-out: {', '.join(keys)} fitted on the other sources (closed form, each source "
          f"weighted equally, <= {FIT_ROWS_PER_SOURCE} rows each); error on the held-out source "
          f"({'simulated' if pred.simulate else 'closed form'})")
    bundled = {k: getattr(load_cluster("a100x8", overrides=pred.global_set).efficiency, k) for k in keys}
    print("  bundled factors: " + ", ".join(f"{k}={v:.4g}" for k, v in bundled.items()))
    out = {}
    t0 = time.perf_counter()
    everything = fit_factors({n: fit_subset([s.row for s in used[n]]) for n in names}, pred, keys)
    print("  fitted on all sources: " + ", ".join(f"{k}={v:.4g}" for k, v in everything.items())
          + f"  ({time.perf_counter() - t0:.0f} s)")
    in_sample = {n: stats([pred.score(s.row, everything) for s in used[n]]) for n in names}
    print("    with them (in-sample): " + ", ".join(f"{n} {st['mape']:.1f}% ({st['signed']:+.1f}%)"
                                                   for n, st in in_sample.items()))
    out["all"] = dict(factors=everything, in_sample=in_sample)
    for held, train_names in loso_splits(names):
        t0 = time.perf_counter()
        train = {n: fit_subset([s.row for s in used[n]]) for n in train_names}
        factors = fit_factors(train, pred, keys)
        held_scored = [pred.score(s.row, factors) for s in used[held]]
        st, before = stats(held_scored), stats(used[held])
        out[held] = dict(loso=st, bundled=before, factors=factors)
        print(f"  held out {held:<15} n {st['n']:>4}  LOSO MAPE {st['mape']:5.1f}% median {st['median']:5.1f}% "
              f"signed {st['signed']:+6.1f}%  | bundled MAPE {before['mape']:5.1f}% median {before['median']:5.1f}% "
              f"signed {before['signed']:+6.1f}%  | " + ", ".join(f"{k}={v:.3g}" for k, v in factors.items())
              + f"  ({time.perf_counter() - t0:.0f} s)")
    return out


# ----------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-contention", action="store_true")
    ap.add_argument("--fast", action="store_true", help="the closed-form cost model instead of the simulation")
    ap.add_argument("--rows", action="store_true", help="print every row (predicted, closed form, measured)")
    ap.add_argument("--quiet", action="store_true", help="only the summaries (the default; kept for old scripts)")
    ap.add_argument("--loso", action="store_true", help="add the leave-one-source-out table")
    ap.add_argument("--by", choices=GROUPINGS, default=None,
                    help="under each source, one line per model (builder, layers x hidden), hw profile or dtype")
    ap.add_argument("--fit-keys", default=",".join(DEFAULT_FIT_KEYS), metavar="K1,K2,K3",
                    help=f"global factors --loso fits, at most 3 of {', '.join(FIT_KEYS)}")
    ap.add_argument("--sources", default=None, metavar="A,B", help=f"a subset of {', '.join(SOURCES)}")
    ap.add_argument("--hw-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a global override applied to every row (e.g. efficiency.matmul_max=0.8)")
    add_validation_dir_option(ap)
    args = ap.parse_args(argv)
    keys = tuple(k for k in args.fit_keys.split(",") if k)
    if not keys or len(keys) > 3 or any(k not in FIT_KEYS for k in keys):
        usage_error(f"--fit-keys takes 1 to 3 of {', '.join(FIT_KEYS)}, got {args.fit_keys!r}")
    names = list(SOURCES) if not args.sources else args.sources.split(",")
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        usage_error(f"unknown source {unknown[0]!r}; choose from {', '.join(SOURCES)}")
    try:
        global_set = global_overrides(args.hw_set)
        folder = resolve_validation_dir(args.validation_dir)
        mapped = {n: SOURCES[n](folder) for n in names}
    except (HardwareProfileError, ValidationDirError) as err:
        usage_error(str(err))
    pred = Predictor(global_set, simulate=not args.fast, contention=not args.no_contention)
    t_all = time.perf_counter()
    mode = "closed form (--fast)" if args.fast else f"simulated, contention {'off' if args.no_contention else 'on'}"
    print(f"{mode}; global overrides: {global_set or 'none (profile defaults)'}")
    used, out = {}, {}
    lines = []
    for name in names:
        t0 = time.perf_counter()
        scored, skipped = score_source(name, mapped[name], pred, args.rows)
        used[name] = scored
        st = stats(scored)
        file = next((r.source for r in mapped[name]), name)
        target = TARGETS.get(file)
        extra = "" if target is None else f"  (target <= {target:.0f}%: {'met' if st['mape'] <= target else 'NOT met'})"
        if name == "sc21_table2":
            extra += "  " + " / ".join(
                f"{scheme} {stats([s for s in scored if s.row.run.startswith(scheme)])['mape']:.1f}%"
                for scheme in ("ptd-p", "zero-3"))
        if not args.fast and scored:
            diff = max(abs(s.predicted_s / s.closed_s - 1) for s in scored)
            extra += f"  sim vs closed <= {100 * diff:.2f}%"
        line = summary_line(name, st, len(skipped), top_reasons(skipped), extra + f"  {time.perf_counter() - t0:.0f} s")
        print(line, flush=True)
        if args.by:
            print("\n".join(group_lines(scored, args.by)), flush=True)
        lines.append(line)
        out[name] = dict(st, skipped=len(skipped), file=file)
    everything = [s for ss in used.values() for s in ss]
    st = stats(everything)
    print(summary_line("all rows", st, sum(v["skipped"] for v in out.values()), ""))
    if args.loso:
        if sum(bool(s) for s in used.values()) < 2:
            usage_error("--loso needs at least 2 sources with usable rows; drop --sources or name more")
        out["loso"] = run_loso(used, pred, keys)
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s")
    return out


if __name__ == "__main__":
    try:
        main()
    except CalibrationError as err:
        usage_error(str(err))
