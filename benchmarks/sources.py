"""Every file of the validation folder as smplan plans: one mapping function per source file.

A mapped row is what a user would get from the CLI: `smplan simulate examples/gpt.py --arg ...
--hw NAME --plan dp=..,tp=..,...` -- the builder's arguments from the row's model dims, a
bundled hardware profile, the plan keys the row states. A row the CLI cannot express yet is
kept as a `Skipped` with every reason that applies (FP4, a GPU without a bundled profile, an
architecture no example builds, ...). FP8 rows (per-tensor / current scaling, as Transformer
Engine's default recipe and torchao's float8 linears) plan `dtype=fp8` where the profile has
an fp8 peak, MXFP8 rows `dtype=fp8,fp8_scaling=block`; cp > 1 rows plan `cp`; MoE rows build examples/moe.py from the
matching preset with the row's dims as `--arg`s and plan `ep`.

Where a source leaves a setting out, the assumption lives in FRAMEWORK_DEFAULTS below (one
dict per source, each entry citing where it comes from); nothing is set per row and nothing
is fitted per row or per source. Each source names the software stack it ran on
(SOURCE_STACKS, a bundled `--stack`), applied as `smplan simulate --stack` applies it. The measured figure becomes a step time by plain
arithmetic: step_s = global_batch * seq_len / (tokens_per_s_per_gpu * gpus).

The vTrain and Megatron SC21 files keep the reading of benchmarks/published.py.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from published import (
    GPT,
    ROOT,
    megatron_rows,
    megatron_table2_rows,
    model_args,
    nodes_for,
    plan_for,
    vtrain_rows,
)
from smplan.hwprofiles import DEFAULT_STACK, load_cluster
from smplan.planner import Plan, PlanError, Stage, even_stages
from validation_data import validation_file


@dataclass(frozen=True)
class Mapped:
    """One published run as a plan the CLI would simulate."""

    source: str
    run: str
    plan: Plan
    model_args: dict  # builder arguments of plan.model (`--arg`)
    dtype: str  # the plan's dtype (fp8 profiles the model at bf16: smplan.planner.profile_model)
    hw: str  # bundled hardware profile (`smplan hw list`)
    nodes: int
    measured_s: float  # measured step time, seconds
    hw_set: dict = field(default_factory=dict)  # profile overrides stated by the source (not fitted)
    # Plan keys the source leaves out and the planner picks, as a user would with
    # `smplan plan --fix <every key the row states>` (benchmarks/validate_published.py).
    choose: tuple[str, ...] = ()
    stack: str = DEFAULT_STACK  # the source's software stack (`--stack`, SOURCE_STACKS)


@dataclass(frozen=True)
class Skipped:
    source: str
    run: str
    reason: str  # every reason that applies, joined by "; "

    @property
    def reasons(self) -> list[str]:
        return self.reason.split("; ")


Row = Mapped | Skipped

# Bundled profile per GPU string of the modern files (`smplan hw list`); others are skipped.
GPU_PROFILES = {
    "A100 80GB": "a100x8",
    "A100 40GB": "a100-40gx8",
    "H100 (DGX-H100)": "h100x8",
    # torchtitan's 2024 H100s are 94-95 GB HBM2e lower-TDP parts (its footnote 1); the closest
    # bundled profile is the SXM5-80GB one, so these rows are predicted somewhat too fast.
    "H100 (94-95GB HBM2e)": "h100x8",
    "B200 (DGX-B200)": "b200x8",
    "B300 (DGX-B300)": "b300x8",
    # NVL72 racks: 4-GPU compute trays (the rows' gpus_per_node) in one 72-GPU NVLink domain.
    "GB200 (DGX-GB200 NVL72)": "gb200nvl72",
    "GB300 (DGX-GB300 NVL72)": "gb300nvl72",
}

# The training framework each source ran on, as a bundled stack (`smplan stack list`), per file.
SOURCE_STACKS = {
    # vTrain (Bang et al. 2024, MICRO) profiled Megatron-DeepSpeed on A100s; Narayanan et al. 2021
    # (SC21) ran 2021 Megatron-LM, the code Megatron-DeepSpeed forked: eager, hand-fused kernels.
    "vtrain_multi_node.csv": "megatron-deepspeed",
    "vtrain_single_node.csv": "megatron-deepspeed",
    "megatron_sc21_table1.csv": "megatron-deepspeed",
    "megatron_sc21_table2.csv": "megatron-deepspeed",
    # Megatron-Bridge and NeMo 24.07 perf summaries: Megatron-Core underneath (their docs).
    "megatron_bridge_perf_summary.csv": "megatron-core",
    "nemo_perf_summary_2407_h100.csv": "megatron-core",
    # llm-foundry trains through Composer with PyTorch FSDP1 (its benchmarking README).
    "llm_foundry_mpt_a100.csv": "pytorch-fsdp",
    # torchtitan's own docs/performance.md.
    "torchtitan_docs_performance_2024.csv": "torchtitan",
}

# What each source leaves out, in one place. Cited per entry; never a fitted number.
FRAMEWORK_DEFAULTS = {
    "megatron_bridge_perf_summary.csv": dict(
        # Megatron-Bridge perf recipes (src/megatron/bridge/perf_recipes) train with the distributed
        # optimizer (ZeRO-1) under DDP, sequence parallelism whenever tp > 1, TE fused attention,
        # no dropout. Recompute is not in the table and the recipes change it per release
        # (validation README): None = the planner chooses it (and how many blocks per stage).
        zero_ddp=1, zero_fsdp=3, sp_when_tp=True, recompute=None, attention="sdpa", dropout=0.0,
        gpus_per_node=8,
        # Its perf configs (scripts/performance/configs/*/*_workload_base_configs.py) set
        # moe_a2a_overlap=True for Qwen3-235B on H100, where the all-to-all crosses InfiniBand;
        # False for Qwen3-30B on H100 (HybridEP dispatcher), Qwen3-235B on B200 and DeepSeek-V3
        # on H100, unset elsewhere (NVL72 racks use HybridEP and CUDA graphs instead; GPT-OSS
        # never sets it): (MoE preset, profile) pairs. Entries that change between versions of
        # the files (B300's Qwen3-235B; DeepSeek-V3's MXFP8 variants) stay off here.
        ep_a2a_overlap_on=(("qwen3_235b", "h100x8"),),
        # The same configs dispatch Qwen3-30B and DeepSeek-V3 through the flex dispatcher with
        # moe_flex_dispatcher_backend "hybridep" (DeepSeek-V3 MXFP8 on B200: "deepep"), Qwen3-235B
        # off NVL72 with moe_token_dispatcher_type "alltoall": the models (in the run name) whose
        # rows run efficiency.ep_dispatcher = "node_dedup" (it only matters where the EP group
        # crosses nodes; Kimi K2, which takes DeepSeek-V3's preset, is not among them).
        ep_dedup_models=("qwen3_30b", "deepseekv3"),
        # DeepSeek-V3's and Kimi K2's recipes split the pipeline by a layout, not evenly: every
        # model chunk takes ceil(61 / chunks) decoder layers in order, the first after the
        # embedding (so its dense layers and the first MoE layers), the last what remains before
        # MTP and the loss (recipes/deepseek/deepseek_v3.py
        # `set_deepseek_v3_pipeline_model_parallel_layout`, recipes/kimi/kimi_k2.py
        # `_get_kimi_k2_pipeline_layout`, for 4, 8 and 16 chunks; the perf configs' pp_layout
        # "Et*4|(t*4|)*14tmL" is the same): the models (in the run name) whose rows are split so
        # (`front_filled_stages`; 32 chunks, DeepSeek-V3 on H100 at pp=8 v=4, keep the even split:
        # that layout, "Et|(tt|)*30mL", puts dense layers past the first chunk).
        front_filled_layout_models=("deepseekv3", "kimi_k2"),
    ),
    "nemo_perf_summary_2407_h100.csv": dict(
        # NeMo 24.07 launcher yamls (NeMo-Framework-Launcher conf/training @ 26e42fa9):
        # use_distributed_optimizer true, sequence_parallel true with tp > 1, flash/TE attention,
        # no activation checkpointing in the perf configs, dropout 0.
        zero_ddp=1, zero_fsdp=3, sp_when_tp=True, recompute="none", attention="sdpa", dropout=0.0,
        gpus_per_node=8,
    ),
    "llm_foundry_mpt_a100.csv": dict(
        # llm-foundry benchmarking README: pure FSDP FULL_SHARD (ZeRO-3), no TP/PP;
        # mpt-*.yaml: attn_impl triton/flash, GELU 4h MLP, LayerNorm, learned positions (NumParams
        # matches a seq_len-row table), dropout 0. GPUs per node not stated: MosaicML's A100
        # nodes are 8-GPU; "1600 Gbps node-node" per node / 8 GPUs = 25 GB/s per GPU.
        # mpt-*.yaml `loss_fn: fused_crossentropy`: flash-attn's losses.cross_entropy kernel, which
        # keeps the bf16 logits and writes a bf16 gradient (no fp32 logits) -> examples/gpt.py loss="chunked".
        zero=3, sp_when_tp=False, attention="sdpa", mlp="gelu", norm="layernorm", learned_positions=True,
        dropout=0.0, gpus_per_node=8, loss="chunked",
        # The 2023 mpt-*.yaml pretrain configs set attn_impl: triton, the 2022 Triton flash kernel
        # (FlashAttention-1 class; the file's note: "triton/flash (yaml attn_impl)")
        attention_kernel="flash1",
    ),
    "torchtitan_docs_performance_2024.csv": dict(
        # torchtitan docs/performance.md + train_configs: FSDP2 (ZeRO-3), TP with sequence
        # parallel norms (parallelize_llama), SDPA flash attention, Llama blocks (SwiGLU,
        # RMSNorm, RoPE), no dropout, no gradient accumulation (micro-batch = local batch =
        # global batch / dp). Grand Teton / DGX A100 nodes are 8 GPUs.
        zero=3, sp_when_tp=True, attention="sdpa", mlp="swiglu", norm="rmsnorm", learned_positions=False,
        dropout=0.0, gpus_per_node=8,
    ),
}

# Recompute as the sources name it -> the plan's key; the others are skipped with a reason.
RECOMPUTE_NAMES = {"": None, "none": "none", "full ac": "full", "full activation checkpointing": "full",
                   "selective op ac": "sac", "selective layer ac": "full"}
RECOMPUTE_UNSUPPORTED: dict[str, str] = {}
# torchtitan's layer-selective AC checkpoints every k-th TransformerBlock whole, k =
# `selective_ac_option` ("2" in its train_configs): full recompute on half of each stage's
# blocks, the plan file's per-stage `recompute_blocks`.
EVERY_KTH_LAYER = {"selective layer ac": 2}


# ----------------------------------------------------------------- old files (published.py)


def _from_published(source: str, rows: list[dict]) -> list[Row]:
    out: list[Row] = []
    for i, r in enumerate(rows):
        nodes = nodes_for(r)
        out.append(Mapped(source, f"{r['label']}#{i}", plan_for(r, nodes), model_args(r), r["dtype"], "a100x8",
                          nodes, r["measured_s"], dict(r["hw_set"]), stack=SOURCE_STACKS[source]))
    return out


def vtrain_multi(folder: Path) -> list[Row]:
    return _from_published("vtrain_multi_node.csv", vtrain_rows(folder, "vtrain_multi_node.csv"))


def vtrain_single(folder: Path) -> list[Row]:
    return _from_published("vtrain_single_node.csv", vtrain_rows(folder, "vtrain_single_node.csv"))


def sc21_table1(folder: Path) -> list[Row]:
    return _from_published("megatron_sc21_table1.csv", megatron_rows(folder))


def sc21_table2(folder: Path) -> list[Row]:
    return _from_published("megatron_sc21_table2.csv", megatron_table2_rows(folder))


# ----------------------------------------------------------------- modern files (shared header)


def read_rows(folder: Path, name: str) -> list[dict]:
    with open(validation_file(folder, name), newline="") as fh:
        return list(csv.DictReader(fh))


def _int(value: str) -> int | None:
    value = (value or "").strip()
    return int(float(value)) if value else None


def per_run(rows: Iterable[dict]) -> list[dict]:
    """One row per `run`: its step time if given, else its tokens/s/GPU; `_metric` says which,
    None when the run has neither (an MFU or TFLOP/s alone needs the source's FLOP count)."""
    runs: dict[str, dict] = {}
    for r in rows:
        runs.setdefault(r["run"], {"row": r, "metrics": {}})["metrics"][r["metric"]] = float(r["value"])
    out = []
    for entry in runs.values():
        row = dict(entry["row"])
        m = entry["metrics"]
        row["_metric"] = next((k for k in ("step_time_s", "tokens_per_s_per_gpu") if k in m), None)
        row["_value"] = m.get(row["_metric"]) if row["_metric"] else None
        out.append(row)
    return out


def precision_skip(precision: str) -> str | None:
    """Why a row's precision has no plan dtype, or None (BF16, FP8 per-tensor or block-scaled)."""
    p = precision.lower()
    if "fp4" in p:
        return "FP4"
    if "not stated" in p:
        return "precision not stated"
    return None


def precision_fp8_scaling(precision: str) -> str:
    """MXFP8 / "FP8-MX" (OCP microscaling, 32-element blocks) -> "block"; other FP8 -> "tensor"."""
    p = precision.lower()
    return "block" if "mxfp8" in p or "fp8-mx" in p else "tensor"


def precision_dtype(precision: str) -> str:
    """The plan dtype of a row precision_skip accepts: FP8, FP8-CS (current scaling), "fp8
    (Transformer Engine; bf16 elsewhere)" and torchao's "float8 linears" -> fp8 (FP8 GEMMs,
    bf16 elsewhere: planner/feasibility.py profile_dtype); the rest -> bf16."""
    p = precision.lower()
    return "fp8" if "fp8" in p or "float8" in p else "bf16"


@functools.cache
def fp8_peak_tflops(hw: str) -> float:
    return load_cluster(hw).gpu.peak_tflops.fp8


def family(run: str) -> str | None:
    """Layout of a Megatron-side model from its name: 'llama' (SwiGLU, RMSNorm, RoPE), 'gpt' (GeLU,
    LayerNorm, learned positions), None for what examples/gpt.py does not build."""
    name = run.lower()
    if any(k in name for k in ("llama", "qwen", "mistral")):
        return "llama"
    if "gpt3" in name:
        return "gpt"
    return None


LAYOUTS = {
    "llama": dict(mlp="swiglu", norm="rmsnorm", learned_positions=False),
    "gpt": dict(mlp="gelu", norm="layernorm", learned_positions=True),
}


def inter_node_override(interconnect: str, gpus_per_node: int) -> dict:
    """"1600 Gbps node-node" -> inter_node.bandwidth_gbps per GPU (GB/s), when the source states it."""
    m = re.search(r"(\d+)\s*Gbps node-node", interconnect or "")
    return {"inter_node.bandwidth_gbps": int(m.group(1)) / 8 / gpus_per_node} if m else {}


MOE = str(ROOT / "examples" / "moe.py")
# MoE model name (in the run) -> examples/moe.py preset whose other settings (attention kind,
# router, qk_norm, biases, MLA ranks) the row keeps; the row's dims replace the preset's.
MOE_PRESETS = {
    "deepseekv3": "deepseek_v3",
    "kimi_k2": "deepseek_v3",  # Kimi K2 is DeepSeek-V3's architecture (MLA, sigmoid router) at 384 experts
    "qwen3_30b": "qwen3_30b_a3b",
    "qwen3_235b": "qwen3_235b_a22b",
    "gptoss120b": "gpt_oss_120b",
    "mixtral": "mixtral_8x7b",
}
# dense_layers of each preset (examples/moe.py), for a note that does not state it.
MOE_DENSE_LAYERS = {"deepseek_v3": 3, "qwen3_30b_a3b": 0, "qwen3_235b_a22b": 0, "gpt_oss_120b": 0, "mixtral_8x7b": 0}
# What the notes state about the layers around the routed experts ("dims:" of each note), as
# examples/moe.py builder arguments; what a note does not state keeps the preset's value.
NOTE_ARGS = (
    (r"dense-layer FFN (\d+) for first (\d+) layers", lambda m: dict(dense_ffn=int(m[1]), dense_layers=int(m[2]))),
    (r"dense FFN (\d+) in layer 0", lambda m: dict(dense_ffn=int(m[1]), dense_layers=1)),
    (r"(\d+) shared experts? (?:of )?\d+", lambda m: dict(shared_experts=int(m[1]))),
    (r"kv_channels (\d+)", lambda m: dict(head_dim=int(m[1]))),
)


def moe_preset(run: str) -> str | None:
    name = run.lower().replace(" ", "_")
    return next((preset for key, preset in MOE_PRESETS.items() if key in name), None)


def note_args(note: str) -> dict:
    out: dict = {}
    for pattern, to_args in NOTE_ARGS:
        m = re.search(pattern, note or "")
        if m:
            out.update(to_args(m))
    return out


def map_modern_row(source: str, r: dict, layout: dict | None = None) -> Row:
    """One run of a modern file (shared header) -> Mapped, or Skipped with every reason that applies."""
    d = FRAMEWORK_DEFAULTS[source]
    run = r["run"]

    def skip(reason: str) -> Skipped:
        return Skipped(source, run, reason)

    # Every reason that applies, so the summary can say what each missing key would add.
    hw = GPU_PROFILES.get(r["gpu"].strip())
    moe = (_int(r["experts"]) or 0) > 1
    dtype = precision_dtype(r["precision"])
    reasons = []
    if moe and moe_preset(run) is None:
        reasons.append("MoE architecture not built by examples/moe.py")
    if precision_skip(r["precision"]):
        reasons.append(precision_skip(r["precision"]))
    elif dtype == "fp8" and hw is not None and not fp8_peak_tflops(hw) > 0:
        reasons.append(f"FP8 on {hw}: its profile has no fp8 peak")
    if hw is None:
        reasons.append(f"unknown GPU: no bundled profile for {r['gpu'].split(' (')[0]}")
    if r["_metric"] is None:
        reasons.append("no step time or tokens/s (MFU alone)")
    if reasons:
        return skip("; ".join(reasons))
    if moe:
        layout = {}
    else:
        layout = layout if layout is not None else LAYOUTS.get(family(run) or "")
        if layout is None:
            return skip("architecture not built by examples/gpt.py")
    names = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len") + (("topk",) if moe else ())
    dims = {k: _int(r[k]) for k in names}
    # MLA rows leave kv_heads empty (validation README): every head has its own k and v.
    missing = [k for k, v in dims.items() if v is None and not (moe and k == "kv_heads")]
    if missing:
        return skip(f"model dims not given ({missing[0]})")
    rec_name = r["recompute"].strip().lower()
    if rec_name in RECOMPUTE_UNSUPPORTED:
        return skip(RECOMPUTE_UNSUPPORTED[rec_name])
    if rec_name not in RECOMPUTE_NAMES:
        return skip(f"recompute {r['recompute']!r} not mapped")
    recompute = RECOMPUTE_NAMES[rec_name] or d.get("recompute", "none")
    choose = ("recompute",) if recompute is None else ()
    recompute = recompute or "none"  # the plan as mapped; the planner fills in what `choose` names
    gpus = _int(r["gpus"])
    tp, pp, cp = _int(r["tp"]) or 1, _int(r["pp"]) or 1, _int(r["cp"]) or 1
    ep = (_int(r["ep"]) or 1) if moe else 1
    dp = _int(r["dp"]) or gpus // (tp * pp * cp)  # the files derive dp = GPUs / (TP*PP*CP)
    if dp * tp * pp * cp != gpus:
        return skip(f"dp*tp*pp*cp = {dp * tp * pp * cp} != {gpus} GPUs")
    gbs = _int(r["global_batch"])
    mbs = _int(r["micro_batch"]) or (gbs // dp if gbs else None)  # no gradient accumulation (FRAMEWORK_DEFAULTS)
    if not gbs or not mbs:
        return skip("batch size not given")
    vp = _int(r["vp"]) or 1
    zero_text = r["zero"].lower()
    zero = d["zero"] if "zero" in d else (d["zero_fsdp"] if "fsdp>0" in zero_text or "megatron-fsdp" in zero_text
                                          else d["zero_ddp"])
    gpn = _int(r["gpus_per_node"]) or d["gpus_per_node"]
    nodes = max(1, -(-gpus // gpn))
    seq = dims["seq_len"]
    if r["_metric"] == "step_time_s":
        measured = r["_value"]
    else:
        measured = gbs * seq / (r["_value"] * gpus)
    if moe:
        preset = moe_preset(run)
        model = f"{MOE}:{preset}"
        args = dict(layers=dims["layers"], hidden=dims["hidden"], heads=dims["heads"], moe_ffn=dims["ffn"],
                    experts=_int(r["experts"]), top_k=dims["topk"], vocab=dims["vocab"], seq_len=seq,
                    **({"kv_heads": dims["kv_heads"]} if dims["kv_heads"] else {}), **note_args(r["note"]))
        blocks = dims["layers"] - args.get("dense_layers", MOE_DENSE_LAYERS[preset])  # dense blocks sit before
    else:
        model = GPT
        args = dict(layers=dims["layers"], hidden=dims["hidden"], heads=dims["heads"], kv_heads=dims["kv_heads"],
                    ffn=dims["ffn"], vocab=dims["vocab"], seq_len=seq, attention=d["attention"],
                    dropout=d["dropout"], **{k: d.get(k, v) for k, v in layout.items()})
        blocks = dims["layers"]
    split = even_stages
    if moe and any(name in run.lower() for name in d.get("front_filled_layout_models", ())):
        split = functools.partial(front_filled_stages, dims["layers"] - blocks)
    try:
        # sp=0 for MoE rows although Megatron runs SP with tp > 1: examples/moe.py's tp_plan takes no
        # sequence_parallel, so the CLI refuses sp=1 for it (same tp bytes, all-reduce for RS+AG).
        # capacity_factor 1.0: the MoE rows are force-balanced (validation README, Megatron-Bridge notes)
        plan = Plan(model=model, hw=hw, nodes=nodes, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, micro_batch=mbs,
                    global_batch=gbs, schedule="interleaved" if vp > 1 else "1f1b", virtual_stages=vp, zero=zero,
                    sequence_parallel=bool(d["sp_when_tp"] and tp > 1 and not moe), overlap_dp=True, dtype=dtype,
                    fp8_scaling=precision_fp8_scaling(r["precision"]) if dtype == "fp8" else "tensor",
                    capacity_factor=1.0, stages=_every_kth(split(blocks, pp * vp, recompute),
                                                           EVERY_KTH_LAYER.get(rec_name, 1)))
    except (PlanError, ValueError) as err:
        return skip(f"plan rejected: {str(err).split(';')[0]}")
    stated = inter_node_override(r["interconnect"], gpn)
    if "attention_kernel" in d:  # the source states a kernel other than its stack's
        stated["efficiency.attention_kernel"] = d["attention_kernel"]
    if moe and "ep_a2a_overlap_on" in d:  # the source's recipe says whether the all-to-alls overlap
        on = any(name in preset and hw == gpu for name, gpu in d["ep_a2a_overlap_on"])
        stated["efficiency.ep_a2a_overlap"] = 1.0 if on else 0.0
    if moe and any(name in run.lower() for name in d.get("ep_dedup_models", ())):
        stated["efficiency.ep_dispatcher"] = "node_dedup"
    return Mapped(source, run, plan, args, dtype, hw, nodes, measured, stated, choose, stack=SOURCE_STACKS[source])


def front_filled_stages(dense_layers: int, blocks: int, chunks: int, recompute: str) -> tuple:
    """The front-filled layout of Megatron-Bridge's DeepSeek-V3 and Kimi K2 recipes over `chunks`
    model chunks: each takes ceil(layers / chunks) decoder layers in order, the last what
    remains. The `dense_layers` sit on the first chunk (before the repeated `blocks`), so it
    takes that many fewer blocks. Where that leaves the first or the last chunk without a block,
    the even split."""
    per_chunk = -(-(dense_layers + blocks) // chunks)
    first, last = per_chunk - dense_layers, blocks - (per_chunk - dense_layers) - per_chunk * (chunks - 2)
    if chunks < 2 or first < 1 or last < 1:
        return even_stages(blocks, chunks, recompute)
    sizes = [first] + [per_chunk] * (chunks - 2) + [last]
    ends = [sum(sizes[: i + 1]) for i in range(chunks)]
    return tuple(Stage(end - size, end, recompute) for size, end in zip(sizes, ends, strict=True))


def _every_kth(stages: tuple, k: int) -> tuple:
    """Each stage with every k-th of its blocks recomputed (k = 1: as given)."""
    if k == 1:
        return stages
    return tuple(dataclasses.replace(st, recompute_blocks=st.num_blocks // k) for st in stages)


def map_rows(source: str, rows: Iterable[dict], layout: dict | None = None) -> list[Row]:
    return [map_modern_row(source, r, layout) for r in per_run(rows)]


def megatron_bridge(folder: Path) -> list[Row]:
    name = "megatron_bridge_perf_summary.csv"
    return map_rows(name, read_rows(folder, name))


def nemo_2407(folder: Path) -> list[Row]:
    name = "nemo_perf_summary_2407_h100.csv"
    return map_rows(name, read_rows(folder, name))


def llm_foundry(folder: Path) -> list[Row]:
    name = "llm_foundry_mpt_a100.csv"
    d = FRAMEWORK_DEFAULTS[name]
    layout = {k: d[k] for k in ("mlp", "norm", "learned_positions", "loss")}
    return map_rows(name, read_rows(folder, name), layout)


def torchtitan(folder: Path) -> list[Row]:
    name = "torchtitan_docs_performance_2024.csv"
    d = FRAMEWORK_DEFAULTS[name]
    layout = {k: d[k] for k in ("mlp", "norm", "learned_positions")}
    return map_rows(name, read_rows(folder, name), layout)


# One short name per source, in report order.
SOURCES: dict[str, Callable[[Path], list[Row]]] = {
    "vtrain_multi": vtrain_multi,
    "vtrain_single": vtrain_single,
    "sc21_table1": sc21_table1,
    "sc21_table2": sc21_table2,
    "megatron_bridge": megatron_bridge,
    "nemo_2407": nemo_2407,
    "llm_foundry": llm_foundry,
    "torchtitan": torchtitan,
}
