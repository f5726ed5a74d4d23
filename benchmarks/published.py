"""The published runs of the validation folder (validation_data.py) as smplan plans: one reading for every benchmark.

Settings per the folder's README (nothing here is fitted per row):
- vTrain (Megatron-DeepSpeed, A100 SXM 80 GB -- the 3.6B tp=1 dp=64 rows need 58 GB of
  model states at ZeRO-0, so not the 40 GB part -- 100 Gb/s per GPU across nodes:
  inter_node.bandwidth_gbps=12.5): fp16, full recompute, 1F1B, overlap_dp=0, zero=0,
  vocabulary 50257, no sequence parallelism.
- Megatron-LM SC21 Table 1 (Selene, 200 Gb/s per GPU: the a100x8 profile as is): bf16, full
  recompute, and what the authors' own script (NVIDIA/Megatron-LM examples/sc21/run_table_1.sh)
  sets per size: the micro-batch, the layers per virtual pipeline stage (interleaved schedule;
  1F1B where it sets none) and the DDP: torch's (all-reduce overlapped with backward) at pp=1,
  Megatron's local one (all-reduce after the last backward) at pp > 1; measured step time =
  F / (TFLOP/s x GPUs), F = 96 B s l h^2 (1 + s/6h + V/16lh).
- Megatron-LM SC21 Table 2: PTD-P rows (tp=8, pp = model_parallel_size / 8, the table's
  micro-batch) take the schedule and DDP the scripts give the same model (175B:
  run_figure_12.sh, 530B: run_table_1.sh); ZeRO-3 rows are DeepSpeed ZeRO-3 with
  tp = model_parallel_size, pp=1, the table's micro-batch, full recompute, gradients
  reduce-scattered per micro-batch.
Both measured frameworks shard the embedding, the output layer and the cross-entropy over
the tp ranks (Megatron's vocab-parallel layers, Shoeybi et al. 2019 section 3), as
examples/gpt.py's tp_plan_outer does; each row's profile is the one `smplan profile` /
`smplan simulate` make of examples/gpt.py at the row's shape (`profile_model`), unpatched.
"""

from __future__ import annotations

import csv
import functools
import sys
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from smplan.hwprofiles import load_cluster, parse_override  # noqa: E402
from smplan.planner import Plan, even_stages, profile_model  # noqa: E402
from validation_data import validation_file  # noqa: E402

GPT = str(ROOT / "examples" / "gpt.py")
VTRAIN_HW = {"inter_node.bandwidth_gbps": 12.5}  # 800 Gb/s per 8-GPU node = 100 Gb/s per GPU
# Shapes of Table 2's models (Narayanan et al. 2021, Table 1 rows of the same size).
# Table 2 has no script; its PTD-P rows take the schedule the authors' scripts give the same
# model (NVIDIA/Megatron-LM examples/sc21): 175B at tp8 pp12 as run_figure_12.sh's interleaved
# case (2 layers per virtual stage), 530B as run_table_1.sh (1 layer per virtual stage).
TABLE2_SHAPES = {174.6: dict(heads=96, hidden=12288, layers=96, layers_per_virtual_stage=2),
                 529.6: dict(heads=128, hidden=20480, layers=105, layers_per_virtual_stage=1)}


def model_args(row: dict) -> dict:
    """The row's shape as examples/gpt.py builder arguments (`--arg` of the CLI)."""
    return dict(layers=row["layers"], hidden=row["hidden"], heads=row["heads"], seq_len=row["seq"], vocab=row["vocab"])


@functools.cache
def _profile(args: tuple, dtype: str):
    return profile_model(GPT, dict(args), dtype=dtype)


def row_profile(row: dict):
    """`smplan.planner.profile_model` of examples/gpt.py at the row's shape and dtype (what the
    CLI builds for `smplan simulate examples/gpt.py --arg ...`), once per shape."""
    return _profile(tuple(sorted(model_args(row).items())), row["dtype"])


def plan_for(row: dict, nodes: int) -> Plan:
    return Plan(model=GPT, hw="a100x8", nodes=nodes, dp=row["dp"], tp=row["tp"], pp=row["pp"],
                micro_batch=row["mbs"], global_batch=row["gbs"], schedule=row["schedule"], virtual_stages=row["v"],
                zero=row.get("zero", 0), sequence_parallel=False, overlap_dp=row["overlap_dp"], dtype=row["dtype"],
                stages=even_stages(row["layers"], row["pp"] * row["v"], "full"))


