"""Gradient compression of the data-parallel all-reduce (the plan key `grad_compress`).

- `none`: gradients are reduced in the stack's dtype (`cost_model.grad_reduce_bytes_per_param`:
  the weights' dtype, 2 B/element for bf16, fp16 and fp8 plans and 4 B for fp32, or 4 B where the
  stack reduces in fp32, `efficiency.grad_reduce_dtype`).
- `bf16`: the all-reduce and ZeRO/FSDP's reduce-scatters run in bf16 (torch's
  `default_hooks.bf16_compress_hook` for DDP, FSDP2's `MixedPrecisionPolicy(reduce_dtype=
  torch.bfloat16)`); it shrinks only gradients reduced wider than 2 B.
- `powersgd:R`: rank-R PowerSGD (Vogels et al. 2019, "PowerSGD: Practical Low-Rank Gradient
  Compression for Distributed Optimization", Algorithm 1, as torch's
  `ddp_comm_hooks.powerSGD_hook` runs it): a gradient matrix m x n sends P (m x R) and
  Q (n x R), (m + n) * R elements instead of m * n; vectors (biases, norms) go uncompressed,
  and so does a matrix whose m*n / ((m+n)*R) is below torch's `min_compression_rate` (2).
  It costs three GEMMs per matrix (P = M Q, Q = M^T P, M = P Q^T; Algorithm 1 lines 3, 6
  and 8), which run between the bucket's all-reduces and so are priced on the DP path.
  Its error feedback keeps a residual of every bucket, one more copy of the local gradients
  (priced in the cost model's gradient memory). PowerSGD all-reduces whole (replicated) gradients: torch's hook is a DDP hook, and a
  ZeRO / FSDP reduce-scatter of shards has nothing to apply it to, so it needs zero=0.

The profile knows a part's weight matrices from its GEMMs: an mm/addmm of [tokens x k] by a
[k x n] weight (tensor parallelism divides n for column-, k for row-parallel linears). A part's
parameters beyond those (the embedding table, which is no GEMM, norms, biases) are counted
uncompressed, so an embedding's share is priced as sent whole (conservative).
"""

from __future__ import annotations

from dataclasses import dataclass

from smplan.hwprofiles import Cluster
from smplan.hwprofiles.perf import matmul_time_s

from .model_profile import BlockProfile

KINDS = ("none", "bf16", "powersgd")
# torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState(min_compression_rate=2):
# a matrix is compressed only where 2 * (m+n)*R < m*n (R capped at min(m, n)).
MIN_COMPRESSION_RATE = 2.0
# The largest rank accepted: Vogels et al. 2019 train at ranks 1-4 (up to 32 in their tables
# 3 and 4); a rank in the thousands compresses nothing and is a typo.
MAX_RANK = 1024
BF16_BYTES = 2.0
USAGE = "grad_compress must be none, bf16 or powersgd:R (R a whole number >= 1, e.g. powersgd:4)"


class GradCompressError(ValueError):
    """A `grad_compress` value that is not none, bf16 or powersgd:R; the message says which are."""


@dataclass(frozen=True)
class GradCompress:
    kind: str = "none"
    rank: int = 0  # PowerSGD's matrix approximation rank (0 unless powersgd)

    def __str__(self) -> str:
        return f"powersgd:{self.rank}" if self.kind == "powersgd" else self.kind


def parse(text: str) -> GradCompress:
    """`"powersgd:4"` -> GradCompress("powersgd", 4); ValueError (one line) otherwise."""
    if not isinstance(text, str):
        raise GradCompressError(f"{USAGE}; got {text!r}")
    kind, sep, rank = text.strip().partition(":")
    if kind in ("none", "bf16") and not sep:
        return GradCompress(kind)
    if kind == "powersgd" and sep:
        try:
            r = int(rank)
        except ValueError:
            r = 0
        if 1 <= r <= MAX_RANK:
            return GradCompress("powersgd", r)
        raise GradCompressError(f"powersgd rank must be a whole number in 1..{MAX_RANK}, got {rank!r}; e.g. powersgd:4")
    raise GradCompressError(f"{USAGE}; got {text!r}")


def problem(text: str, zero: int) -> str | None:
    """Why `grad_compress=text` cannot go with ZeRO stage `zero`, or None (planner and executor)."""
    try:
        spec = parse(text)
    except ValueError as err:
        return str(err)
    if spec.kind == "powersgd" and zero >= 1:
        return (f"grad_compress={spec} needs zero=0 (PowerSGD compresses whole gradients: torch's hook is "
                f"DDP-only, ZeRO/FSDP reduce-scatters shards); use zero=0 or grad_compress=bf16")
    return None


def weight_matrices(part: BlockProfile, tp: int) -> list[tuple[int, int, int]]:
    """(rows, cols, count) of the part's local weight matrices on one tp rank."""
    out = []
    for mm in part.matmuls:
        if mm.batch != 1 or mm.tp_dim not in (None, "n", "k"):
            continue  # attention's per-head products and expert banks hold no 2-D weight
        n = mm.n // tp if mm.tp_dim == "n" else mm.n
        k = mm.k // tp if mm.tp_dim == "k" else mm.k
        out.append((n, k, mm.count))
    return out


def sent_elements(part: BlockProfile, local_params: float, tp: int, spec: GradCompress) -> float:
    """Elements one rank all-reduces for the part's `local_params` dense gradients."""
    if spec.kind != "powersgd" or not local_params:
        return local_params
    matrix, sent = 0.0, 0.0
    for rows, cols, count in weight_matrices(part, tp):
        if matrix + rows * cols * count > local_params:
            continue  # a tied or shared weight counted twice: keep what the part holds
        matrix += rows * cols * count
        low = (rows + cols) * min(rows, cols, spec.rank)
        sent += count * (low if _compressed(rows, cols, spec.rank) else rows * cols)
    return sent + (local_params - matrix)


def _compressed(rows: int, cols: int, rank: int) -> bool:
    """torch's powerSGD_hook._should_compress at rank min(rows, cols, R)."""
    return (rows + cols) * min(rows, cols, rank) * MIN_COMPRESSION_RATE < rows * cols


def grad_bytes(base_bytes: float, spec: GradCompress) -> float:
    """Bytes per all-reduced element: bf16 halves fp32 gradients; PowerSGD keeps their dtype."""
    return min(base_bytes, BF16_BYTES) if spec.kind == "bf16" else base_bytes


def compress_time_s(part: BlockProfile, local_params: float, tp: int, spec: GradCompress, cluster: Cluster,
                    dtype: str) -> float:
    """Seconds of PowerSGD's three GEMMs per compressed matrix of the part (0 otherwise)."""
    if spec.kind != "powersgd" or not local_params:
        return 0.0
    gemm_dtype = "fp32" if dtype == "fp32" else "bf16"
    total, matrix = 0.0, 0.0
    for rows, cols, count in weight_matrices(part, tp):
        if matrix + rows * cols * count > local_params:
            continue
        matrix += rows * cols * count
        if not _compressed(rows, cols, spec.rank):
            continue
        r = min(rows, cols, spec.rank)
        one = (matmul_time_s(rows, r, cols, cluster, gemm_dtype)  # P = M Q
               + matmul_time_s(cols, r, rows, cluster, gemm_dtype)  # Q = M^T P
               + matmul_time_s(rows, cols, r, cluster, gemm_dtype))  # M = P Q^T
        total += count * one
    return total
