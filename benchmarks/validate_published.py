"""Simulate every row of ../shared/validation/*.csv and print per-row error and MAPE per file.

One set of global factors for all rows (the hardware profile's `efficiency.*`, which
`--hw-set efficiency.KEY=VALUE` may change for every row at once); no per-row fitting.
Settings per the folder's README:
- vTrain (Megatron-DeepSpeed, A100 SXM 80 GB, 100 Gb/s per GPU across nodes:
  inter_node.bandwidth_gbps=12.5): fp16, full recompute, 1F1B, overlap_dp=0, zero=0, vocab 50257.
- Megatron-LM SC21 Table 1 (Selene, 200 Gb/s per GPU: the a100x8 profile as is): bf16,
  full recompute, mbs=1, interleaved schedule with v=2 where pp > 1 and the layers and
  micro-batches divide (the paper's schedule for its large runs), 1F1B otherwise; measured
  step time = F / (TFLOP/s x GPUs), F = 96 B s l h^2 (1 + s/6h + V/16lh).
- megatron_sc21_table2.csv compares schemes at a model size, without the per-row
  parallel layout, so it is not simulated here.
Each row runs the step simulation with contention on; the closed form of the same costs is
printed next to it (the simulator should add no error of its own).

    python benchmarks/validate_published.py [--no-contention] [--hw-set efficiency.matmul_max=0.8] [--quiet]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hwprofiles import load_cluster, parse_override  # noqa: E402
from hwprofiles.topology import ParallelLayout  # noqa: E402
from planner import Plan, even_stages, profile_model  # noqa: E402
from planner.cost_model import plan_costs  # noqa: E402
from simulator import simulate_step  # noqa: E402

VALIDATION = ROOT.parent / "shared" / "validation"
if not VALIDATION.exists():
    VALIDATION = Path("/work/shared/validation")
VTRAIN_HW = {"inter_node.bandwidth_gbps": 12.5}  # 800 Gb/s per 8-GPU node = 100 Gb/s per GPU
TARGETS = {"vtrain_multi_node.csv": 10.0, "vtrain_single_node.csv": 10.0, "megatron_sc21_table1.csv": 5.0}
GPT = str(ROOT / "examples" / "gpt.py")
_PROFILES: dict[tuple, object] = {}


def profile_for(row: dict):
    """Each distinct model shape is profiled once per process (and cached on disk by the profiler)."""
    key = (row["hidden"], row["heads"], row["layers"], row["seq"], row["vocab"], row["dtype"])
    if key not in _PROFILES:
        args = dict(layers=row["layers"], hidden=row["hidden"], heads=row["heads"], seq_len=row["seq"],
                    vocab=row["vocab"])
        _PROFILES[key] = profile_model(GPT, args, dtype=row["dtype"])
    return _PROFILES[key]


def vtrain_rows(name: str) -> list[dict]:
    rows = []
    with open(VALIDATION / name) as fh:
        for r in csv.DictReader(fh):
            r = {k: float(v) for k, v in r.items()}
            rows.append(dict(
                label=f"{r['params_b']}B" if "params_b" in r else f"h{int(r['hidden'])} l{int(r['layers'])}",
                hidden=int(r["hidden"]), heads=int(r["heads"]), layers=int(r["layers"]), seq=int(r["seq_len"]),
                vocab=50257, tp=int(r["tp"]), pp=int(r["pp"]), dp=int(r["dp"]), mbs=int(r["micro_batch"]),
                gbs=int(r["global_batch"]), gpus=int(r["gpus"]), measured_s=r["iteration_ms"] / 1e3,
                schedule="1f1b", v=1, overlap_dp=False, dtype="fp16", hw_set=VTRAIN_HW,
            ))
    return rows


def megatron_rows() -> list[dict]:
    rows = []
    with open(VALIDATION / "megatron_sc21_table1.csv") as fh:
        for r in csv.DictReader(fh):
            B, s, layers, h, V = (int(r[k]) for k in ("global_batch", "seq_len", "layers", "hidden", "vocab"))
            gpus, tp, pp = int(r["gpus"]), int(r["tp"]), int(r["pp"])
            dp = gpus // (tp * pp)
            flops = 96 * B * s * layers * h * h * (1 + s / (6 * h) + V / (16 * layers * h))  # the paper's count
            v = 2 if pp > 1 and layers % (pp * 2) == 0 and (B // dp) % pp == 0 else 1
            rows.append(dict(
                label=f"{r['params_b']}B", hidden=h, heads=int(r["heads"]), layers=layers, seq=s, vocab=V, tp=tp, pp=pp,
                dp=dp, mbs=1, gbs=B, gpus=gpus, measured_s=flops / (float(r["tflops_per_gpu"]) * 1e12 * gpus),
                schedule="interleaved" if v > 1 else "1f1b", v=v, overlap_dp=True, dtype="bf16", hw_set={},
            ))
    return rows


def simulate_row(row: dict, global_set: dict, contention: bool) -> tuple[float, float]:
    """(simulated step seconds, closed-form step seconds) of one published row."""
    profile = profile_for(row)
    overrides = dict(row["hw_set"])
    overrides.update(global_set)
    cluster = load_cluster("a100x8", nodes=max(1, -(-row["gpus"] // 8)), overrides=overrides)
    plan = Plan(model=GPT, hw="a100x8", nodes=cluster.nodes, dp=row["dp"], tp=row["tp"], pp=row["pp"],
                micro_batch=row["mbs"], global_batch=row["gbs"], schedule=row["schedule"], virtual_stages=row["v"],
                zero=0, sequence_parallel=False, overlap_dp=row["overlap_dp"], dtype=row["dtype"],
                stages=even_stages(row["layers"], row["pp"] * row["v"], "full"))
    costs = plan_costs(plan, profile, cluster)
    layout = ParallelLayout(pp=plan.pp, dp=plan.dp, tp=plan.tp, gpus_per_node=cluster.gpus_per_node)
    result = simulate_step(costs, layout, cluster, contention, record_events=False)
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
            print(f"  {row['label']:>10} tp={row['tp']:<2} pp={row['pp']:<2} dp={row['dp']:<3} mbs={row['mbs']:<2} "
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
    args = ap.parse_args(argv)
    global_set = dict(parse_override(item) for item in args.hw_set)
    contention = not args.no_contention
    print(f"contention {'on' if contention else 'off'}; global overrides: {global_set or 'none (profile defaults)'}")
    out = {}
    for name in ("vtrain_multi_node.csv", "vtrain_single_node.csv"):
        out[name] = run_file(name, vtrain_rows(name), global_set, contention, args.quiet)
    out["megatron_sc21_table1.csv"] = run_file("megatron_sc21_table1.csv", megatron_rows(), global_set, contention,
                                               args.quiet)
    return out


if __name__ == "__main__":
    main()
