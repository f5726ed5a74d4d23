"""How fast and how right `smplan profile` is on GPT-3 sizes.

    python benchmarks/profile_speed.py

Prints, for gpt3_175b (and gpt3_1t): wall time of `smplan profile --json --no-cache` in a
fresh process, its peak RSS (no weights may be allocated: < 2 GiB), the time of a second
(cached) call, and the ratios of the profile to the published formulas:
- training FLOPs per iteration vs 72·B·s·l·h²·(1 + s/(6h) + V/(12lh)) (Narayanan et al. 2021),
- parameters vs 12·l·h²·(1 + 13/(12h)) + V·h + s·h (ibid.; our head is untied: + V·h),
- activation bytes per layer vs s·b·h·(34 + 5·a·s/h) (Korthikanti et al. 2022), for a few
  Megatron-style configurations, and the split (24 / 10 / 5as²) that TP and recompute act on.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "examples" / "gpt.py"
SIZES = {"gpt3_175b": (96, 12288, 2048, 51200), "gpt3_1t": (128, 25600, 2048, 51200)}  # l, h, s, V


def timed_profile(preset: str, cache_dir: str, no_cache: bool) -> tuple[float, float, dict]:
    """(wall s, peak RSS GiB, JSON) of one `smplan profile` in a fresh process."""
    code = "import sys; from smplan.cli.main import main; sys.argv[0] = 'smplan'; main()"
    args = [sys.executable, "-c", code, "profile", f"{GPT}:{preset}", "--json"]
    env = {**os.environ, "SMPLAN_CACHE_DIR": cache_dir}
    start = time.perf_counter()
    out = subprocess.run(args + (["--no-cache"] if no_cache else []), capture_output=True, text=True,
                         check=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - start
    rss_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
    return wall, rss_gib, json.loads(out.stdout)


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        for preset, (n_layers, h, s, v) in SIZES.items():
            wall, rss, data = timed_profile(preset, cache, no_cache=False)  # fills the cache
            again, _, _ = timed_profile(preset, cache, no_cache=False)
            flops = 72 * s * n_layers * h * h * (1 + s / (6 * h) + v / (12 * n_layers * h))
            params = 12 * n_layers * h * h * (1 + 13 / (12 * h)) + v * h + s * h
            print(f"{preset}: profile {wall:.2f} s (cached: {again:.2f} s), peak RSS (largest run so far) {rss:.2f} GiB")
            print(f"  train FLOPs/sample ratio to Narayanan: {data['train_flops_per_sample'] / flops:.5f}")
            print(f"  params {data['params']:,}, ratio to Narayanan: {data['params'] / params:.5f} "
                  f"(untied head adds V*h = {v * h / params:.2%})")

    sys.path.insert(0, str(ROOT))
    from smplan.planner import profile_model

    print("\nactivation bytes per layer (b=1, no TP, no recompute) vs Korthikanti s*h*(34 + 5as/h):")
    print("  attention    s      h    a   total  sharded/sh  replicated/sh  core/(a s^2)")
    for attention, (s, h, a) in [(att, cfg) for att in ("explicit", "sdpa")
                                  for cfg in [(128, 256, 4), (512, 1024, 16), (2048, 1536, 12), (2048, 12288, 96)]]:
        cfg = dict(layers=1, hidden=h, heads=a, seq_len=s, vocab=1024, attention=attention)
        block = profile_model(str(GPT), cfg, cache=False).blocks[0]
        ratio = block.saved_bytes_per_sample / (s * h * (34 + 5 * a * s / h))
        print(f"  {attention:9s} {s:5d} {h:6d} {a:4d}  {ratio:6.3f}  {block.saved_bytes_tp_sharded_per_sample / (s * h):10.2f}"
              f"  {block.saved_bytes_replicated_per_sample / (s * h):13.2f}"
              f"  {block.saved_bytes_attention_core_per_sample / (a * s * s):12.2f}")


if __name__ == "__main__":
    main()
