"""Watching one forward pass on the meta device: what each part computes, saves and moves.

Three interception layers, each doing one job:
- `GPUKernels` (a TorchFunctionMode) runs dropout and scaled-dot-product attention the way
  they run on a GPU. On CPU/meta, `F.dropout` is `input * bernoulli_noise` (it saves a
  noise tensor of the input dtype, 2 bytes/element in bf16) and SDPA falls back to the
  math kernel, which upcasts to fp32 and materialises the s x s scores. On CUDA, dropout is
  the fused `native_dropout` (a bool mask, 1 byte/element) and SDPA is flash attention
  (saves q, k, v, output and the log-sum-exp; no s^2 term), grouped-query attention
  (`enable_gqa=True`) included. RMSNorm (`F.rms_norm`) dispatches to `aten._fused_rms_norm`,
  which on CPU/meta is the composite (it saves an fp32 copy of the input and the fp32
  normalised product: 8 bytes per element in bf16) and on CUDA one kernel that saves the
  input and the per-row rstd (torch's derivatives.yaml: `_fused_rms_norm_backward(grad,
  input, normalized_shape, rstd, weight)`; 2 bytes per element). We profile the GPU's behaviour.
- `Tracer` (a TorchDispatchMode) sees every aten op: FLOPs from torch.utils.flop_counter's
  registry, GEMM shapes, HBM bytes of the other ops, and the "tp-sharded" tag, which
  flows from the outputs of ColwiseParallel modules through every op that reads a tagged
  tensor until a RowwiseParallel module's output (where Megatron's all-reduce happens).
- `saved_tensors_hooks` see what autograd keeps for backward; `Tracer.pack` files each
  tensor under one part and one of three categories, once per storage, parameters excluded.
  "attention_core" is decided by where a tensor comes from, not by its shape: the s x s
  output of a batched GEMM (q k^T) and every element-wise result of it (scale, mask,
  softmax, dropout) -- so a model whose hidden width equals its seq_len does not file its
  [s, h] activations there.
- Op-level selective checkpointing (`sac`, torchtitan's policy, `SAC_SAVE_OPS`): what it
  would keep of each part (the outputs of every other linear GEMM, of the attention kernels
  and of the part's input) and the GEMMs it would re-run (`PartStats.sac_*`).
- Fusion: the same dataflow says which element-wise traffic a fusing compiler (Megatron's
  fused kernels, XLA, TorchInductor) keeps on chip: a tensor made by an element-wise op and
  read only by element-wise ops of the same part, neither saved for backward nor the part's
  output, is never written to HBM, and element-wise reads of such intermediates are free.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from .model_profile import TPCollective

aten = torch.ops.aten

_MATMULS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm}
_ATTENTION = {
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_cudnn_attention,
    aten._scaled_dot_product_flash_attention_for_cpu,
}
# torch._grouped_mm (transformers >= 5's "grouped_mm" MoE experts): rows sorted by expert,
# [tokens x top_k, k] x [experts, k, n]; torch's flop_counter has no entry for it.
_GROUPED_MM = {aten._grouped_mm} if hasattr(aten, "_grouped_mm") else set()
_GEMM_LIKE = _MATMULS | _ATTENTION | _GROUPED_MM | {aten.convolution, aten._scaled_mm}
# Ops that move no data: allocation without initialisation and metadata-only reshapes that
# the schema does not mark as views.
_NO_TRAFFIC = {
    aten._unsafe_view, aten.detach, aten.alias, aten.lift_fresh, aten.empty, aten.empty_like,
    aten.empty_strided, aten.new_empty, aten.new_empty_strided, aten.scalar_tensor,
    aten._local_scalar_dense,
}
# torchtitan's op-level selective activation checkpointing (`selective_ac_option = "op"`,
# torchtitan/models/llama3/parallelize_llama.py `_save_list` and its `_custom_policy`): the
# outputs of these ops are saved, except every second matmul of a block, which is recomputed
# with the element-wise ops. torchtitan's Llama linears have no bias (aten.mm); a linear with
# a bias runs aten.addmm, which we count as a matmul too.
SAC_MATMULS = {aten.mm, aten.addmm}
SAC_SAVE_OPS = SAC_MATMULS | _ATTENTION | {aten.max}


@dataclass
class PartStats:
    """What one part (a non-repeated module, a block, the loss) did in the forward pass."""

    name: str
    kind: str  # "pre", "block", "post"
    flops: float = 0.0
    saved: dict[str, float] = field(default_factory=lambda: {"tp_sharded": 0.0, "replicated": 0.0, "attention_core": 0.0})
    saved_keys: set = field(default_factory=set)
    saved_categories: dict = field(default_factory=dict)  # storage -> (bytes, category) of what it saved
    input_bytes: float | None = None  # of the first call
    output_bytes: float = 0.0  # of the last call
    output_sharded: bool = False  # the last call's output is split over the tp ranks (tp-sharded tag)
    elementwise_bytes: float = 0.0
    elementwise_sharded_bytes: float = 0.0
    fusible_bytes: float = 0.0  # of elementwise_bytes: what vertical fusion keeps on chip
    matmuls: Counter = field(default_factory=Counter)  # (m, n, k, batch, tp_dim, kernel) -> count
    collectives: list[TPCollective] = field(default_factory=list)
    calls: int = 0
    kernels: int = 0  # GPU kernels its forward calls launch: GEMMs, fused attention, non-view element-wise ops
    # Mixture of experts: the routed expert bank's size and what its GEMMs and dispatch do.
    num_experts: int = 0
    top_k: int = 0
    expert_flops: float = 0.0  # GEMM FLOPs inside the expert bank
    dispatch_bytes: float = 0.0  # the expert bank's input: tokens * top_k * hidden * bytes
    router_flops: float = 0.0
    kv_bytes: float = 0.0  # K and V read by the attention kernels
    # heads tp must divide, from the part's first SDPA call (dim -3 of its 4-D query and key: N, H, L, E):
    # the key's, but the query's where one key head serves them all (MQA keeps it whole on every rank)
    kv_heads: int = 0
    saved_expert: float = 0.0  # of saved["replicated"]: what the expert bank's GEMMs keep
    # of saved["replicated"]: inputs of column-parallel modules, which sequence parallelism
    # gathers to full length there (`BlockProfile.saved_bytes_gathered_per_sample`)
    saved_gathered: float = 0.0
    # by category (`Tracer.finish_saved`): saved tensors only linear GEMMs keep (their input, which
    # FP8 training keeps as its FP8 cast), and element-wise outputs kept only by element-wise ops
    # whose inputs are kept too (a fused kernel recomputes them in backward)
    saved_fp8_input: dict[str, float] = field(default_factory=lambda: {"tp_sharded": 0.0, "replicated": 0.0})
    saved_fp8_shared: dict[str, float] = field(default_factory=lambda: {"tp_sharded": 0.0, "replicated": 0.0})
    saved_refusable: dict[str, float] = field(default_factory=lambda: {"tp_sharded": 0.0, "replicated": 0.0})
    # Op-level selective checkpointing (SAC_SAVE_OPS): bytes of the outputs it saves, by what
    # divides them ("unsplit": a row-parallel GEMM's partial sums, whole on every tp rank), the
    # GEMMs it re-runs ((m, n, k, batch, tp_dim, kernel) -> count) and the matmuls seen so far.
    sac_saved: dict[str, float] = field(default_factory=lambda: {"tp_sharded": 0.0, "replicated": 0.0, "unsplit": 0.0})
    sac_keys: set = field(default_factory=set)
    sac_matmuls: Counter = field(default_factory=Counter)
    sac_mm_count: int = 0


def storage_key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. nested)
        return id(t)


def tensor_bytes(obj) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(obj) if isinstance(t, torch.Tensor))


class Tracer(TorchDispatchMode):
    """Attributes every op and every saved tensor to `self.part` (None: ignore)."""

    def __init__(self, seq_len: int, excluded_storages: set[int]):
        super().__init__()
        self.seq_len = seq_len
        self.excluded = excluded_storages  # parameters and buffers: not activations
        # Storages whose memory the memory model counts elsewhere (the logits, in its loss
        # buffer): a part that saves them keeps no extra bytes. Saved-bytes only.
        self.counted_elsewhere: set[int] = set()
        self.part: PartStats | None = None
        self.sharded: set[int] = set()
        self.tp_stack: list[str] = []  # "col" / "row" of the enclosing tp_plan modules
        self.tp_called: set[str] = set()  # the tp_plan modules the forward called (by their plan names)
        self.col_inputs: set[int] = set()  # storages a column-parallel module took as its input
        # For `finish_saved`: how often each storage was saved for backward, how many linear GEMMs
        # took it as their input, and the inputs of the pointwise op that made it.
        self.save_counts: Counter = Counter()
        self.gemm_input_uses: Counter = Counter()
        self.pointwise_inputs: dict[int, tuple[int, ...]] = {}
        self.in_experts = 0  # > 0 inside a routed expert bank: its GEMMs are tagged "expert"
        self.in_router = 0  # > 0 inside a router
        self._alive: list = []  # keep storages alive so their keys are never reused
        # Fusion bookkeeping: element-wise outputs whose HBM write a fusing compiler might skip,
        # and the storages something outside an element-wise chain of their part needs.
        self.produced: dict[int, tuple[PartStats, int]] = {}
        self.needed: set[int] = set()
        # Storages of the attention scores (a batched GEMM's s x s output) and what element-wise
        # ops make of them: the "attention_core" category.
        self.core: set[int] = set()

    # -- the tp-sharded tag -------------------------------------------------------------
    def tag(self, obj, sharded: bool = True) -> None:
        for t in tree_leaves(obj):
            if isinstance(t, torch.Tensor):
                key = storage_key(t)
                if sharded:
                    self.sharded.add(key)
                    self._alive.append(t)
                else:
                    self.sharded.discard(key)

    def is_sharded(self, t: torch.Tensor) -> bool:
        return storage_key(t) in self.sharded

    def column_input(self, obj) -> None:
        """`obj` enters a column-parallel module: under sequence parallelism, the tensor gathered
        to full length there (the saved-bytes split `saved_gathered` reads it)."""
        for t in tree_leaves(obj):
            if isinstance(t, torch.Tensor):
                self.col_inputs.add(storage_key(t))
                self._alive.append(t)  # its key must not be reused by a later tensor

    # -- ops ------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # Every storage keyed below stays alive: a freed one's address (its key) would be
        # reused by a later tensor, which then inherits "needed" or "produced" by accident
        # (measured: the head's fusible bytes of mixtral_8x7b changed with import order).
        self._alive.extend(t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor))
        part = self.part
        if part is None:
            return out
        packet = func._overloadpacket
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        sharded = any(self.is_sharded(t) for t in inputs)
        if sharded:
            self.tag(out)
        if packet in flop_registry:
            flops = flop_registry[packet](*args, **kwargs, out_val=out)
        elif packet in _GROUPED_MM:
            flops = sum(2 * m * n * k * b for m, n, k, b in _gemm_shapes(packet, args, out))
        else:
            flops = 0
        if flops:
            part.flops += flops
            if self.in_experts and packet in _GEMM_LIKE:
                part.expert_flops += flops
            if self.in_router:
                part.router_flops += flops
        if packet is aten.bmm and self.seq_len and args[0].dim() == 3 and args[0].shape[-2:] == (self.seq_len,) * 2:
            # unfused attention's probs [., s, s] @ V: K is as large as V (what CP all-gathers)
            part.kv_bytes += 2 * tensor_bytes(args[1])
        self._track_core(packet, inputs, out)
        if packet in (aten.mm, aten.addmm) and not self.in_experts:  # a linear layer: (bias,) input, weight^T
            self.gemm_input_uses[storage_key(args[-2])] += 1
        made_of = tuple(storage_key(t) for t in inputs if storage_key(t) not in self.excluded)
        pointwise = torch.Tag.pointwise in func.tags
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                key = storage_key(t)
                if key in made_of and func._schema.is_mutable:  # written in place: no longer what made it
                    self.pointwise_inputs.pop(key, None)
                elif pointwise:
                    self.pointwise_inputs[key] = made_of
        sac_saved = self._sac(part, packet, out, sharded)
        if packet in _GEMM_LIKE or (not func.is_view and packet not in _NO_TRAFFIC):
            part.kernels += 1
        if packet in _GEMM_LIKE:
            kernel = _kernel(func, args, kwargs)
            for shape in _gemm_shapes(packet, args, out):
                part.matmuls[(*shape, self._tp_dim(packet, sharded), kernel)] += 1
                if not sac_saved:
                    part.sac_matmuls[(*shape, self._tp_dim(packet, sharded), kernel)] += 1
            self.needed.update(storage_key(t) for t in inputs)
        elif not func.is_view and packet not in _NO_TRAFFIC:
            moved = 0
            for t in inputs:
                key = storage_key(t)
                if key in self.excluded:
                    continue
                nbytes = t.numel() * t.element_size()
                moved += nbytes
                producer = self.produced.get(key)
                if producer is not None and producer[0] is part:
                    part.fusible_bytes += nbytes  # read from registers inside the fused kernel
                else:
                    self.needed.add(key)
            moved += tensor_bytes(out)
            part.elementwise_bytes += moved
            if sharded:
                part.elementwise_sharded_bytes += moved
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.produced[storage_key(t)] = (part, t.numel() * t.element_size())
                    self._alive.append(t)
        return out

    def _track_core(self, packet, inputs, out) -> None:
        """File the attention scores and everything element-wise made of them under the core."""
        s = self.seq_len
        if not s:
            return
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        scores = packet in (aten.bmm, aten.baddbmm) or any(storage_key(t) in self.core for t in inputs)
        if scores:
            for t in outs:
                if t.dim() >= 2 and t.shape[-2:] == (s, s):
                    self.core.add(storage_key(t))
                    self._alive.append(t)

    def _sac(self, part: PartStats, packet, out, sharded: bool) -> bool:
        """torchtitan's op-level SAC policy on this op: True (and its output bytes filed) when
        it would save the output; every second matmul of the part is recomputed instead."""
        if packet not in SAC_SAVE_OPS:
            return False
        if packet in SAC_MATMULS:
            part.sac_mm_count += 1
            if part.sac_mm_count % 2 == 0:
                return False
        style = self.tp_stack[-1] if self.tp_stack else None
        category = "unsplit" if style == "row" else "tp_sharded" if style == "col" or sharded else "replicated"
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and storage_key(t) not in part.sac_keys:
                part.sac_keys.add(storage_key(t))
                self._alive.append(t)
                part.sac_saved[category] += t.numel() * t.element_size()
        return True

    def keep(self, obj) -> None:
        """`obj` leaves its part (a part's output): its element-wise producer must write it."""
        self.needed.update(storage_key(t) for t in tree_leaves(obj) if isinstance(t, torch.Tensor))

    def finish_saved(self, parts) -> None:
        """File each part's saved bytes that FP8 or a fused kernel keeps otherwise (PartStats
        `saved_fp8_input`, `saved_refusable`); call once the forward has run. A tensor every save
        of which is a linear GEMM's (a norm's output before QKV, the SwiGLU product before the down
        projection) is kept as the GEMM's FP8 cast under FP8 (Transformer Engine's Linear saves its
        quantised input; torchao's Float8Linear too); one another op keeps too (the attention
        kernel's output, the projection's input) gets that cast beside it. A pointwise op's output that no GEMM keeps and
        whose inputs are kept (SwiGLU's silu(gate), kept for the product's backward) is recomputed
        from them by a fused kernel (Megatron-Core's fused bias_swiglu saves only its input;
        torch.compile's min-cut partitioner recomputes such ops)."""
        for part in parts:
            for key, (nbytes, category) in part.saved_categories.items():
                if category not in part.saved_fp8_input:
                    continue
                uses = self.gemm_input_uses[key]
                if uses and self.save_counts[key] <= uses:
                    part.saved_fp8_input[category] += nbytes
                elif uses:  # kept by another op too (attention's output): FP8 adds the GEMM's cast
                    part.saved_fp8_shared[category] += nbytes
                elif not uses and self.pointwise_inputs.get(key) and all(
                        k in self.save_counts for k in self.pointwise_inputs[key]):
                    part.saved_refusable[category] += nbytes

    def finish_fusion(self) -> None:
        """Credit each part with the element-wise writes nothing outside its chains needed."""
        for key, (part, nbytes) in self.produced.items():
            if key not in self.needed:
                part.fusible_bytes += nbytes
        self.produced.clear()

    def _tp_dim(self, packet, sharded: bool) -> str | None:
        if self.in_experts and packet in (aten.bmm, aten.baddbmm):
            return "expert"  # [experts, tokens per expert, hidden] GEMMs: expert parallelism splits dim 0
        if self.tp_stack and packet in (aten.mm, aten.addmm):
            return "n" if self.tp_stack[-1] == "col" else "k"
        if sharded and packet not in (aten.mm, aten.addmm):
            return "batch"  # per-head attention matmuls: heads / tp on each rank
        return None

    # -- saved tensors --------------------------------------------------------------------
    def pack(self, t: torch.Tensor):
        part = self.part
        self.needed.add(storage_key(t))  # saved for backward: written to HBM
        if part is not None:
            key = storage_key(t)
            if key not in self.excluded and key not in self.counted_elsewhere:
                self.save_counts[key] += 1
            if key not in self.excluded and key not in self.counted_elsewhere and key not in part.saved_keys:
                part.saved_keys.add(key)
                self._alive.append(t)
                try:
                    nbytes = t.untyped_storage().nbytes()
                except (RuntimeError, NotImplementedError):
                    nbytes = t.numel() * t.element_size()
                category = self._category(t, key)
                part.saved[category] += nbytes
                if not self.in_experts:
                    part.saved_categories[key] = (nbytes, category)
                if self.in_experts and category == "replicated":
                    part.saved_expert += nbytes
                elif category == "replicated" and key in self.col_inputs:
                    part.saved_gathered += nbytes
        return t

    def _category(self, t: torch.Tensor, key: int) -> str:
        # scores, softmax output, dropout mask/output (by origin: `_track_core`)
        if key in self.core:
            return "attention_core"
        return "tp_sharded" if key in self.sharded else "replicated"


def _kernel(func, args, kwargs) -> str:
    """"gemm", or "flash" / "flash_causal" for the fused attention kernels (by their is_causal argument)."""
    if func._overloadpacket not in _ATTENTION:
        return "gemm"
    names = [a.name for a in func._schema.arguments]
    causal = kwargs.get("is_causal", args[names.index("is_causal")] if "is_causal" in names[: len(args)] else False)
    return "flash_causal" if causal else "flash"


def _gemm_shapes(packet, args, out) -> list[tuple[int, int, int, int]]:
    """(m, n, k, batch) of the GEMMs one op runs (attention kernels run two)."""
    if packet in (aten.mm, aten.addmm):
        a, b = args[-2], args[-1]
        return [(a.shape[0], b.shape[1], a.shape[1], 1)]
    if packet in (aten.bmm, aten.baddbmm):
        a, b = args[-2], args[-1]
        return [(a.shape[1], b.shape[2], a.shape[2], a.shape[0])]
    if packet is aten.convolution:  # implicit GEMM: (N * output pixels) x C_out x (C_in/g * kernel)
        x, w = args[0], args[1]
        groups = args[8] if len(args) > 8 else 1
        o = out if isinstance(out, torch.Tensor) else out[0]
        pixels = o.numel() // (o.shape[0] * o.shape[1])
        return [(x.shape[0] * pixels, w.shape[0] // groups, w[0].numel(), groups)]
    if packet in _GROUPED_MM and args[0].dim() == 2 and args[1].dim() == 3:
        # [rows, k] x [groups, k, n]: one GEMM per expert of rows / groups tokens on average
        a, b = args[0], args[1]
        groups = b.shape[0]
        return [(max(a.shape[0] // groups, 1), b.shape[2], a.shape[1], groups)]
    if packet in _ATTENTION:  # q [b, a, s, d], k/v [b, a, t, d]: one call, q k^T then p v
        # One record (queries, keys, head dim); MatmulShape.flops counts its two GEMMs. Their
        # head dims differ under MLA (q k^T over 192, p v over 128 in DeepSeek-V3): the record
        # takes their mean, so its FLOPs are the two GEMMs' (torch's flop_counter, sdpa; exactly
        # when the two head dims sum to an even number, as every model's here do).
        q, k, v = args[0], args[1], args[2]
        heads = q.shape[0] * q.shape[1]
        return [(q.shape[2], k.shape[2], (q.shape[3] + v.shape[3]) // 2, heads)]
    return []


class GPUKernels(TorchFunctionMode):
    """Run dropout and SDPA as the CUDA kernels do (see the module docstring)."""

    _SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")

    def __init__(self, tracer: Tracer | None = None):
        super().__init__()
        self.tracer = tracer  # credited with the K and V every attention call reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout or func is torch.dropout:
            names = ("input", "p", "training", "inplace") if func is F.dropout else ("input", "p", "training")
            bound = {"p": 0.5, "training": True, "inplace": False, **dict(zip(names, args, strict=False)), **kwargs}
            if "train" in bound:
                bound["training"] = bound.pop("train")
            p, x = bound["p"], bound["input"]
            if bound["training"] and 0.0 < p < 1.0 and not bound["inplace"] and isinstance(x, torch.Tensor):
                return torch.native_dropout(x, p, True)[0]
        elif func is F.rms_norm or func is torch.rms_norm:
            bound = {"weight": None, "eps": None, **dict(zip(("input", "normalized_shape", "weight", "eps"), args,
                                                             strict=False)), **kwargs}
            x = bound["input"]
            if isinstance(x, torch.Tensor) and x.device.type == "meta":
                return _FusedRMSNorm.apply(x, tuple(bound["normalized_shape"]), bound["weight"], bound["eps"])
        elif func is F.scaled_dot_product_attention:
            bound = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False,
                     **dict(zip(self._SDPA_ARGS, args, strict=False)), **kwargs}
            if self.tracer is not None and self.tracer.part is not None:
                part, key = self.tracer.part, bound["key"]
                part.kv_bytes += tensor_bytes((key, bound["value"]))
                query = bound["query"]
                if not part.kv_heads and isinstance(key, torch.Tensor) and key.dim() == 4 == query.dim():
                    part.kv_heads = key.shape[-3] if key.shape[-3] > 1 else query.shape[-3]
            fused = _fused_attention(**bound)
            if fused is not None:
                return fused
        return func(*args, **kwargs)


class _FusedRMSNorm(torch.autograd.Function):
    """RMSNorm as CUDA's `aten._fused_rms_norm` keeps it for backward: the input and the
    per-row rstd (and the weight), not the composite's fp32 intermediates. Profiling only
    runs the forward; the backward re-derives the gradient from the same saved tensors."""

    @staticmethod
    def forward(ctx, x, normalized_shape, weight, eps):
        out, rstd = torch.ops.aten._fused_rms_norm(x, list(normalized_shape), weight, eps)
        ctx.save_for_backward(x, rstd, weight)
        ctx.normalized_shape, ctx.eps = normalized_shape, eps
        return out

    @staticmethod
    def backward(ctx, grad):
        x, _, weight = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_()
            wd = weight.detach().requires_grad_() if weight is not None else None
            out = F.rms_norm(xd, list(ctx.normalized_shape), wd, ctx.eps)
            grads = torch.autograd.grad(out, [t for t in (xd, wd) if t is not None], grad)
        return grads[0], None, grads[1] if wd is not None else None, None


def _fused_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    if query.dim() != 4 or key.dim() != 4:
        return None
    if key.shape[1] != query.shape[1]:
        # Grouped-query attention (enable_gqa=True, as transformers calls it): flash attention
        # reads each kv head for its group of query heads (Dao 2023, FlashAttention-2 section 3;
        # torch's SDPA flash/cuDNN backends take enable_gqa). The meta kernels take the
        # un-expanded k and v, so what is saved (q, k, v, out, lse) and counted
        # (flop_counter.sdpa_flop_count supports GQA) is the GPU's. Only on meta: a real CPU
        # kernel is not asked to broadcast heads.
        if not enable_gqa or query.shape[1] % key.shape[1] or query.device.type != "meta":
            return None
    try:
        if attn_mask is None and value.shape[-1] == query.shape[-1]:
            return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, scale=scale)[0]
        if attn_mask is None:
            # a value head size of its own (MLA: q k over 192, v 128): the flash kernel's output takes q's
            # size; the memory-efficient one, which torch's SDPA picks for it on a GPU, takes v's
            return aten._scaled_dot_product_efficient_attention(query, key, value, None, True, dropout_p, is_causal,
                                                                scale=scale)[0]
        bias = attn_mask
        if bias.dtype == torch.bool:
            bias = torch.zeros(bias.shape, dtype=query.dtype, device=query.device).masked_fill(~bias, float("-inf"))
        shape = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, bias.expand(shape), True, dropout_p, is_causal, scale=scale
        )[0]
    except (RuntimeError, TypeError, NotImplementedError):
        return None  # shapes the fused kernels refuse: let the math kernel run
