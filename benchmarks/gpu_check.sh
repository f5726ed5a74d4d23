#!/usr/bin/env bash
# Measured vs predicted on one lent GPU (an H200), under 8 minutes: see benchmarks/gpu_check.py.
#   benchmarks/gpu_check.sh [-o results.json] [--force] [--steps 8] [--budget-s 450]
# Without -o the JSON goes to $OUT/gpu_check.json. Without a GPU: one line, exit 2.
# PYTHON picks the interpreter (default python3, the one holding a CUDA PyTorch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA GPU visible to $PY (torch.cuda.is_available() is False or torch is missing); run it on a GPU machine" >&2
    exit 2
fi
missing=$("$PY" -c 'import importlib.util as u; print(" ".join(m for m in ("simpy", "pulp", "click", "matplotlib", "numpy") if u.find_spec(m) is None))')
if [ -n "$missing" ]; then
    echo "gpu_check: $PY lacks $missing; install them (or carry their wheels) first" >&2
    exit 2
fi
if ! "$PY" -c 'import smplan.planner' 2>/dev/null; then
    echo "gpu_check: installing this checkout into $PY's environment (pip install --no-deps -e .)" >&2
    "$PY" -m pip install -q --no-deps --no-build-isolation -e . >&2
fi
# 8 minutes at most, whatever happens inside (the script itself stops starting plans at --budget-s)
exec timeout 480 "$PY" benchmarks/gpu_check.py "$@"
