"""`calibrate`: execute K plans, predict the same plans, fit the profile's global factors.

    from smplan.calibrate import CalibrateOptions, calibrate
    report = calibrate("examples/gpt.py", {"hidden": 256}, "myhw.toml", CalibrateOptions(plans=3))
    print(report.median_ape_before, report.median_ape_after)

The fit itself (smplan.calibrate.fit) sees only a predictor and measured times; this
module is the part that knows about plans, the planner and the executor.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from smplan.calibrate.fit import (
    FIT_KEYS,
    FRACTIONS,
    CalibrationError,
    FitResult,
    ape,
    fit_efficiency,
    median,
    spearman,
)
from smplan.hwprofiles import (
    PROBED_CPU_NAME,
    STACK_KEYS,
    Cluster,
    load_cluster,
    load_stack,
    parse_override,
)
from smplan.hwprofiles.profile_file import (
    check_writable,
    profile_path,
    with_efficiency,
    with_values,
    write_profile,
)
from smplan.planner import estimate, load_model_file, profile_model
from smplan.planner.plan import Plan, PlanError

from . import plans as plan_choice
from .measure import Measured, device_dtype, run_plan

# Median |error| on the fitted plans above which the calibrated profile gets a warning (chosen:
# above the validated sources' MAPE, 3-18% in README's table, below what a wrong profile gives).
POOR_FIT_APE = 0.15
# The profile figure each fraction scales (hwprofiles.perf): a fraction fitted to its cap of 1 with
# the plans still predicted too slow means the runs went faster than that figure allows.
PEAK_FIGURES = {"matmul_max": "gpu.peak_tflops.<dtype> (GEMM FLOP/s)", "memory_bound": "gpu.memory_bandwidth_gbps",
                "network": "intra_node.bandwidth_gbps"}


@dataclass
class CalibrateOptions:
    plans: int = 3
    steps: int = 5
    nproc: int = 2
    global_batch: int = 8
    output: str | None = None
    force: bool = False
    check: bool = False
    keys: tuple[str, ...] = FIT_KEYS
    runs_dir: str | None = None
    hw_set: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()  # explicit plans ("dp=2,mbs=4") instead of the automatic pick
    rounds: int = 1  # run the whole list this many times, keep each plan's fastest (noisy machines)
    stack: str | None = None  # --stack: the software stack the runs are predicted under (None: the default)
    stack_output: str | None = None  # --stack-output: write the fitted stack keys as a stack TOML here


@dataclass
class Row:
    label: str
    measured_s: float
    predicted_s: float  # planner closed form
    simulated_s: float  # simpy step simulation, same costs

    @property
    def ratio(self) -> float:
        """predicted / measured."""
        return self.predicted_s / self.measured_s

    @property
    def ape(self) -> float:
        return ape(self.predicted_s, self.measured_s)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "ratio_predicted_over_measured": self.ratio, "ape": self.ape}


@dataclass
class CalibrationReport:
    hw: str
    before: list[Row]
    after: list[Row] = field(default_factory=list)
    failed: list[Measured] = field(default_factory=list)
    fit: FitResult | None = None
    efficiency_before: dict = field(default_factory=dict)
    output: str | None = None
    stack_output: str | None = None
    kept_input: str | None = None  # one line when the fit was not kept (see `fit_is_worse`)
    coverage: str | None = None  # one line when the fitted plans share one layout (see `coverage_note`)

    @property
    def median_ape_before(self) -> float:
        return median([r.ape for r in self.before])

    @property
    def median_ape_after(self) -> float | None:
        return median([r.ape for r in self.after]) if self.after else None

    @property
    def warning(self) -> str | None:
        """A fit that still misses the plans it was fitted to: the profile is not to be trusted."""
        if not self.after or self.kept_input or self.median_ape_after <= POOR_FIT_APE:
            return None
        worst = max(self.after, key=lambda r: r.ape)
        missed = (f"the calibrated profile still misses its own plans by {self.median_ape_after:.0%} (median; "
                  f"{worst.label} is predicted at {worst.ratio:.2f}x its measured time)")
        capped = capped_fractions(self.fit) if self.fit else []
        if capped and worst.ratio > 1 and median([r.ratio for r in self.after]) > 1:  # too slow, and no faster allowed
            return (f"{missed}, too slow, with {', '.join(capped)} at the upper bound 1: the runs went faster than "
                    f"the profile's {', '.join(PEAK_FIGURES[k] for k in capped)} allow, so those figures are too "
                    "low; re-probe this machine (smplan hw probe -o FILE) or raise them (--hw-set)")
        return (f"{missed}: these runs show a cost "
                "the model does not price. Use more plans (--plans), a model whose step is tens of "
                "milliseconds or more (tiny models are dominated by per-op Python overhead), or check "
                "that nothing else loaded the machine.")

    def to_dict(self) -> dict:
        rows = self.after or self.before
        return {
            "hw": self.hw,
            "output": self.output,
            "stack_output": self.stack_output,
            "plans": [r.to_dict() for r in self.before],
            "calibrated": [r.to_dict() for r in self.after],
            "failed": [{"plan": m.label, "error": m.error, "run_dir": m.run_dir} for m in self.failed],
            "median_ape_before": self.median_ape_before,
            "median_ape_after": self.median_ape_after,
            "warning": self.warning,
            "fit_kept": None if self.fit is None else self.kept_input is None,
            "kept_input": self.kept_input,
            "coverage_note": self.coverage,
            "spearman": spearman([r.predicted_s for r in rows], [r.measured_s for r in rows]),
            "efficiency_before": self.efficiency_before,
            "efficiency_after": dataclasses.asdict(self.fit.efficiency) if self.fit else None,
            "factors": factor_states(self.fit, self.efficiency_before) if self.fit else None,
            "undetermined_note": undetermined_note(self.fit) if self.fit else None,
            # what the fit minimises: sum of squared log(predicted / measured), plus its prior
            "fit_loss_before": self.fit.loss_before if self.fit else None,
            "fit_loss_after": self.fit.loss_after if self.fit else None,
        }


def capped_fractions(fit: FitResult) -> list[str]:
    """The fractions the runs determined that the fit left at their upper bound 1 (fit._clip)."""
    return [k for k in fit.determined if k in FRACTIONS and getattr(fit.efficiency, k) >= 1.0]


def factor_state(value: float, determined: bool) -> str:
    """How a fitted key came by its value, as the report, the JSON and the written files say it."""
    return "fitted" if determined else f"not determined by these plans (kept {value:.4g})"


def factor_states(fit: FitResult, before: dict) -> dict:
    """key -> before, after and how (`factor_state`), for every key the fit was given."""
    return {k: {"before": before[k], "after": getattr(fit.efficiency, k), "determined": k not in fit.undetermined,
                "state": factor_state(getattr(fit.efficiency, k), k not in fit.undetermined)} for k in fit.keys}


def undetermined_note(fit: FitResult) -> str | None:
    """One line when some keys were not determined: why, and which plans would determine them."""
    if not fit.undetermined:
        return None
    them, values = ("it", "value") if len(fit.undetermined) == 1 else ("them", "values")
    host = ("; the host time overlaps GPU work, so only plans with less GPU work per layer pass show it "
            "(a smaller micro-batch: --plan ...,mbs=1)" if "host_overhead_us_per_layer" in fit.undetermined else "")
    return (f"not determined by these plans: {', '.join(fit.undetermined)} (no plan's predicted step changes "
            f"with {them}, so the fit kept the input's {values}){host}")


def fit_is_worse(report: CalibrationReport) -> bool:
    """Whether the fitted factors miss the plans they were fitted to by more (median |error|, what
    the report prints) than the input's own factors: the log-space least squares can trade the
    typical plan for the worst one (one plan 20x off), and such a fit is no calibration."""
    return bool(report.after) and report.median_ape_after > report.median_ape_before


def coverage_note(plans: Sequence[Plan], nproc: int, profile) -> str | None:
    """When every plan the fit saw runs one layout (dp, tp, pp), what it did not measure: the other
    layouts of `nproc` processes this model allows (plans.meshes), and ZeRO/FSDP, which calibration
    never runs (plans.to_plan: ZeRO-0). The global factors then fit that layout's costs alone, and
    a small error on it says nothing of the predictions of the rest."""
    layouts = {(p.dp, p.tp, p.pp) for p in plans}
    if len(layouts) != 1:
        return None
    (dp, tp, pp), = layouts
    others = [f"dp={d},tp={t},pp={q}" for d, t, q in plan_choice.meshes(nproc, profile) if (d, t, q) not in layouts]
    missed = (f"{', '.join(others)} (add them with --plan, or use more --plans) nor " if others else "")
    return (f"every plan fitted runs dp={dp},tp={tp},pp={pp}, so the fit is checked on that layout alone: it measured "
            f"no {missed}ZeRO/FSDP (calibration runs ZeRO-0), whose predictions it leaves unchecked")


def kept_input_line(report: CalibrationReport, opts: CalibrateOptions) -> str:
    """What `calibrate` says when it keeps the input's factors (and writes nothing)."""
    files = " and ".join(f for f in (opts.output, opts.stack_output) if f)
    return (f"kept {report.hw}'s own factors: the fitted ones miss these plans by {report.median_ape_after:.1%} "
            f"(median) against {report.median_ape_before:.1%} with {report.hw}'s, "
            + (f"so nothing was written to {files}" if files else "so there is nothing to write")
            + "; " + _disagreement(report.before))


