"""The Cluster contract: one hardware profile (a node type) times a node count.

Every number carries its unit in its name. Profiles live in `profiles/*.toml`; the keys a
script may set with `--hw-set key=value` are the dotted paths of the fields below
(`gpu.peak_tflops.bf16`, `inter_node.bandwidth_gbps`, ...).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field

from .paths import did_you_mean

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


class HardwareProfileError(ValueError):
    """A hardware profile or override the user gave is wrong; the message says how to fix it."""


@dataclass(frozen=True)
class PeakTflops:
    """Dense peak TFLOP/s per GPU by dtype (datasheet, no sparsity). 0 means unsupported."""

    bf16: float
    fp16: float
    tf32: float
    fp32: float
    fp8: float = 0.0

    def for_dtype(self, dtype: str) -> float:
        if dtype not in DTYPES:
            raise HardwareProfileError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
        value = getattr(self, dtype)
        if value <= 0:
            raise HardwareProfileError(
                f"this GPU has no {dtype} peak in its profile; pick another dtype or set "
                f"--hw-set gpu.peak_tflops.{dtype}=VALUE"
            )
        return value


ATTENTION_KERNELS = ("flash1", "flash2", "cudnn")
ZERO_COLLECTIVES = ("per_nic", "ring")  # Efficiency.zero_collectives
ZERO_GRANULARITIES = ("bucket", "block")  # Efficiency.zero_granularity
GRAD_REDUCE_DTYPES = ("weights", "fp32")  # Efficiency.grad_reduce_dtype
EP_DISPATCHERS = ("all_to_all", "node_dedup")  # Efficiency.ep_dispatcher
CP_COMMS = ("all_gather", "p2p")  # Efficiency.cp_comm
PP_SENDS = ("full", "tp_slice")  # Efficiency.pp_send
SP_SAVED_INPUTS = ("shard", "gathered")  # Efficiency.sp_saved_input
CROSS_ENTROPIES = ("in_place", "traced")  # Efficiency.cross_entropy
# Efficiency key -> the values it may take (checked by `_validate`).
CHOICE_KEYS = {"zero_granularity": ZERO_GRANULARITIES, "zero_collectives": ZERO_COLLECTIVES,
               "grad_reduce_dtype": GRAD_REDUCE_DTYPES, "cp_comm": CP_COMMS, "pp_send": PP_SENDS,
               "cross_entropy": CROSS_ENTROPIES, "sp_saved_input": SP_SAVED_INPUTS, "ep_dispatcher": EP_DISPATCHERS,
               "attention_kernel": ATTENTION_KERNELS}


@dataclass(frozen=True)
class AttentionKernels:
    """Fraction of the dense bf16 peak that each fused attention kernel sustains on this GPU,
    forward + backward at head dim 128 and long sequences (hwprofiles.perf.flash_attention_time_s
    scales it by head dim and sequence). Published kernel benchmarks, not fitted; defaults are
    the A100 figures (FlashAttention-2, Dao 2023, Fig. 4: ~200 of 312 TFLOP/s fwd+bwd, hdim 128).
    """

    # FlashAttention-1 and the 2022 Triton flash kernel: "25-40% of the theoretical maximum" on
    # A100 (Dao 2023, FlashAttention-2, abstract)
    flash1: float = 0.38
    flash2: float = 0.63  # FlashAttention-2 (torch SDPA's flash backend, flash-attn 2.x)
    cudnn: float = 0.63  # cuDNN fused attention (Transformer Engine, SDPA's cuDNN backend); FA3-class on Hopper


# `smplan hw probe` names a profile's gpu after torch's device: "cpu" on a machine without a GPU,
# where smplan execute and calibrate run in fp32 (planner.feasibility.default_dtype).
PROBED_CPU_NAME = "cpu"
PROBED_NAMES = (PROBED_CPU_NAME, "cuda")  # what it writes on a CPU and on a GPU (probe.py _device_and_sync)
# A100 SXM's measured matmul ceiling (below): the GPU efficiency.matmul_max was fitted on.
REFERENCE_MATMUL_CEILING = 0.869


@dataclass(frozen=True)
class MatmulCeiling:
    """Measured maximum achievable matmul throughput over the dense datasheet peak, per input
    dtype: the best of a brute-force search over shapes, mean of 100 torch.matmul runs (Bekman,
    ml-engineering, "Maximum Achievable Matmul FLOPS comparison table"). The share of it reached
    in training is one global factor, efficiency.matmul_max, fitted on A100; a GPU whose ceiling
    is lower or higher runs its GEMMs at matmul_max x ceiling / REFERENCE_MATMUL_CEILING
    (hwprofiles.perf.matmul_efficiency). Defaults: A100's figure, for GPUs not measured there.
    """

    bf16: float = REFERENCE_MATMUL_CEILING  # A100 SXM: 271.2 of 312 TFLOP/s (also fp16, tf32, fp32 GEMMs)
    fp8: float = 0.0  # 0: not measured, the bf16 figure stands in (A100 has no fp8)

    def for_dtype(self, dtype: str) -> float:
        return (self.fp8 or self.bf16) if dtype == "fp8" else self.bf16


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    memory_bandwidth_gbps: float  # GB/s (HBM), datasheet
    peak_tflops: PeakTflops
    attention: AttentionKernels = field(default_factory=AttentionKernels)
    matmul_ceiling: MatmulCeiling = field(default_factory=MatmulCeiling)
    # Tensor cores that take block-scaled FP8 (MXFP8, OCP microscaling) natively at the FP8 rate:
    # Blackwell (NVIDIA Blackwell architecture technical brief, 5th-generation Tensor Cores).
    block_scaled_fp8: bool = False
    # Streaming multiprocessors (AMD: compute units), datasheet; 0 = not stated. Only the opt-in
    # wave quantisation of GEMMs reads it (efficiency.gemm_tile, hwprofiles.perf.wave_efficiency).
    sm_count: int = 0


@dataclass(frozen=True)
class Link:
    """One direction of one GPU's share of a link class (NVLink domain, or the node's NICs)."""

    bandwidth_gbps: float  # GB/s per GPU per direction
    latency_us: float


# How the GPUs of one fast domain reach each other (`intra_node.fabric`):
#  "switch": through a switch (NVSwitch, NVL72's NVLink switch trays) at the GPU's whole
#            bandwidth, whatever the group's size;
#  "mesh":   a direct link to each other GPU of the node, bandwidth_gbps being their sum (AMD
#            MI300X: 7 Infinity Fabric links of 64 GB/s; MI300X datasheet), so a group of k of
#            them uses k - 1 links and a point-to-point send one;
#  "pcie":   PCIe through the host's switches, no NVLink: Transformer Engine's userbuffers, which
#            hide the TP collectives under the GEMMs, need CUDA multicast or IPC over NVLink
#            (TransformerEngine issue #1071), so `efficiency.tp_comm_overlap` does not apply.
FABRICS = ("switch", "mesh", "pcie")


@dataclass(frozen=True)
class IntraLink(Link):
    """A GPU's share of its fast domain's links (`[intra_node]`), and how they connect."""

    fabric: str = "switch"


@dataclass(frozen=True)
class Reliability:
    gpu_mtbf_hours: float  # mean time between failures of one GPU (with its share of the node)
    restart_minutes: float  # detection + rescheduling + restart until training resumes


@dataclass(frozen=True)
class Cost:
    usd_per_gpu_hour: float
    source: str = ""


@dataclass(frozen=True)
class Storage:
    """Where checkpoints go: each node's write bandwidth to the shared file system, and the file
    system's own ceiling, which many nodes writing at once reach."""

    checkpoint_write_gbps: float = 5.0  # GB/s per node; typical parallel FS client (assumption)
    # GB/s for the whole job: Meta's Tectonic sustains 2 TB/s (peak 7) for Llama 3's 16k-GPU
    # runs (Llama 3 paper, 2024, section 3.3.1 "Storage"); a large training cluster's file system.
    filesystem_write_gbps: float = 2000.0


