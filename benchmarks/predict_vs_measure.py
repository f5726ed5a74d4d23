"""Predicted vs measured step time on this machine, with held-out plans.

    python benchmarks/predict_vs_measure.py                # 2 processes, 8 plans, ~2-3 min
    python benchmarks/predict_vs_measure.py --nproc 4 --plans 8 --json

1. Probes the machine (`smplan.hwprofiles.probe`, as `smplan hw probe`) into OUT/probed.toml.
2. Picks --plans diverse plans of examples/gpt.py at a small size (smplan.calibrate.plans:
   farthest-point over dp/tp/pp, micro-batch, recomputation) and runs each for real with
   the executor (gloo on CPU, OMP_NUM_THREADS=1 per process).
3. Fits the profile's global efficiency factors on the first half of the plans (the ones
   `smplan calibrate --plans K` would pick) and predicts the second half, held out.
4. Prints measured and predicted step time and |error| per plan, the median |error| of
   the held-out plans and Spearman's rank correlation of predicted vs measured.

Targets (issue 7): held-out median |error| <= 15%, Spearman >= 0.8.
Measurements are the fastest step after the first (see smplan.calibrate.measure); other
jobs on a shared machine only add time, so they inflate the median but not the minimum.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

MODEL = str(ROOT / "examples" / "gpt.py")
# Small enough that a step takes 0.1-0.5 s on one core, big enough that GEMMs matter.
MODEL_ARGS = dict(layers=4, hidden=256, heads=8, seq_len=128, vocab=1024, dropout=0.0)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=2, choices=(2, 4), help="processes per run")
    ap.add_argument("--plans", type=int, default=8, help="plans in all (half calibrate, half held out; >= 6)")
    ap.add_argument("--steps", type=int, default=8, help="steps per plan (the first is warm-up)")
    ap.add_argument("--rounds", type=int, default=2, help="run the plan list this many times, keep the fastest")
    ap.add_argument("--gbs", type=int, default=8, help="global batch of every plan")
    ap.add_argument("--hw", default=None, help="reuse this probed profile instead of probing again")
    ap.add_argument("--out", default=None, help="folder for the probe, the runs and the calibrated profile")
    ap.add_argument("--json", action="store_true", help="print one JSON object at the end")
    args = ap.parse_args(argv)
    if args.plans < 6:
        ap.error("--plans must be at least 6 (3 to calibrate, 3 held out)")

    from smplan.hwprofiles.probe import probe, to_toml
    from smplan.hwprofiles.profile_file import with_efficiency, write_profile
    from smplan.planner import profile_model

    from smplan.calibrate import CalibrateOptions, local_cluster, predict
    from smplan.calibrate.fit import ape, fit_efficiency, median, spearman
    from smplan.calibrate.measure import device_dtype
    from smplan.calibrate.run import build_plans, measure_all

    out = Path(args.out or ROOT / "runs" / f"predict-vs-measure-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else print
    t0 = time.perf_counter()
    hw = args.hw
    if hw is None:
        hw = str(out / "probed.toml")
        result = probe(nproc=args.nproc)
        Path(hw).write_text(to_toml(result, name="probed"))
        say(f"probe: fp32 peak {result.peak_tflops['fp32'] * 1e3:.0f} GFLOP/s per process, half-size "
            f"{result.matmul_half_dim:.0f}, copy {result.memory_bandwidth_gbps:.1f} GB/s, all-reduce "
            f"{result.link_bandwidth_gbps:.2f} GB/s + {result.link_latency_us:.0f} us  ({time.perf_counter() - t0:.0f} s)")
    device, dtype = device_dtype()
    profile = profile_model(MODEL, MODEL_ARGS, dtype=dtype)
    opts = CalibrateOptions(plans=args.plans, steps=args.steps, rounds=args.rounds, nproc=args.nproc, global_batch=args.gbs,
                            runs_dir=str(out / "runs"))
    labelled = build_plans(MODEL, MODEL_ARGS, hw, opts, profile)
    measured = measure_all(labelled, MODEL, opts, say)
    ok = [m for m in measured if m.step_time_s]
    half = len(labelled) // 2
    fit_set = [m for m in ok if labelled.index((m.label, m.plan)) < half]
    probed = local_cluster(hw, args.nproc)
    fit = fit_efficiency(probed, lambda c: predict([m.plan for m in fit_set], profile, c),
                         [m.step_time_s for m in fit_set])
    calibrated = dataclasses.replace(probed, efficiency=fit.efficiency)
    write_profile(with_efficiency(Path(hw).read_text(), fit.efficiency,
                                  [f"calibrated by benchmarks/predict_vs_measure.py on {len(fit_set)} plans"]),
                  out / "calibrated.toml", force=True)

    rows = []
    before = predict([m.plan for m in ok], profile, probed)
    after = predict([m.plan for m in ok], profile, calibrated)
    for m, b, a in zip(ok, before, after, strict=True):
        rows.append({"plan": m.label, "set": "fit" if m in fit_set else "held-out", "measured_s": m.step_time_s,
                     "median_s": m.median_step_time_s, "predicted_probe_s": b, "predicted_s": a,
                     "ape": ape(a, m.step_time_s), "ape_probe": ape(b, m.step_time_s)})
    held_rows = [r for r in rows if r["set"] == "held-out"]
    summary = {
        "device": device,
        "nproc": args.nproc,
        "model_args": MODEL_ARGS,
        "rows": rows,
        "failed": [{"plan": m.label, "error": m.error} for m in measured if not m.step_time_s],
        "fitted_efficiency": {k: getattr(fit.efficiency, k) for k in fit.keys},
        "held_out_median_ape": median([r["ape"] for r in held_rows]),
        "held_out_median_ape_probe_only": median([r["ape_probe"] for r in held_rows]),
        "fit_median_ape": median([r["ape"] for r in rows if r["set"] == "fit"]),
        "spearman_held_out": spearman([r["predicted_s"] for r in held_rows], [r["measured_s"] for r in held_rows]),
        "spearman_all": spearman([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows]),
        "median_over_min_step_time": median([r["median_s"] / r["measured_s"] for r in rows if r["median_s"]]),
        "wall_s": time.perf_counter() - t0,
        "out": str(out),
    }
    _print(summary, say)
    if args.json:
        print(json.dumps(summary, indent=2))
    return summary


def _print(s: dict, say) -> None:
    say("")
    say(f"{'plan':44s} {'set':8s} {'measured':>9s} {'probe only':>10s} {'calibrated':>10s} {'|error|':>8s}")
    for r in s["rows"]:
        say(f"{r['plan']:44s} {r['set']:8s} {r['measured_s'] * 1e3:7.1f}ms {r['predicted_probe_s'] * 1e3:8.1f}ms "
            f"{r['predicted_s'] * 1e3:8.1f}ms {r['ape']:8.1%}")
    for f in s["failed"]:
        say(f"FAILED {f['plan']}: {f['error']}")
    say("fitted: " + ", ".join(f"{k}={v:.4g}" for k, v in s["fitted_efficiency"].items()))
    say(f"median |error|: fit plans {s['fit_median_ape']:.1%}; held-out {s['held_out_median_ape']:.1%} "
        f"(probe only, before the fit: {s['held_out_median_ape_probe_only']:.1%})   target <= 15%")
    say(f"Spearman predicted vs measured: held-out {s['spearman_held_out']:.2f}, all {s['spearman_all']:.2f}"
        f"   target >= 0.8")
    say(f"noise: median step / fastest step = {s['median_over_min_step_time']:.2f}; wall {s['wall_s']:.0f} s; "
        f"files under {s['out']}")


if __name__ == "__main__":
    main()