def _disagreement(before: Sequence[Row]) -> str:
    """Why the plans cannot share one set of factors: the plan furthest (in log ratio) from the
    others' median measured/predicted, named when it is over twice as far off as the worst of them
    and at least 2x; else noise, which repeated rounds average out."""
    if len(before) >= 3:
        worst = max(before, key=lambda r: abs(math.log(r.ratio) - statistics.median(math.log(o.ratio) for o in before)))
        others = [r for r in before if r is not worst]
        centre = statistics.median(math.log(r.ratio) for r in others)
        spread = max(abs(math.log(r.ratio) - centre) for r in others)
        if abs(math.log(worst.ratio) - centre) > max(2 * spread, math.log(2)):
            rest = ", ".join(f"{1 / r.ratio:.2f}x" for r in others)
            return (f"{worst.label} ran {1 / worst.ratio:.2f}x its prediction against {rest} for the others: the cost "
                    f"model lacks what sets its speed here; rerun without it (--plan for each of the others)")
    return "the plans disagree on this machine's speed: rerun with --rounds 3 on an idle machine, or with more --plans"


def local_cluster(hw: str, nproc: int, hw_set: Sequence[str] = (), stack: str | None = None) -> Cluster:
    """The profile as one node of `nproc` local processes (all runs here are on one machine)."""
    cluster = load_cluster(hw, overrides=list(hw_set), stack=stack)
    return cluster.with_overrides({"nodes": 1, "gpus_per_node": nproc})