@dataclass(frozen=True)
class Efficiency:
    """The few global efficiency factors of the performance model (calibrated, not per run).

    Defaults were fitted once to published Megatron-LM and vTrain A100 runs (docs/DESIGN.md, Validation).
    The keys that belong to the training framework (hwprofiles.stack.STACK_KEYS: host overheads,
    element-wise fusion, attention kernel, ZeRO-3 gather cap, single_nic_network, zero_collectives, zero_granularity,
    tp_comm_overlap, ep_a2a_overlap, ep_dispatcher, cp_comm, grad_reduce_dtype, pp_send,
    sp_saved_input, cross_entropy) are set by the
    software stack (`--stack`) when a cluster is loaded; the defaults here apply without one.
    """

    # Fitted together (one set, no per-row terms) by `benchmarks/plan_vs_vtrain.py --fit`:
    # coordinate search on the mean MAPE of vtrain_multi_node (41 rows), 240 sampled
    # vtrain_single_node rows, megatron_sc21_table1 (10 rows) and the six ZeRO-3 rows of
    # megatron_sc21_table2, all A100 SXM with Megatron's fused kernels (fit values in brackets).
    # Since SC21 runs as its authors' scripts set it (micro-batch, interleaving, DDP), the same
    # fit reaches 7.12% mean MAPE (matmul_max 0.659, half_dim 124, network 0.89) against 7.30% at
    # these values: kept, within the fit's noise.
    matmul_max: float = 0.65  # best achievable fraction of peak for large GEMMs [0.646]
    matmul_half_dim: float = 80.0  # smallest GEMM dimension at which efficiency is half of max [80]
    memory_bound: float = 0.95  # achievable fraction of HBM bandwidth for element-wise kernels [0.95]
    network: float = 0.85  # achievable fraction of link bandwidth for large collectives [0.851]
    host_overhead_us_per_layer: float = 1075.0  # CPU launch time per layer pass; overlaps GPU work [1075]
    # Extra CPU time of a routed-expert (MoE) layer pass over a dense layer's: the router, token
    # permutation, the dispatcher's host sync for the split sizes, the grouped expert GEMMs'
    # launches. Set by the stack (megatron-core's is measured); 0 when none states it.
    host_overhead_us_per_moe_layer: float = 0.0
    memory_reserve_gib: float = 2.0  # CUDA context, allocator fragmentation, NCCL buffers (chosen; not measured here)
    # Share of the fusible element-wise traffic (ModelProfile: intermediates of element-wise
    # chains) that the training framework's kernels keep on chip: 0 for eager PyTorch, 1 for
    # a fully fusing compiler. Megatron-LM's hand-fused kernels (scale-mask-softmax,
    # bias-GeLU, bias-dropout-add) sit between; the default is fitted to its runs.
    elementwise_fusion: float = 1.0  # [1.0]
    # Collectives issued layer by layer (the planner uses them for ZeRO-2/3's gathers and
    # reduce-scatters) reach this fraction of ONE GPU's NIC across nodes, not the multi-rail
    # rate of a bucketed all-reduce: Megatron-LM SC21 Table 2's ZeRO-3 rows (175B/530B,
    # 384-2240 A100s) move ~1050 GB per GPU per step in 66.75 s with 8 or 4 group members per
    # node alike -> 15.7 / 25 GB/s = 0.63 by hand. `plan_vs_vtrain.py --fit` fits it with the
    # others (those rows are its fourth set).
    single_nic_network: float = 0.66  # [0.661]
    # How ZeRO-2/3 / FSDP's per-micro-batch gathers and reduce-scatters use the network across
    # nodes: "per_nic" (each GPU's own NIC at single_nic_network: DeepSpeed's many small
    # per-module collectives, the SC21 fit above) or "ring" (NCCL's multi-rail ring of a large
    # collective, as a bucketed all-reduce: FSDP's one flat parameter per block).
    zero_collectives: str = "per_nic"
    # What one ZeRO-1/2 step collective covers: "bucket" (Megatron's distributed optimizer and
    # DeepSpeed reduce-scatter and gather the step's gradients and parameters in large buckets:
    # one latency for all blocks) or "block" (FSDP / FSDP2 shard each wrapped block on its own:
    # one collective, and one latency, per block, which on a CPU's gloo is milliseconds each;
    # under tp or pp smplan execute's plain DP is FSDP2's replicate per block too).
    zero_granularity: str = "bucket"
    # Which fused attention kernel the software stack runs for SDPA-style attention (a key of
    # Gpu.attention): "flash1" (flash-attn 1, Triton flash), "flash2" (torch SDPA, flash-attn 2)
    # or "cudnn" (Transformer Engine).
    attention_kernel: str = "flash2"
    # ZeRO-3 parameters gathered at once, at most (0: no cap). FSDP gathers whole wrapped units
    # (the one in use, a block or the embedding or head, and the next block prefetched); DeepSpeed gathers module by module and keeps at
    # most `stage3_max_live_parameters` (1e9 by default, DeepSpeed config docs) of them.
    zero3_max_live_params: float = 0.0
    # Share of each MoE block's expert all-to-alls that runs hidden behind the compute of the
    # micro-batch paired with it (Megatron-Core's EP A2A overlap, `overlap_moe_expert_parallel_comm`:
    # the forward of one micro-batch and the backward of another run together, each one's
    # dispatch/combine on a second stream under the other's GEMMs). 0: every all-to-all waits.
    ep_a2a_overlap: float = 0.0
    # How the expert dispatch / combine crosses nodes: "all_to_all" (NCCL all-to-all: every
    # (token, expert) copy on another node crosses the network) or "node_dedup" (DeepEP /
    # HybridEP: a token crosses once to each node that holds one of its experts, to the GPU of
    # the same local index, and is forwarded to the others over NVLink; DeepSeek-V3 report,
    # Liu et al. 2024, section 3.2.2; DeepEP README, "normal kernels").
    ep_dispatcher: str = "all_to_all"
    # How context parallelism moves K/V: "all_gather" (an NCCL all-gather forward and a
    # reduce-scatter of their gradients backward, on the multi-rail rings: torchtitan's default
    # rotate method, Llama 3's CP and smplan execute's) or "p2p" (Transformer Engine's ring,
    # Megatron-Core's cp_comm_type default: cp-1 send/recv steps, one NIC a step across nodes,
    # and backward K/V with their gradients, twice the bytes; TE AttnFuncWithCPAndKVP2P).
    cp_comm: str = "all_gather"
    # What one tp rank sends to the next pipeline stage without sequence parallelism: "full"
    # (its whole replicated activation, s x b x h: Megatron-Core's p2p_communication, torch
    # pipelining under DTensor TP) or "tp_slice" (1/tp of it, all-gathered over NVLink on
    # arrival: 2021 Megatron-LM's scatter_gather_tensors_in_pipeline, Narayanan et al. 2021,
    # section 4.1). Under sequence parallelism the activation is already 1/tp a rank.
    pp_send: str = "full"
    # What sequence parallelism keeps for backward of the input a column-parallel linear gathers
    # to full length (the norms' outputs): "shard" (its local slice, all-gathered again in
    # backward: Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication, Korthikanti et al.
    # 2022, section 4.2.2) or "gathered" (the whole tensor, as autograd saves a DTensor
    # redistribute's output: torchtitan, smplan execute).
    sp_saved_input: str = "shard"
    # How the loss's memory peaks on the last stage: "in_place" (Megatron's vocab-parallel
    # cross-entropy: one fp32 copy of the logits that becomes the softmax and then, in place, the
    # gradient: 3x the bf16 logits' bytes at the peak; Megatron-Core tensor_parallel/cross_entropy.py)
    # or "traced" (the model file's loss as it runs: its measured peak, ModelProfile's loss part).
    cross_entropy: str = "in_place"
    # Share of the sequence-parallel TP all-gathers / reduce-scatters hidden under the linear
    # GEMMs they feed or follow (Transformer Engine userbuffers, `tp_comm_overlap`). 0: each waits.
    tp_comm_overlap: float = 0.0
    # The dtype gradients are reduced in across data-parallel ranks (the DP all-reduce, ZeRO's and
    # FSDP's reduce-scatters): "weights" (the weights' dtype: bf16/fp16 under mixed precision) or
    # "fp32" (torchtitan's `mixed_precision_reduce` default; Megatron-LM's for bf16 unless
    # --grad-reduce-in-bf16). Below ZeRO-3 the memory model then holds the gradients in fp32
    # (Megatron's main-grad buffer: 18 B per parameter unsharded, 6 + 12/d with its distributed
    # optimizer); ZeRO-3 / FSDP2 stays at 16/d (planner/memory_model.py).
    grad_reduce_dtype: str = "weights"
    # Output tile edge of the GEMM kernels, for wave quantisation over gpu.sm_count: a GEMM of
    # ceil(m / tile) x ceil(n / tile) tiles runs in whole waves of one tile per SM. 0 = off, the
    # default: with 128 (CUTLASS's 128x128 threadblock tile) the validation sources' held-out
    # error moves by -0.6..+1.4 points, no better overall (README, "How accurate it is"), as
    # cuBLAS picks among tile shapes and splits K where a wave would run part-empty.
    gemm_tile: int = 0


