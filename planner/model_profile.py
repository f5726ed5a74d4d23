"""The ModelProfile contract: what the cost model and the simulator know about a model.

All per-sample figures are for one sequence (one sample) at the profile's `seq_len`, with
the profile's `dtype` (bytes per element of activations); they scale linearly with the
micro-batch size. Figures of one block are for the whole block without tensor parallelism;
the `tp_*` fields say how tensor parallelism divides them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class MatmulShape:
    """One GEMM of a forward pass per sample: [batch x m x k] @ [batch x k x n], `count` times.

    `tp_dim` names the dimension tensor parallelism divides ("n" for a column-parallel
    linear, "k" for a row-parallel one, "batch" for per-head attention matmuls, or None
    when the GEMM is replicated on every TP rank). "expert" marks a routed expert bank's
    batched GEMM ([experts] x [tokens per expert x hidden]): expert parallelism divides its
    batch (experts) and gathers the ep ranks' tokens into m.
    """

    m: int
    n: int
    k: int
    batch: int = 1
    count: int = 1
    tp_dim: str | None = None
    # "gemm" (cuBLAS-style), or one fused attention call per count, m queries x n keys x k head
    # dim: "flash" / "flash_causal" (SDPA flash, memory-efficient or cuDNN kernels), timed by
    # hwprofiles.perf.flash_attention_time_s; a causal one skips the masked half of the scores.
    kernel: str = "gemm"

    @property
    def flops(self) -> float:
        """Forward FLOPs as the flop counter counts them: a fused attention call is two GEMMs
        (q k^T and p v, each 2 m n k per head), the whole square even under a causal mask."""
        gemms = 1 if self.kernel == "gemm" else 2
        return 2.0 * gemms * self.m * self.n * self.k * self.batch * self.count


@dataclass(frozen=True)
class TPCollective:
    """A collective one block issues per sample under tensor parallelism (Megatron f/g ops).

    `bytes_per_sample` is the size of the full (unsharded) tensor. Without sequence
    parallelism it is an all-reduce; with it, the same point becomes a reduce-scatter and
    an all-gather (Korthikanti et al. 2022, section 4.2.2).
    """

    kind: str  # "all_reduce"
    phase: str  # "forward" or "backward"
    bytes_per_sample: float
    module: str = ""  # the tp_plan entry inside the block that issues it ("attn.proj")


@dataclass(frozen=True)
class BlockProfile:
    """One part of the model: a repeated block (transformer layer) or a non-repeated part."""

    name: str
    kind: str  # "block" for repeated blocks, "pre" (embedding) or "post" (head, loss) otherwise
    params: int
    forward_flops_per_sample: float
    # Bytes autograd saves for backward, split by what divides them (Korthikanti et al. 2022):
    saved_bytes_tp_sharded_per_sample: float  # inside colwise->rowwise regions: / tp
    saved_bytes_replicated_per_sample: float  # LN inputs, dropout masks...: / tp only with SP
    saved_bytes_attention_core_per_sample: float  # s^2 terms: freed by selective recompute, / tp
    output_bytes_per_sample: float  # what this part hands to the next (a pipeline send)
    input_bytes_per_sample: float = 0.0  # what a full-recompute checkpoint keeps (the input)
    elementwise_bytes_per_sample: float = 0.0  # HBM traffic of non-GEMM kernels
    elementwise_tp_sharded_fraction: float = 0.0  # part of that traffic divided by tp
    # Of elementwise_bytes_per_sample: what a fusing compiler keeps on chip (intermediates of
    # element-wise chains that are neither saved for backward nor handed on); see profiler_trace.
    elementwise_fusible_bytes_per_sample: float = 0.0
    # GPU kernels one forward call launches (GEMMs, fused attention, non-view element-wise ops,
    # as traced; 0: not counted, a profile from before PROFILER_VERSION 25)
    forward_kernels: float = 0.0
    matmuls: tuple[MatmulShape, ...] = ()
    tp_collectives: tuple[TPCollective, ...] = ()
    # Parameters one token uses (routed experts: top_k / num_experts of them); None in
    # profiles made before this field existed, read as `params`.
    params_active: int | None = None
    # Of `params`: those the model file's TP plans split over the tp ranks (column- and
    # row-parallel weights, column-parallel biases); the rest is replicated on every rank.
    # None in profiles made before this field existed, read as all of them.
    params_tp_sharded: int | None = None
    # Whether the output leaves this part split over the tp ranks (a vocab-parallel head's
    # logits); None in profiles made before this field existed, read as True.
    output_tp_sharded: bool | None = None
    # Mixture of experts (0 in dense parts and in profiles made before these fields existed):
    num_experts: int = 0  # routed experts of this part's expert bank
    top_k: int = 0  # experts each token is routed to
    params_expert: int = 0  # of `params`: the routed experts' (expert parallelism splits them over ep)
    # Of forward_flops_per_sample: the routed experts' GEMMs (already top_k / num_experts of a
    # dense equivalent: each token runs top_k experts) and the router's (linear + top-k).
    expert_flops_per_sample: float = 0.0
    router_flops_per_sample: float = 0.0
    # Bytes one sample sends through the expert-parallel all-to-all, each way: dispatch sends
    # every token's hidden vector to each of its top_k experts, combine brings them back, so
    # tokens * hidden * top_k * bytes per element each (Megatron-Core token dispatcher).
    all_to_all_bytes_per_sample: float = 0.0
    # K and V tensors the attention kernels read per sample (what context parallelism all-gathers).
    attention_kv_bytes_per_sample: float = 0.0
    # Of saved_bytes_replicated_per_sample: what the routed experts keep (their GEMM inputs and
    # activations); it grows with the capacity factor and, under ep > 1, is split over tp.
    saved_bytes_expert_per_sample: float = 0.0
    # Of saved_bytes_replicated_per_sample: the inputs of column-parallel modules (the norms'
    # outputs before QKV and the first MLP linear), which sequence parallelism all-gathers to
    # full length there. Megatron's linear saves its local shard and gathers it again in backward
    # (/ tp, Korthikanti et al. 2022, section 4.2.2); DTensor's autograd keeps the gathered tensor
    # (whole: the stack's sp_saved_input = "gathered"). 0 in profiles before PROFILER_VERSION 30.
    saved_bytes_gathered_per_sample: float = 0.0
    # Of the two categories above: what only linear GEMMs keep (their inputs; FP8 training keeps
    # their FP8 cast instead, 1 B an element: Transformer Engine's Linear, torchao's Float8Linear),
    # linear inputs another op keeps too (attention's output: FP8 adds the cast beside it), and
    # element-wise outputs that only element-wise ops keep, made of tensors kept anyway (SwiGLU's
    # silu(gate)), which a fused kernel recomputes in backward (Megatron-Core's bias_swiglu saves its
    # input only; torch.compile's min-cut partitioner): `efficiency.elementwise_fusion` of them go.
    # 0 in profiles before PROFILER_VERSION 31.
    saved_bytes_fp8_input_tp_sharded_per_sample: float = 0.0
    saved_bytes_fp8_input_replicated_per_sample: float = 0.0
    saved_bytes_fp8_shared_tp_sharded_per_sample: float = 0.0
    saved_bytes_fp8_shared_replicated_per_sample: float = 0.0
    saved_bytes_refusable_tp_sharded_per_sample: float = 0.0
    saved_bytes_refusable_replicated_per_sample: float = 0.0
    # The loss part only: the peak bytes while its forward and backward run, the logits included
    # while it reads them (throughout where it saves them) and their gradient once made, as
    # measured running it (planner/loss_memory.py: an fp32 cross-entropy peaks at 12 B a bf16 logit
    # in its backward): per sample, and what does not grow with the batch (a chunked loss's
    # temporaries). 0: not measured (profiles before PROFILER_VERSION 32).
    loss_peak_bytes_per_sample: float = 0.0
    loss_peak_fixed_bytes: float = 0.0
    # Op-level selective checkpointing (recompute "sac", torchtitan's policy: the outputs of
    # every other linear GEMM and of the attention kernels are saved, the rest re-run in
    # backward): what it keeps besides the part's input, by what divides it under tp
    # ("unsplit": row-parallel GEMM outputs, partial sums whole on every tp rank), and the
    # GEMMs it re-runs. 0 / () in profiles made before these fields existed: sac not offered.
    saved_bytes_sac_tp_sharded_per_sample: float = 0.0
    saved_bytes_sac_replicated_per_sample: float = 0.0
    saved_bytes_sac_unsplit_per_sample: float = 0.0
    sac_recompute_matmuls: tuple[MatmulShape, ...] = ()

    @property
    def causal_masked_flops_per_sample(self) -> float:
        """Of forward_flops_per_sample: the masked half of causal fused attention calls, counted by
        the flop counter (MatmulShape.flops, the whole square) but skipped by the kernels, which
        leave out the tiles above the diagonal (Dao 2023, FlashAttention-2, section 3.1.1)."""
        return 0.5 * sum(mm.flops for mm in self.matmuls if mm.kernel == "flash_causal")

    @property
    def supports_sac(self) -> bool:
        """Whether the profile says what op-level selective checkpointing keeps of this part."""
        return bool(self.saved_bytes_sac_tp_sharded_per_sample or self.saved_bytes_sac_replicated_per_sample
                    or self.saved_bytes_sac_unsplit_per_sample)

    def params_per_gpu(self, tp: int = 1) -> float:
        """Parameters one tp rank holds: the tp-sharded ones / tp, the replicated ones whole."""
        sharded = self.params if self.params_tp_sharded is None else self.params_tp_sharded
        return sharded / tp + (self.params - sharded)

    def output_bytes_per_gpu(self, tp: int = 1) -> float:
        """Bytes of this part's output per sample on one tp rank."""
        sharded = True if self.output_tp_sharded is None else self.output_tp_sharded
        return self.output_bytes_per_sample / (tp if sharded else 1)

    @property
    def saved_bytes_per_sample(self) -> float:
        return (
            self.saved_bytes_tp_sharded_per_sample
            + self.saved_bytes_replicated_per_sample
            + self.saved_bytes_attention_core_per_sample
        )

    def saved_bytes_per_gpu(self, tp: int = 1, sequence_parallel: bool = False, recompute: str = "none",
                            sp_keeps_gathered: bool = False, fp8_input_bytes: float = 0.0,
                            fusion: float = 0.0) -> float:
        """Activation bytes per sample this part keeps on one GPU until its backward.
        `sp_keeps_gathered`: sequence parallelism keeps the gathered inputs of column-parallel
        modules whole (DTensor), not / tp (Megatron). `fp8_input_bytes`: bytes an element of
        the FP8 cast the linear GEMMs keep of their inputs (0: not FP8). `fusion`: the share of
        the re-computable element-wise outputs that fused kernels do not keep."""
        kept_input = self.input_bytes_per_sample / (tp if sequence_parallel else 1)
        if recompute == "full":
            return kept_input
        if recompute == "sac":
            return (kept_input + self.saved_bytes_sac_tp_sharded_per_sample / tp + self.saved_bytes_sac_unsplit_per_sample
                    + self.saved_bytes_sac_replicated_per_sample / (tp if sequence_parallel else 1))
        rep_split = tp if sequence_parallel else 1
        gathered = sequence_parallel and sp_keeps_gathered
        replicated = self.saved_bytes_replicated_per_sample / rep_split
        if gathered:
            replicated += self.saved_bytes_gathered_per_sample * (1.0 - 1.0 / tp)
        sharded = self.saved_bytes_tp_sharded_per_sample / tp
        core = 0.0 if recompute == "selective" else self.saved_bytes_attention_core_per_sample / tp
        refused = fusion * (self.saved_bytes_refusable_tp_sharded_per_sample / tp
                            + self.saved_bytes_refusable_replicated_per_sample / rep_split)
        fp8_kept = 0.0
        if fp8_input_bytes:  # the profile's bf16 inputs (2 B an element) kept as their FP8 cast
            fp8_rep = self.saved_bytes_fp8_input_replicated_per_sample
            fp8 = self.saved_bytes_fp8_input_tp_sharded_per_sample / tp + fp8_rep / rep_split
            if gathered:  # the gathered column-parallel inputs are linear inputs too
                fp8 += min(self.saved_bytes_gathered_per_sample, fp8_rep) * (1.0 - 1.0 / tp)
            shared = (self.saved_bytes_fp8_shared_tp_sharded_per_sample / tp
                      + self.saved_bytes_fp8_shared_replicated_per_sample / rep_split)
            fp8_kept = fp8 * (1.0 - fp8_input_bytes / 2.0) - shared * fp8_input_bytes / 2.0
        return replicated + sharded + core - refused - fp8_kept


