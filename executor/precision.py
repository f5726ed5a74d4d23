"""Mixed precision as a plan's dtype runs: fp32 master weights, half-precision compute.

Mixed-precision training keeps an fp32 copy of the weights for the optimizer and computes in
bf16/fp16 (Micikevicius et al. 2018, "Mixed Precision Training"); the planner prices exactly
that (planner/memory_model.py: 2 + 2 + 12 bytes a parameter). On a GPU:
- the parameters are fp32 whatever dtype the model was built in (an hf: config's torch_dtype);
- autocast computes in the plan's dtype (fp8: bf16 around the float8 linears, as torchtitan);
- FSDP2 / `replicate` gather the parameters in that dtype and reduce the gradients in fp32
  (torchtitan's `mixed_precision_param` / `mixed_precision_reduce` defaults), so the bytes on
  the wire are the 2-byte parameters the cost model counts, not fp32 ones; `grad_compress=bf16`
  reduces in bf16 instead.
On a CPU there is no autocast here: the parameters' own dtype computes (the run says so:
train.py's compute_dtype), and FSDP2 keeps its default policy.
"""

from __future__ import annotations

from smplan.planner.grad_compress import GradCompress

# torch dtype names, not dtypes: the launcher imports this before it imports torch (CLI start-up)
HALF = {"bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16"}


def autocast_dtype(plan_dtype: str, device_type: str):
    """The torch dtype autocast computes in for a plan of `plan_dtype` on `device_type` (None: no autocast)."""
    import torch

    name = HALF.get(plan_dtype) if device_type == "cuda" else None
    return getattr(torch, name) if name else None


def keeps_fp32_master(plan_dtype: str, device_type: str) -> bool:
    """Whether the parameters must be fp32 however the model was built: an fp32 plan, and every
    autocast one (its optimizer updates fp32 master weights)."""
    return plan_dtype == "fp32" or autocast_dtype(plan_dtype, device_type) is not None


def fsdp_policy(plan_dtype: str, device_type: str, compress: GradCompress):
    """FSDP2's MixedPrecisionPolicy for the plan (None: FSDP2's default, no casts)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    compute = autocast_dtype(plan_dtype, device_type)
    reduce = torch.bfloat16 if compress.kind == "bf16" else (torch.float32 if compute is not None else None)
    if compute is None and reduce is None:
        return None
    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=reduce)


def gpu_dtype_problem(plan_dtype: str, bf16_supported: bool) -> str | None:
    """Why this machine's GPUs cannot train a plan of `plan_dtype` as priced, or None.
    fp16 needs loss scaling (Micikevicius et al. 2018: small gradients underflow fp16's range),
    which this executor does not run; bf16 has fp32's range and needs none."""
    fix = "plan again with --fix dtype=bf16" if bf16_supported else "plan again with --fix dtype=fp32"
    if plan_dtype == "fp16":
        return f"dtype=fp16 needs loss scaling, which smplan execute does not run (gradients would underflow); {fix}"
    if plan_dtype in ("bf16", "fp8") and not bf16_supported:
        return f"dtype={plan_dtype} needs a GPU with bf16 (compute capability 8.0 or later; not V100); {fix}"
    return None