@dataclass(frozen=True)
class Cluster:
    name: str
    description: str
    nodes: int
    gpus_per_node: int
    gpu: Gpu
    intra_node: IntraLink
    inter_node: Link
    reliability: Reliability
    cost: Cost
    storage: Storage = field(default_factory=Storage)
    efficiency: Efficiency = field(default_factory=Efficiency)
    # GPUs that share one NVLink domain (intra_node links), when it spans several nodes:
    # a GB200/GB300 NVL72 rack is 18 trays of 4 GPUs on one NVLink switch fabric (NVIDIA
    # GB200 NVL72 datasheet). 0: the domain is one node.
    nvlink_domain_gpus: int = 0

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def fast_domain_gpus(self) -> int:
        """Consecutive ranks that reach each other over `intra_node` links (NVLink domain)."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    def with_nodes(self, nodes: int) -> Cluster:
        return self.with_overrides({"nodes": nodes})

    def get(self, key: str):
        """Value at a dotted key, e.g. `cluster.get("gpu.peak_tflops.bf16")`."""
        obj = self
        for part in key.split("."):
            if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
                raise HardwareProfileError(unknown_key_message(key))
            obj = getattr(obj, part)
        return obj

    def with_overrides(self, overrides: dict[str, object]) -> Cluster:
        """A copy with dotted keys replaced; values are checked against the field's type."""
        data = to_dict(self)
        for key, value in overrides.items():
            _set_dotted(data, key, value)
        return from_dict(data)

    def to_dict(self) -> dict:
        return to_dict(self)