def predict(plans: Sequence[Plan], profile, cluster: Cluster) -> list[float]:
    """Closed-form step time of each plan (what the fit matches)."""
    return [estimate(p, profile, cluster).step_time_s for p in plans]


def simulate(plans: Sequence[Plan], profile, cluster: Cluster) -> list[float]:
    from smplan.simulator.api import simulate_plan

    return [simulate_plan(p, profile, cluster, record_events=False).step_time_s for p in plans]


def rows(labels: Sequence[str], plans: Sequence[Plan], measured: Sequence[float], profile, cluster: Cluster) -> list[Row]:
    pred, sim = predict(plans, profile, cluster), simulate(plans, profile, cluster)
    return [Row(*values) for values in zip(labels, measured, pred, sim, strict=True)]


def _run_folders(root: Path) -> list[Path]:
    """The entries of a --runs-dir named as measure_all names its runs (plan3, plan3-round2)."""
    return sorted(p for p in root.glob("plan*") if re.fullmatch(r"plan\d+(-round\d+)?", p.name))


def _holds_runs(root: Path) -> bool:
    """Whether a --runs-dir already holds measured runs (measure_all's plan* folders)."""
    from smplan.executor.metrics import read_metrics

    return any(read_metrics(d) for d in _run_folders(root) if d.is_dir())


