"""Simulate every row of the validation folder (--validation-dir) and print per-row error and MAPE per file.

One set of global factors for all rows (the hardware profile's `efficiency.*`, which
`--hw-set efficiency.KEY=VALUE` may change for every row at once); no per-row fitting.
How each published row becomes a plan (framework settings, the vocab-parallel head):
benchmarks/published.py. megatron_sc21_table2.csv (PTD-P vs ZeRO-3 at the same batch) is
simulated and reported too; the issue's targets cover the other three files.
Each row runs the step simulation with contention on; the closed form of the same costs is
printed next to it (the simulator should add no error of its own).

    python benchmarks/validate_published.py [--no-contention] [--hw-set efficiency.matmul_max=0.8] [--quiet]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from published import (  # noqa: E402
    global_overrides,
    megatron_rows,
    megatron_table2_rows,
    nodes_for,
    plan_for,
    row_profile,
    usage_error,
    vtrain_rows,
)
from smplan.hwprofiles import HardwareProfileError, load_cluster  # noqa: E402
from smplan.simulator import simulate_plan  # noqa: E402
from validation_data import ValidationDirError, add_validation_dir_option, resolve_validation_dir  # noqa: E402

TARGETS = {"vtrain_multi_node.csv": 10.0, "vtrain_single_node.csv": 10.0, "megatron_sc21_table1.csv": 5.0}


def simulate_row(row: dict, global_set: dict, contention: bool) -> tuple[float, float]:
    """(simulated step seconds, closed-form step seconds) of one published row."""
    overrides = dict(row["hw_set"])
    overrides.update(global_set)
    cluster = load_cluster("a100x8", nodes=nodes_for(row), overrides=overrides)
    result = simulate_plan(plan_for(row, cluster.nodes), row_profile(row), cluster, contention, record_events=False)
    return result.step_time_s, result.closed_form_step_time_s or float("nan")


def run_file(name: str, rows: list[dict], global_set: dict, contention: bool, quiet: bool) -> dict:
    errors, sim_vs_closed = [], []
    t0 = time.perf_counter()
    if not quiet:
        print(f"\n{name}: {len(rows)} rows (predicted vs measured step, seconds)")
    for row in rows:
        sim, closed = simulate_row(row, global_set, contention)
        err = sim / row["measured_s"] - 1
        errors.append(err)
        sim_vs_closed.append(sim / closed - 1)
        if not quiet:
            print(f"  {row['label']:>13} tp={row['tp']:<2} pp={row['pp']:<2} dp={row['dp']:<3} mbs={row['mbs']:<2} "
                  f"gbs={row['gbs']:<5} {row['schedule']:<11} sim {sim:8.3f}  closed {closed:8.3f}  "
                  f"meas {row['measured_s']:8.3f}  err {100 * err:+6.1f}%")
    mape = 100 * sum(abs(e) for e in errors) / len(errors)
    worst = 100 * max(abs(e) for e in sim_vs_closed)
    target = TARGETS.get(name)
    verdict = "" if target is None else f" (target <= {target:.0f}%: {'met' if mape <= target else 'NOT met'})"
    print(f"{name}: MAPE {mape:.1f}%{verdict}; simulation vs closed form: mean "
          f"{100 * sum(sim_vs_closed) / len(rows):+.2f}%, largest |diff| {worst:.2f}%; "
          f"{time.perf_counter() - t0:.1f} s")
    return {"mape": mape, "sim_vs_closed_max_pct": worst}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-contention", action="store_true")
    ap.add_argument("--hw-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a global override applied to every row (e.g. efficiency.matmul_max=0.8)")
    ap.add_argument("--quiet", action="store_true", help="only the per-file summaries")
    add_validation_dir_option(ap)
    args = ap.parse_args(argv)
    try:
        global_set = global_overrides(args.hw_set)
        folder = resolve_validation_dir(args.validation_dir)
    except (HardwareProfileError, ValidationDirError) as err:
        usage_error(str(err))
    contention = not args.no_contention
    print(f"contention {'on' if contention else 'off'}; global overrides: {global_set or 'none (profile defaults)'}")
    out = {}
    for name in ("vtrain_multi_node.csv", "vtrain_single_node.csv"):
        out[name] = run_file(name, vtrain_rows(folder, name), global_set, contention, args.quiet)
    out["megatron_sc21_table1.csv"] = run_file("megatron_sc21_table1.csv", megatron_rows(folder), global_set, contention,
                                               args.quiet)
    for scheme in ("ptd-p", "zero-3"):
        name = f"megatron_sc21_table2.csv ({scheme})"
        out[name] = run_file(name, megatron_table2_rows(folder, scheme), global_set, contention, args.quiet)
    return out


if __name__ == "__main__":
    main()