def to_dict(cluster: Cluster) -> dict:
    return dataclasses.asdict(cluster)


def settable_keys() -> list[str]:
    """Every dotted key of a Cluster whose value is a number or a string."""
    keys: list[str] = []

    def walk(cls, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            typ = _field_type(cls, f.name)
            if dataclasses.is_dataclass(typ):
                walk(typ, prefix + f.name + ".")
            else:
                keys.append(prefix + f.name)

    walk(Cluster, "")
    return keys


def unknown_key_message(key: str, where: str = "") -> str:
    """One line for a dotted key no Cluster has: the nearest key when one is close (a typo),
    else every key."""
    near = difflib.get_close_matches(key, settable_keys(), n=1)
    hint = f"did you mean {near[0]!r}?" if near else f"valid keys: {', '.join(settable_keys())}"
    return f"unknown hardware key {key!r}{where}; {hint} (smplan hw show a100x8 shows them with values)"


def from_dict(data: dict, source: str = "hardware profile") -> Cluster:
    """Build a Cluster from nested dicts (parsed TOML), with one clear error per problem."""
    return _build(Cluster, data, "", source)


_NESTED_TYPES = {
    "PeakTflops": PeakTflops,
    "AttentionKernels": AttentionKernels,
    "MatmulCeiling": MatmulCeiling,
    "Gpu": Gpu,
    "Link": Link,
    "IntraLink": IntraLink,
    "Reliability": Reliability,
    "Cost": Cost,
    "Storage": Storage,
    "Efficiency": Efficiency,
    "Cluster": Cluster,
}
_SCALAR_TYPES = {"str": str, "int": int, "float": float, "bool": bool}


def _field_type(cls, name: str):
    annotation = {f.name: f.type for f in dataclasses.fields(cls)}[name]
    annotation = annotation if isinstance(annotation, str) else annotation.__name__
    return _NESTED_TYPES.get(annotation) or _SCALAR_TYPES[annotation]


def _build(cls, data, prefix: str, source: str):
    if not isinstance(data, dict):
        raise HardwareProfileError(f"{source}: [{prefix.rstrip('.')}] must be a table of keys")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        near = did_you_mean(prefix + unknown[0], [prefix + k for k in sorted(known)])
        raise HardwareProfileError(
            f"{source}: unknown key {prefix + unknown[0]!r}{near}; known keys here: "
            f"{', '.join(prefix + k for k in sorted(known))}"
        )
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        typ = _field_type(cls, f.name)
        if f.name not in data:
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if has_default:
                continue
            absent = " (0.0 for a GPU without that dtype)" if prefix.endswith("peak_tflops.") else ""
            if key == "intra_node" and data.get("gpus_per_node") == 1:  # no GPU shares a node: say why it is asked
                absent = " (with one GPU per node it is only used if --hw-set gpus_per_node raises that)"
            raise HardwareProfileError(f"{source}: missing key {key!r}; add it{absent}, as `smplan hw show a100x8` "
                                       "shows a bundled profile's")
        value = data[f.name]
        if dataclasses.is_dataclass(typ):
            kwargs[f.name] = _build(typ, value, key + ".", source)
        else:
            kwargs[f.name] = _coerce(value, typ, key, source)
    try:
        return cls(**kwargs)
    except HardwareProfileError as err:
        raise HardwareProfileError(f"{source}: {err}") from None


# Far beyond any real hardware value but 0 (bundled ones: from latencies of a few us and
# efficiencies near 1 to 50,000 h of GPU MTBF): keeps every float() and every product or
# quotient of profile values finite and non-zero.
MAX_NUMBER = 1e15
MIN_NUMBER = 1e-9


def _coerce(value, typ, key: str, source: str):
    if typ is bool:
        if not isinstance(value, bool):
            raise HardwareProfileError(f"{source}: {key!r} must be true or false, got {_shown(value)}")
        return value
    if typ is str:
        if not isinstance(value, str):
            raise HardwareProfileError(f"{source}: {key!r} must be text, got {_shown(value)}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HardwareProfileError(
            f"{source}: {key!r} must be a number ({_unit_hint(key)}), got {_shown(value)}"
        )
    # `not <=` is True for NaN too; a huge int compares exactly, without float()
    if not abs(value) <= MAX_NUMBER or 0 < abs(value) < MIN_NUMBER:
        raise HardwareProfileError(
            f"{source}: {key!r} must be a finite number of at most {MAX_NUMBER:g} in size, and at least "
            f"{MIN_NUMBER:g} unless 0 ({_unit_hint(key)}), got {_shown(value)}"
            + (f"; {unit_fix(key)}" if abs(value) > MAX_NUMBER and unit_fix(key) else "")
        )
    if typ is int:
        if float(value) != int(value):
            raise HardwareProfileError(f"{source}: {key!r} must be a whole number, got {value!r}")
        return int(value)
    return float(value)


def _shown(value) -> str:
    """A value for a one-line message: repr, cut to 40 characters."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**40 else f"a {value.bit_length()}-bit number"
    return text if len(text) <= 40 else text[:37] + "..."


def _unit_hint(key: str) -> str:
    for suffix, unit in (
        ("_gbps", "GB/s"),
        ("_us", "microseconds"),
        ("_gib", "GiB"),
        ("_hours", "hours"),
        ("_minutes", "minutes"),
        ("usd_per_gpu_hour", "US dollars per GPU-hour"),
    ):
        if key.endswith(suffix):
            return unit
    if ".peak_tflops." in key:
        return "TFLOP/s"
    return "a plain number"


def unit_fix(key: str) -> str:
    """How to convert a figure for `key` typed in the usual larger unit (FLOP/s for TFLOP/s,
    bytes for GiB, bit/s for GB/s), or '': the refusal above and hwprofiles.plausible say it alike."""
    if ".peak_tflops." in key:
        return "divide a FLOP/s figure by 1e12"
    if key.endswith("_gib"):
        return "divide a byte count by 2**30 (1073741824)"
    if key.endswith("_gbps"):
        return "divide a bit/s figure by 8e9"
    return ""


def _set_dotted(data: dict, key: str, value) -> None:
    if key not in settable_keys():
        raise HardwareProfileError(unknown_key_message(key, " in --hw-set"))
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value


def _validate(c: Cluster) -> None:
    """Reject physically meaningless profiles: the message names the key and the fix."""

    def positive(key: str, value: float) -> None:
        if not value > 0:
            raise HardwareProfileError(f"{key} must be greater than 0, got {value}; fix the profile or --hw-set")

    def non_negative(key: str, value: float) -> None:
        if value < 0:
            raise HardwareProfileError(f"{key} must not be negative, got {value}; fix the profile or --hw-set")

    positive("nodes", c.nodes)
    positive("gpus_per_node", c.gpus_per_node)
    non_negative("nvlink_domain_gpus", c.nvlink_domain_gpus)
    if c.nvlink_domain_gpus and c.nvlink_domain_gpus % c.gpus_per_node:
        raise HardwareProfileError(
            f"nvlink_domain_gpus={c.nvlink_domain_gpus} must be a multiple of gpus_per_node={c.gpus_per_node} "
            "(an NVLink domain holds whole nodes); fix the profile or --hw-set")
    positive("gpu.memory_gib", c.gpu.memory_gib)
    positive("gpu.memory_bandwidth_gbps", c.gpu.memory_bandwidth_gbps)
    for dtype in DTYPES:
        non_negative(f"gpu.peak_tflops.{dtype}", getattr(c.gpu.peak_tflops, dtype))
    positive("gpu.peak_tflops.fp32", c.gpu.peak_tflops.fp32)
    for link in ("intra_node", "inter_node"):
        positive(f"{link}.bandwidth_gbps", getattr(c, link).bandwidth_gbps)
        non_negative(f"{link}.latency_us", getattr(c, link).latency_us)
    if c.intra_node.fabric not in FABRICS:
        raise HardwareProfileError(
            f"intra_node.fabric must be one of {', '.join(FABRICS)}, got {c.intra_node.fabric!r}")
    if c.intra_node.fabric != "switch" and c.nvlink_domain_gpus:
        raise HardwareProfileError(  # NVL72's 72 GPUs meet on NVLink switch trays: a mesh or PCIe spans one node
            f"intra_node.fabric={c.intra_node.fabric} spans one node, but nvlink_domain_gpus={c.nvlink_domain_gpus} "
            "makes a switched NVLink domain across nodes; use fabric=switch or nvlink_domain_gpus=0")
    positive("reliability.gpu_mtbf_hours", c.reliability.gpu_mtbf_hours)
    non_negative("reliability.restart_minutes", c.reliability.restart_minutes)
    non_negative("cost.usd_per_gpu_hour", c.cost.usd_per_gpu_hour)
    positive("storage.checkpoint_write_gbps", c.storage.checkpoint_write_gbps)
    positive("storage.filesystem_write_gbps", c.storage.filesystem_write_gbps)
    e = c.efficiency
    for key in ("matmul_max", "memory_bound", "network", "single_nic_network"):
        value = getattr(e, key)
        if not 0 < value <= 1:
            raise HardwareProfileError(f"efficiency.{key} must be in (0, 1], got {value}")
    if not 0 <= e.elementwise_fusion <= 1:
        raise HardwareProfileError(f"efficiency.elementwise_fusion must be in [0, 1], got {e.elementwise_fusion}")
    non_negative("efficiency.matmul_half_dim", e.matmul_half_dim)
    non_negative("efficiency.host_overhead_us_per_layer", e.host_overhead_us_per_layer)
    non_negative("efficiency.host_overhead_us_per_moe_layer", e.host_overhead_us_per_moe_layer)
    non_negative("efficiency.memory_reserve_gib", e.memory_reserve_gib)
    non_negative("efficiency.zero3_max_live_params", e.zero3_max_live_params)
    non_negative("efficiency.gemm_tile", e.gemm_tile)
    non_negative("gpu.sm_count", c.gpu.sm_count)
    for key in ("tp_comm_overlap", "ep_a2a_overlap"):  # shares of a collective hidden under compute
        if not 0.0 <= getattr(e, key) <= 1.0:
            raise HardwareProfileError(f"efficiency.{key} must be in [0, 1], got {getattr(e, key)}")
    for dtype in ("bf16", "fp8"):
        value = getattr(c.gpu.matmul_ceiling, dtype)
        if not (0 < value <= 1 or (dtype == "fp8" and value == 0)):
            allowed = "(0, 1], or 0 for bf16's figure" if dtype == "fp8" else "(0, 1]"
            raise HardwareProfileError(f"gpu.matmul_ceiling.{dtype} must be in {allowed}, got {value}")
    for kernel in ATTENTION_KERNELS:
        value = getattr(c.gpu.attention, kernel)
        if not 0 < value <= 1:
            raise HardwareProfileError(f"gpu.attention.{kernel} must be in (0, 1], got {value}")
    for key, choices in CHOICE_KEYS.items():  # the efficiency keys that name one of a few ways
        if getattr(e, key) not in choices:
            raise HardwareProfileError(f"efficiency.{key} must be one of {', '.join(choices)}, got {getattr(e, key)!r}")