def _occupied(root: Path) -> list[str]:
    """The run folders' names in a --runs-dir that hold anything (or are files): a run there would
    write beside what is in them, or be refused by execute after its log was started."""
    return [p.name for p in _run_folders(root) if not p.is_dir() or any(p.iterdir())]


def check_options(opts: CalibrateOptions) -> None:
    """Every user mistake that can be caught before minutes of runs are spent."""
    if opts.plans < 1 and not opts.choices:
        raise PlanError(f"--plans must be at least 1, got {opts.plans}")
    if opts.steps < 2:
        raise PlanError(f"--steps must be at least 2 (the first step is warm-up and not timed), got {opts.steps}")
    if opts.nproc < 1:
        raise PlanError(f"--nproc-per-node must be at least 1, got {opts.nproc}")
    if opts.rounds < 1:
        raise PlanError(f"--rounds must be at least 1, got {opts.rounds}")
    if opts.runs_dir and _holds_runs(Path(opts.runs_dir)):  # each run would refuse its folder, as execute's -o
        raise PlanError(f"--runs-dir {opts.runs_dir} already holds the runs of a calibration; give another "
                        "--runs-dir, or delete it to measure again")
    busy = _occupied(Path(opts.runs_dir)) if opts.runs_dir else []
    if busy:
        raise PlanError(f"--runs-dir {opts.runs_dir} already holds {', '.join(busy[:3])}, where calibrate's runs go "
                        "(plan1, plan2, ...); give a new or empty folder")
    from smplan.executor.metrics import present_run_entries

    theirs = present_run_entries(opts.runs_dir) if opts.runs_dir else []
    if theirs:  # its plan* folders would sit among a run's files
        raise PlanError(f"--runs-dir {opts.runs_dir} is the run directory of `smplan execute` (it holds "
                        f"{', '.join(theirs)}); give a new or empty folder")
    if opts.output and not opts.check:
        check_writable(opts.output, opts.force)
    if opts.stack_output and not opts.check:
        if not set(STACK_KEYS) & set(opts.keys):
            raise CalibrationError(f"--stack-output writes the fitted stack keys, but none of {', '.join(STACK_KEYS)} "
                                   "is fitted; fit host_overhead_us_per_layer or drop --stack-output")
        check_writable(opts.stack_output, opts.force, "--stack-output")
        load_stack(opts.stack)  # its values the file starts from


def build_plans(model: str, model_args: dict, hw: str, opts: CalibrateOptions, profile) -> list[tuple[str, Plan]]:
    device, dtype = device_dtype()
    if opts.choices:
        picked = [plan_choice.parse_choice(c) for c in opts.choices]
    else:
        picked = plan_choice.choose(opts.nproc, profile, opts.plans, opts.global_batch,
                                    tensor_parallel=device != "cpu")
    out = []
    for c in picked:
        if c.dp * c.tp * c.pp != opts.nproc:
            raise PlanError(f"--plan {c.label} needs dp*tp*pp={c.dp * c.tp * c.pp} processes but --nproc-per-node is "
                            f"{opts.nproc}; change the plan or --nproc-per-node")
        problem = plan_choice.batch_problem(c, opts.global_batch)  # before to_plan, whose line names gbs
        if problem:
            raise PlanError(problem)
        plan = plan_choice.to_plan(c, profile, model=model, model_args=model_args, hw=hw,
                                   global_batch=opts.global_batch, gpus_per_node=opts.nproc, dtype=dtype)
        out.append((c.label, plan))
    return out


