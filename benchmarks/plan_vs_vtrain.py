"""Cost model vs published measurements (the validation folder, --validation-dir): ranking, top pick, MAPE.

    python benchmarks/plan_vs_vtrain.py            # the validation files
    python benchmarks/plan_vs_vtrain.py --fit      # refit the global Efficiency factors
    python benchmarks/plan_vs_vtrain.py --hw-set intra_node.bandwidth_gbps=200
                                                   # what one global change does to every figure
    python benchmarks/plan_vs_vtrain.py --extra ground_truth_multi.csv
                                                   # also held-out rows in vTrain's format

`--extra` takes any CSV in the validation folder's vTrain format or in the vTrain repository's
own (data/ground_truth_multi.csv holds 39.1B and 175B rows besides the folder's two models);
its rows are only reported, never fitted, so they stay a held-out check.

How each published row becomes a plan: benchmarks/published.py (vTrain: fp16, full
recompute, 1F1B, overlap_dp=0, 100 Gb/s per GPU; Megatron SC21: bf16, full recompute,
interleaved v=2 where it divides, the paper's FLOP count for the measured step time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from published import (  # noqa: E402
    PublishedFileError,
    global_overrides,
    mape,
    megatron_rows,
    megatron_table2_rows,
    nodes_for,
    plan_for,
    read_vtrain_csv,
    row_profile,
    usage_error,
    vtrain_rows,
)
from smplan.hwprofiles import HardwareProfileError, load_cluster  # noqa: E402
from smplan.planner import estimate  # noqa: E402
from sources import SOURCE_STACKS  # noqa: E402
from validation_data import ValidationDirError, add_validation_dir_option, resolve_validation_dir  # noqa: E402

from smplan.calibrate.fit import spearman  # noqa: E402

# Every file here (vTrain, SC21, vTrain's own --extra CSVs) ran Megatron-DeepSpeed or 2021
# Megatron-LM: their stack, as validate_published.py's SOURCE_STACKS gives it.
STACK = SOURCE_STACKS["vtrain_multi_node.csv"]


def predict(row: dict, overrides: dict | None = None) -> float:
    """The cost model's step time of a published row under its stack; `overrides` are dotted
    hardware keys (`efficiency.matmul_max`, `intra_node.bandwidth_gbps`) applied on top of the row's own."""
    over = dict(row["hw_set"])
    over.update(overrides or {})
    cluster = load_cluster("a100x8", nodes=nodes_for(row), overrides=over, stack=STACK)
    return estimate(plan_for(row, cluster.nodes), row_profile(row), cluster).step_time_s


def rank_by_model(name: str, rows: list[dict], overrides: dict | None, verbose: bool) -> tuple[dict, list[float]]:
    """Per model in `rows`: Spearman of predicted vs measured step time and how far the
    predicted-fastest config measures from the measured best."""
    out = {}
    preds = [predict(r, overrides) for r in rows]
    if verbose:
        print(f"{name}: per row (predicted vs measured, seconds)")
        for r, p in zip(rows, preds, strict=True):
            print(f"  {r['label']:>6} tp={r['tp']:<2} pp={r['pp']:<2} dp={r['dp']:<2} mbs={r['mbs']:<2} "
                  f"pred {p:7.3f}  meas {r['measured_s']:7.3f}  err {100 * (p / r['measured_s'] - 1):+6.1f}%")
    size = {r["label"]: r["hidden"] * r["layers"] for r in rows}  # order models smallest first
    for model in sorted(size, key=size.get):
        idx = [i for i, r in enumerate(rows) if r["label"] == model]
        meas = [rows[i]["measured_s"] for i in idx]
        pr = [preds[i] for i in idx]
        rho = spearman(pr, meas)
        pick = meas[min(range(len(idx)), key=lambda j: pr[j])]
        gap = 100 * (pick / min(meas) - 1)
        out[model] = (rho, gap)
        if verbose:
            print(f"  {model}: Spearman {rho:.3f} (target >= 0.8), top pick {gap:.1f}% from the measured best "
                  f"(target <= 5%), MAPE {mape([rows[i] for i in idx], pr):.1f}% over {len(idx)} rows")
    return out, preds