def nodes_for(row: dict) -> int:
    return max(1, -(-row["gpus"] // 8))


# The column names of vTrain's own data/ground_truth_*.csv, mapped onto the validation folder's.
VTRAIN_REPO_COLUMNS = {
    "Parameters (billion)": "params_b", "# GPUs": "gpus", "global batch": "global_batch",
    "micro batch": "micro_batch", "hidden size": "hidden", "attention heads": "heads", "# layers": "layers",
    "sequence length": "seq_len", "tensor parallelism": "tp", "data parallelism": "dp",
    "pipeline parallelism": "pp", "iteration time (ms)": "iteration_ms",
}


VTRAIN_NEEDED = tuple(c for c in VTRAIN_REPO_COLUMNS.values() if c != "params_b")  # params_b only labels rows


class PublishedFileError(ValueError):
    """A published-runs CSV this module cannot read; the message names the file and the fix."""


def vtrain_rows(folder: Path, name: str) -> list[dict]:
    """Rows of a vTrain-format CSV in the validation folder."""
    return read_vtrain_csv(validation_file(folder, name))


def read_vtrain_csv(path: Path) -> list[dict]:
    """Rows of a vTrain-format CSV at `path`, with the folder's or the vTrain repository's
    column names."""
    rows = []
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        columns = {_column(k) for k in reader.fieldnames or ()}
        missing = [c for c in VTRAIN_NEEDED if c not in columns]
        if missing:
            raise PublishedFileError(f"{path}: no column {missing[0]!r}; give a vTrain-format CSV "
                                     f"(columns {', '.join(VTRAIN_NEEDED)})")
        for line, raw in enumerate(reader, start=2):
            try:
                r = {_column(k): float(v) for k, v in raw.items()}
            except (TypeError, ValueError):
                raise PublishedFileError(f"{path}:{line}: every value must be a number; fix that row") from None
            rows.append(dict(
                label=f"{r['params_b']}B" if "params_b" in r else f"h{int(r['hidden'])} l{int(r['layers'])}",
                hidden=int(r["hidden"]), heads=int(r["heads"]), layers=int(r["layers"]), seq=int(r["seq_len"]),
                vocab=50257, tp=int(r["tp"]), pp=int(r["pp"]), dp=int(r["dp"]), mbs=int(r["micro_batch"]),
                gbs=int(r["global_batch"]), gpus=int(r["gpus"]), measured_s=r["iteration_ms"] / 1e3,
                schedule="1f1b", v=1, overlap_dp=False, dtype="fp16", hw_set=VTRAIN_HW,
            ))
    if not rows:
        raise PublishedFileError(f"{path}: no rows; give a vTrain-format CSV with at least one run")
    return rows


def _column(name: str) -> str:
    return VTRAIN_REPO_COLUMNS.get(name.strip(), name.strip())


def global_overrides(items: list[str]) -> dict:
    """`--hw-set KEY=VALUE` items as one dict, checked against the profile before any row runs."""
    overrides = dict(parse_override(item) for item in items)
    load_cluster("a100x8", overrides=overrides)  # raises HardwareProfileError naming the bad key
    return overrides


def usage_error(message: str) -> NoReturn:
    """One line on stderr and exit code 2, the project's answer to a wrong input."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


# Table 1 as the authors ran it: NVIDIA/Megatron-LM examples/sc21/run_table_1.sh gives each
# size's micro-batch (MBS) and --num-layers-per-virtual-pipeline-stage (None: plain 1F1B).
SC21_TABLE1_SCRIPT = {1.7: (16, None), 3.6: (16, None), 7.5: (16, None), 18.4: (8, None), 39.1: (4, None),
                      76.1: (2, 5), 145.6: (2, 5), 310.1: (1, 3), 529.6: (1, 1), 1008.0: (1, None)}


def _megatron_row(label, heads, hidden, layers, tp, pp, gpus, gbs, mbs, tflops, zero=0,
                  layers_per_virtual_stage: int | None = None) -> dict:
    s, vocab = 2048, 51200
    dp = gpus // (tp * pp)
    flops = 96 * gbs * s * layers * hidden**2 * (1 + s / (6 * hidden) + vocab / (16 * layers * hidden))  # the paper's F
    v = layers // pp // layers_per_virtual_stage if layers_per_virtual_stage else 1
    # run_table_1.sh / run_figure_*.sh: DDP=torch (all-reduce overlapped with the last backward)
    # with pp=1, DDP=local (one all-reduce after the last backward) with pp > 1.
    return dict(label=label, hidden=hidden, heads=heads, layers=layers, seq=s, vocab=vocab, tp=tp, pp=pp, dp=dp,
                mbs=mbs, gbs=gbs, gpus=gpus, measured_s=flops / (tflops * 1e12 * gpus), zero=zero,
                schedule="interleaved" if v > 1 else "1f1b", v=v, overlap_dp=pp == 1, dtype="bf16", hw_set={})


def megatron_rows(folder: Path) -> list[dict]:
    rows = []
    with open(validation_file(folder, "megatron_sc21_table1.csv")) as fh:
        for r in csv.DictReader(fh):
            # a size the script does not list: micro-batch 1, 1F1B
            mbs, per_virtual_stage = SC21_TABLE1_SCRIPT.get(float(r["params_b"]), (1, None))
            rows.append(_megatron_row(f"{r['params_b']}B", int(r["heads"]), int(r["hidden"]), int(r["layers"]),
                                      int(r["tp"]), int(r["pp"]), int(r["gpus"]), int(r["global_batch"]), mbs,
                                      float(r["tflops_per_gpu"]), layers_per_virtual_stage=per_virtual_stage))
    return rows


def megatron_table2_rows(folder: Path, scheme: str | None = None) -> list[dict]:
    """Table 2's rows (PTD-P and ZeRO-3 at the same global batch); `scheme` filters."""
    rows = []
    with open(validation_file(folder, "megatron_sc21_table2.csv")) as fh:
        for r in csv.DictReader(fh):
            if scheme and r["scheme"] != scheme:
                continue
            shape = TABLE2_SHAPES[float(r["params_b"])]
            mp = int(r["model_parallel_size"])
            tp, pp, zero = (mp, 1, 3) if r["scheme"] == "zero-3" else (8, mp // 8, 0)
            rows.append(_megatron_row(f"{r['scheme']} {r['params_b']}B", shape["heads"], shape["hidden"],
                                      shape["layers"], tp, pp, int(r["gpus"]), int(r["global_batch"]),
                                      int(r["micro_batch"]), float(r["tflops_per_gpu"]), zero,
                                      layers_per_virtual_stage=shape["layers_per_virtual_stage"] if pp > 1 else None))
    return rows


def mape(rows: list[dict], predicted_s: list[float]) -> float:
    return 100 * sum(abs(p - r["measured_s"]) / r["measured_s"] for r, p in zip(rows, predicted_s, strict=True)) / len(rows)