def check_plans(labelled: Sequence[tuple[str, Plan]], model_file, profile, cluster: Cluster, nproc: int) -> None:
    """Reject, before any run, a plan that the cost model or the executor would refuse:
    otherwise it fails only when its turn comes, after the earlier plans ran for minutes."""
    from smplan.executor import PlanMismatchError, check_this_machine, validate_plan

    device, _ = device_dtype()
    if (device == "cpu") != (cluster.gpu.name == PROBED_CPU_NAME):  # `hw probe` names a CPU's gpu so
        here = "no GPU" if device == "cpu" else "a GPU"
        raise PlanError(f"calibrate fits {cluster.name}'s factors to runs on this machine, which has {here}, but "
                        f"{cluster.name} describes {cluster.gpu.name}: probe this machine (smplan hw probe -o "
                        "local.toml) and calibrate that, or calibrate where its GPUs are; nothing was run")
    for label, plan in labelled:
        try:
            estimate(plan, profile, cluster)
            checked = validate_plan(plan, model_file, world_size=nproc)
            check_this_machine(nproc, 1, checked.param_bytes, plan)  # calibrate runs every plan on this machine
        except (PlanError, PlanMismatchError) as err:
            raise PlanError(f"plan {label}: {err}; nothing was run") from None


def overridden_profile(source: Path, hw_set: Sequence[str]) -> str:
    """The source profile's TOML with the `--hw-set` values the fit saw written into it
    (`[efficiency]` is replaced by the fit's result anyway)."""
    values = dict(parse_override(item) for item in hw_set)
    values = {k: v for k, v in values.items() if not k.startswith("efficiency.")}
    return with_values(source.read_text(), values) if values else source.read_text()


def measure_all(labelled: Sequence[tuple[str, Plan]], model: str, opts: CalibrateOptions,
                progress: Callable[[str], None], model_file=None) -> list[Measured]:
    """Each plan's measurement; with `opts.rounds` > 1 the list runs again and the fastest
    round counts. Rounds, not consecutive repeats, so that a burst of load from another
    job hits one round of a plan rather than all of them."""
    model_file = model_file or load_model_file(model)
    root = Path(opts.runs_dir or f"runs/calibrate-{time.strftime('%Y%m%d-%H%M%S')}")
    best: list[Measured | None] = [None] * len(labelled)
    for r in range(max(1, opts.rounds)):
        for i, (label, plan) in enumerate(labelled):
            start = time.perf_counter()
            name = f"plan{i + 1}" + (f"-round{r + 1}" if opts.rounds > 1 else "")
            m = run_plan(plan, label, model_file, opts.steps, opts.nproc, root / name)
            took = time.perf_counter() - start
            what = f"{m.step_time_s * 1e3:.1f} ms/step" if m.step_time_s else f"FAILED ({m.error})"
            round_note = f" round {r + 1}/{opts.rounds}" if opts.rounds > 1 else ""
            progress(f"[{i + 1}/{len(labelled)}]{round_note} {label}: {what}  ({took:.0f} s)")
            prev = best[i]
            if prev is None or (m.step_time_s and (not prev.step_time_s or m.step_time_s < prev.step_time_s)):
                best[i] = m
    return [m for m in best if m is not None]