def report(folder: Path, overrides: dict | None = None, verbose: bool = True,
           extra: dict[str, list[dict]] | None = None) -> dict:
    multi = vtrain_rows(folder, "vtrain_multi_node.csv")
    ranks, preds = rank_by_model("vtrain_multi_node.csv", multi, overrides, verbose)
    out = {f"multi_{model}": v for model, v in ranks.items()}
    out["mape_multi"] = mape(multi, preds)
    for path, rows in (extra or {}).items():
        ranks, _ = rank_by_model(f"{path} (held out: not fitted)", rows, overrides, verbose)
        out.update({f"extra_{model}": v for model, v in ranks.items()})
    single = vtrain_rows(folder, "vtrain_single_node.csv")
    sp = [predict(r, overrides) for r in single]
    out["mape_single"] = mape(single, sp)
    meg = megatron_rows(folder)
    mp = [predict(r, overrides) for r in meg]
    out["mape_megatron"] = mape(meg, mp)
    zero3 = megatron_table2_rows(folder, "zero-3")
    out["mape_table2_zero3"] = mape(zero3, [predict(r, overrides) for r in zero3])
    if verbose:
        print(f"MAPE vtrain_multi_node.csv:   {out['mape_multi']:.1f}% (target <= 10%)")
        print(f"MAPE vtrain_single_node.csv:  {out['mape_single']:.1f}% over {len(single)} rows (target <= 10%)")
        print(f"MAPE megatron_sc21_table1.csv: {out['mape_megatron']:.1f}% (target <= 5%)")
        print(f"MAPE megatron_sc21_table2.csv, ZeRO-3 rows: {out['mape_table2_zero3']:.1f}%")
        for r, p in zip(meg, mp, strict=True):
            print(f"  {r['label']:>7} tp={r['tp']} pp={r['pp']} {r['schedule']:<11} pred {p:7.3f} s  "
                  f"meas {r['measured_s']:7.3f} s  err {100 * (p / r['measured_s'] - 1):+6.1f}%")
    return out


def fit(folder: Path, start: dict | None = None) -> dict:
    """Coordinate search of the global factors on the mean of the four MAPEs (no per-row terms),
    starting from the current defaults (smplan.hwprofiles.cluster.Efficiency) with `start`'s
    `efficiency.*` values; its other keys stay fixed. Returns the overrides to report with."""
    import dataclasses
    import random

    from smplan.hwprofiles import Efficiency

    random.seed(0)
    multi = vtrain_rows(folder, "vtrain_multi_node.csv")
    single = random.sample(vtrain_rows(folder, "vtrain_single_node.csv"), 240)
    sets = [multi, single, megatron_rows(folder), megatron_table2_rows(folder, "zero-3")]

    start = dict(start or {})

    def dotted(e: dict) -> dict:
        return {**start, **{f"efficiency.{k}": v for k, v in e.items()}}

    def loss(e):
        return sum(mape(rows, [predict(r, dotted(e)) for r in rows]) for rows in sets) / len(sets)

    bounds = dict(matmul_max=(0.4, 1.0), matmul_half_dim=(0.0, 400.0), memory_bound=(0.2, 1.0), network=(0.2, 1.0),
                  host_overhead_us_per_layer=(0.0, 5000.0), single_nic_network=(0.05, 1.0),
                  elementwise_fusion=(0.0, 1.0))
    steps = dict(matmul_max=0.1, matmul_half_dim=64.0, memory_bound=0.2, network=0.2, host_overhead_us_per_layer=800.0,
                 single_nic_network=0.2, elementwise_fusion=0.25)
    defaults = dataclasses.asdict(Efficiency())
    e = {k: start.get(f"efficiency.{k}", defaults[k]) for k in bounds}
    best = loss(e)
    for _ in range(6):
        for k in e:
            for sign in (1, -1):
                while True:
                    trial = dict(e, **{k: min(max(e[k] + sign * steps[k], bounds[k][0]), bounds[k][1])})
                    val = loss(trial)
                    if val < best - 1e-6:
                        e, best = trial, val
                    else:
                        break
            steps[k] /= 2
        print(f"  loss {best:.2f}%  {e}", flush=True)
    return dotted(e)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fit", action="store_true", help="refit the global efficiency factors first")
    ap.add_argument("--extra", action="append", default=[], metavar="CSV",
                    help="also rank the rows of this vTrain-format CSV (held out: never fitted); repeatable")
    ap.add_argument("--hw-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a global override for every row, e.g. efficiency.matmul_max=0.8 or "
                         "intra_node.bandwidth_gbps=200; with --fit, efficiency.* values are the start")
    add_validation_dir_option(ap)
    args = ap.parse_args()
    try:
        global_set = global_overrides(args.hw_set)
    except HardwareProfileError as err:
        usage_error(str(err))
    extra = {}
    for path in args.extra:  # read every --extra file before any work, so a bad one costs nothing
        if not Path(path).is_file():
            usage_error(f"--extra {path}: no such file; give the path of a vTrain-format CSV")
        try:
            extra[path] = read_vtrain_csv(Path(path))
        except PublishedFileError as err:
            usage_error(f"--extra {err}")
    try:
        folder = resolve_validation_dir(args.validation_dir)
    except ValidationDirError as err:
        usage_error(str(err))
    report(folder, fit(folder, global_set) if args.fit else global_set, extra=extra)