@dataclass(frozen=True)
class ModelProfile:
    model: str  # the model reference as given, "examples/gpt.py:gpt3_175b"
    args: dict = field(default_factory=dict)
    seq_len: int = 0  # tokens per sample (0 for models without a sequence)
    dtype: str = "bf16"
    bytes_per_element: int = 2
    pre: tuple[BlockProfile, ...] = ()  # parts before the repeated blocks (embedding)
    blocks: tuple[BlockProfile, ...] = ()  # the repeated blocks, in order
    post: tuple[BlockProfile, ...] = ()  # parts after them (final norm, head, loss)
    has_tp_plan: bool = False
    # The model file's TP plans take sequence_parallel and tp_plan_outer splits the sequence
    # around the blocks (what the executor needs for sp=1); None in older profiles: allowed.
    supports_sequence_parallel: bool | None = None
    num_heads: int = 0  # key/value heads per block (the attention heads without GQA; 0: not a transformer); tp divides it
    # dimension ("pp", ...) -> why this model cannot run it (smplan.model.capabilities)
    unsupported: dict = field(default_factory=dict)
    file_sha256: str = ""

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def parts(self) -> tuple[BlockProfile, ...]:
        return self.pre + self.blocks + self.post

    @property
    def params(self) -> int:
        return sum(p.params for p in self.parts)

    @property
    def params_active(self) -> int:
        """Parameters one token uses; the embedding table counts in full, as Mixtral's,
        Qwen3's and DeepSeek-V3's published active counts do."""
        return sum(p.params if p.params_active is None else p.params_active for p in self.parts)

    @property
    def forward_flops_per_sample(self) -> float:
        return sum(p.forward_flops_per_sample for p in self.parts)

    @property
    def num_experts(self) -> int:
        """Routed experts per MoE block (0: a dense model); what ep must divide."""
        return max((p.num_experts for p in self.parts), default=0)

    @property
    def train_flops_per_sample(self) -> float:
        """Forward + backward model FLOPs of one sample, no recompute (backward = 2x forward: the
        input and weight gradients, one GEMM each; Kaplan et al. 2020 section 2.1, C = 6N per token)."""
        return 3.0 * self.forward_flops_per_sample

    @property
    def tokens_per_sample(self) -> int:
        return max(self.seq_len, 1)

    def degree_problem(self, **degrees: int) -> str | None:
        """Why this model cannot run these parallel degrees (tp=, pp=, cp=, ep=): what the profiler
        found it cannot split, or no tp_plan for tp; None when it can. Checked before any rule on
        the cluster's size, so that a hint on the size never leads into this refusal."""
        for dim in ("tp", "pp", "cp", "ep"):
            degree = degrees.get(dim) or 1
            if degree > 1 and dim in self.unsupported:  # ep's reason names its own fix (search_space.py)
                return f"{dim}={degree}: {self.unsupported[dim]}" + ("" if dim == "ep" else f"; use {dim}=1")
            if dim == "tp" and degree > 1 and not self.has_tp_plan:
                return "the model file defines no tp_plan(block), so tensor parallelism is not offered; use tp=1"
        return None

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.update(
            params=self.params,
            params_active=self.params_active,
            num_blocks=self.num_blocks,
            train_flops_per_sample=self.train_flops_per_sample,
            forward_flops_per_sample=self.forward_flops_per_sample,
        )
        return data

    @staticmethod
    def from_dict(data: dict) -> ModelProfile:
        def part(d: dict) -> BlockProfile:
            d = dict(d)
            d["matmuls"] = tuple(MatmulShape(**m) for m in d.get("matmuls", ()))
            d["tp_collectives"] = tuple(TPCollective(**c) for c in d.get("tp_collectives", ()))
            d["sac_recompute_matmuls"] = tuple(MatmulShape(**m) for m in d.get("sac_recompute_matmuls", ()))
            names = {f.name for f in dataclasses.fields(BlockProfile)}
            return BlockProfile(**{k: v for k, v in d.items() if k in names})

        names = {f.name for f in dataclasses.fields(ModelProfile)}
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("pre", "blocks", "post"):
            kwargs[key] = tuple(part(d) for d in data.get(key, ()))
        return ModelProfile(**kwargs)