def calibrate(model: str, model_args: dict, hw: str, opts: CalibrateOptions,
              progress: Callable[[str], None] = lambda line: None) -> CalibrationReport:
    """Execute the plans, compare with the predictions, fit (unless `opts.check`), write `opts.output`."""
    check_options(opts)
    cluster = local_cluster(hw, opts.nproc, opts.hw_set, opts.stack)
    source = profile_path(hw)
    device, dtype = device_dtype()
    profile = profile_model(model, model_args, dtype=dtype)
    labelled = build_plans(model, model_args, hw, opts, profile)
    model_file = load_model_file(model)
    check_plans(labelled, model_file, profile, cluster, opts.nproc)
    text = overridden_profile(source, opts.hw_set) if opts.output and not opts.check else ""
    if not opts.check and not opts.output and not opts.stack_output:  # said before minutes of runs, not after
        progress("note: no -o given: the fit will be reported but nothing written; add -o FILE to keep the calibrated "
                 "profile (or --check to skip the fit)")
    if not opts.choices and device == "cpu" \
            and any(c.tp > 1 for c in plan_choice.choose(opts.nproc, profile, opts.plans, opts.global_batch)):
        progress(f"note: {plan_choice.CPU_TP_NOTE}")  # the pick a GPU would run
    measured = measure_all(labelled, model, opts, progress, model_file)
    ok = [m for m in measured if m.step_time_s]
    report = CalibrationReport(hw=hw, before=[], failed=[m for m in measured if not m.step_time_s],
                               efficiency_before=dataclasses.asdict(cluster.efficiency))
    if not ok:
        raise CalibrationError(f"every run failed; see the logs, e.g. {measured[0].run_dir}/workers.log")
    labels, plans, times = [m.label for m in ok], [m.plan for m in ok], [m.step_time_s for m in ok]
    report.before = rows(labels, plans, times, profile, cluster)
    if opts.check:
        return report
    report.fit = fit_efficiency(cluster, lambda c: predict(plans, profile, c), times, keys=opts.keys)
    fitted = dataclasses.replace(cluster, efficiency=report.fit.efficiency)
    report.after = rows(labels, plans, times, profile, fitted)
    report.coverage = coverage_note(plans, opts.nproc, profile)
    if fit_is_worse(report):
        report.kept_input = kept_input_line(report, opts)
        return report
    if opts.output:
        notes = [
            f"Calibrated by `smplan calibrate {model}` on {time.strftime('%Y-%m-%d')}: {len(ok)} plans x "
            f"{opts.steps} steps on {opts.nproc} processes;",
            f"fitted {', '.join(report.fit.determined) or 'nothing'} (log-space least squares, smplan/calibrate/fit.py);",
            *([f"{undetermined_note(report.fit)};"] if report.fit.undetermined else []),
            f"median |error| of step time {report.median_ape_before:.1%} before, {report.median_ape_after:.1%} after.",
        ]
        if opts.hw_set:
            notes.append(f"with --hw-set {' '.join(opts.hw_set)} (lines marked 'set by --hw-set').")
        write_profile(with_efficiency(text, report.fit.efficiency, notes), opts.output, opts.force)
        report.output = opts.output
    if opts.stack_output:
        write_calibrated_stack(model, opts, report, len(ok))
    return report


def write_calibrated_stack(model: str, opts: CalibrateOptions, report: CalibrationReport, num_plans: int) -> None:
    """The stack `opts.stack` with the fitted stack keys, as a TOML that --stack PATH loads."""
    from smplan.hwprofiles.stack import stack_toml, write_stack

    base = load_stack(opts.stack)
    fitted = [k for k in STACK_KEYS if k in opts.keys]
    # Every stack key as the fit ran with it: a probed profile's own values (fusion and overlaps
    # off) hold under the default stack, and the fitted host time is only right next to them.
    values = {k: getattr(report.fit.efficiency, k) for k in STACK_KEYS}
    overridden = {parse_override(item)[0].removeprefix("efficiency.") for item in opts.hw_set}
    kept = [k for k in STACK_KEYS if k not in fitted and k not in overridden and values[k] != getattr(base, k)]
    name = Path(opts.stack_output).stem
    stack = dataclasses.replace(base, name=name, description=f"{base.name} calibrated on this machine", **values)
    when = time.strftime("%Y-%m-%d")
    notes = [f"Calibrated by `smplan calibrate {model}` on {when}: {num_plans} plans x {opts.steps} steps on "
             f"{opts.nproc} processes, from {base.source};",
             f"median |error| of step time {report.median_ape_before:.1%} before, {report.median_ape_after:.1%} after."]
    comments = {k: (f"fitted by smplan calibrate, {when}" if k in fitted and k not in report.fit.undetermined
                    else f"smplan calibrate, {when}: {factor_state(values[k], False)}" if k in fitted
                    else "as the fit ran: set by --hw-set" if k in overridden
                    else "as the fit ran: the hardware profile's own value" if k in kept else f"from {base.source}")
                for k in (*STACK_KEYS, "overlap_grad_reduce")}
    write_stack(stack_toml(stack, notes, comments), opts.stack_output, opts.force)
    report.stack_output = opts.stack_output
