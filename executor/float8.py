"""dtype=fp8: the blocks' linears as torchao's float8 training linears.

torchao's `convert_to_float8_training` swaps an `nn.Linear` for a `Float8Linear`, whose
forward and backward cast the input, weight and output gradient to float8 (e4m3 forward, e5m2
for gradients) with dynamic per-tensor scales and multiply with `torch._scaled_mm`; the
weights and optimizer state stay in the model's dtype. This is torchtitan's float8 converter
(torchtitan/components/quantization/float8.py), applied the same way: on the meta-built
chunk, before tensor parallelism and FSDP. As there, the head is not converted (the plan's
memory and cost models leave it in bf16 too). Under TP the model file's own styles shard the
Float8Linear's weight: torchao takes each scale's amax over the whole DTensor, so a tp=2 run
rounds as one process does (tests/executor/test_float8.py).

`torch._scaled_mm` runs on CUDA GPUs with FP8 units (compute capability 8.9 and up: L40S, H100,
B200) and on CPU (torch 2.13, checked by tests/executor/test_float8.py; `execute` tries it once
before a CPU launch and refuses a torch without it in one line), so a CPU run trains
with the same float8 numerics (not at any useful speed). Without torch.compile the casts run
as separate kernels; torchao's speed-up needs it (torchao/float8/README.md).
"""

from __future__ import annotations

from torch import nn

from smplan.model import find_expert_banks

# torch._scaled_mm needs both GEMM dimensions divisible by 16 (torchao/float8/README.md,
# "Float8 training": torchtitan's filter skips any linear whose in or out features are not).
FP8_DIM_MULTIPLE = 16
# Plan.fp8_scaling -> torchao recipe. Per-tensor dynamic scaling is torchao's default recipe;
# block scaling (MXFP8, a scale per 32 elements) is only a torchao prototype for Blackwell GPUs
# (torchao.prototype.mx_formats), not run here.
TORCHAO_RECIPES = {"tensor": "tensorwise"}
# CUDA compute capability with FP8 tensor cores (NVIDIA Ada/Hopper and later).
MIN_FP8_CAPABILITY = (8, 9)


class Float8Unavailable(RuntimeError):
    """FP8 training cannot run here; the message says what to change."""


def torchao_float8():
    """torchao.float8, or Float8Unavailable saying how to install it."""
    try:
        import torchao.float8 as float8
    except ImportError:
        raise Float8Unavailable("dtype=fp8 trains with torchao's float8 linears, which are not installed: "
                                "pip install 'smplan[fp8]' (or pip install torchao), or use dtype=bf16") from None
    return float8


def fp8_plan_problem(scaling: str) -> str | None:
    """Why this executor cannot run a dtype=fp8 plan of this scaling, or None."""
    if scaling not in TORCHAO_RECIPES:
        return (f"fp8_scaling={scaling} has no torchao float8 training recipe this executor runs "
                f"(it runs {', '.join(TORCHAO_RECIPES)}); use fp8_scaling=tensor")
    return None


def fp8_device_problem(capability: tuple[int, int] | None) -> str | None:
    """Why this machine's first CUDA GPU (its (major, minor) compute capability; None: no GPU,
    the run is on CPU) cannot train in float8, or None."""
    if capability is None:
        return _cpu_scaled_mm_problem()
    if tuple(capability) >= MIN_FP8_CAPABILITY:
        return None
    major, minor = capability
    return (f"dtype=fp8 needs a GPU with FP8 units (compute capability 8.9 or later: L40S, H100, B200); this one "
            f"has {major}.{minor}: use dtype=bf16")


def _cpu_scaled_mm_problem() -> str | None:
    """torch._scaled_mm on CPU tried once on 16 x 16 float8 matrices: torch builds without a CPU
    kernel for it would fail at every rank's first step instead."""
    import torch

    try:
        a = torch.zeros(16, 16).to(torch.float8_e4m3fn)
        one = torch.tensor(1.0)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    except (RuntimeError, NotImplementedError, AttributeError, TypeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        return (f"dtype=fp8 on CPU needs torch._scaled_mm for CPU, which torch {torch.__version__} lacks ({first}); "
                "run it on a GPU with FP8 units, or use dtype=bf16")
    return None


def convertible(module: nn.Module) -> bool:
    """Whether a linear runs in float8: both GEMM dimensions a multiple of FP8_DIM_MULTIPLE."""
    return (isinstance(module, nn.Linear) and module.in_features % FP8_DIM_MULTIPLE == 0
            and module.out_features % FP8_DIM_MULTIPLE == 0)


def convert_blocks(chunk: nn.Module, blocks: list[nn.Module], scaling: str = "tensor") -> tuple[int, int, int]:
    """Swap the convertible linears inside `blocks` (modules of `chunk`) for torchao
    Float8Linear, in place. (converted, linears in the blocks, routers not counted, expert banks
    in the chunk): a linear of other dimensions, a MoE router, an expert bank (batched weights,
    not nn.Linear: torchao's MoE float8 is a GPU-only prototype) and any linear outside the
    blocks (the head) stay as they are."""
    float8 = torchao_float8()
    config = float8.Float8LinearConfig.from_recipe_name(TORCHAO_RECIPES[scaling])
    # the MoE routers stay as they are (torchtitan's float8 filter leaves out "router.gate"): top-k
    # on e4m3 scores would pick other experts, and the cost model prices the router unconverted
    banks = find_expert_banks(chunk)
    routers = {id(m) for bank in banks for router in bank.routers for m in router.modules()}
    linears = [m for block in blocks for m in block.modules() if isinstance(m, nn.Linear) and id(m) not in routers]
    chosen = {id(m) for m in linears if convertible(m)}
    # on the chunk, not block by block: a block that is itself a Linear is replaced in its parent
    float8.convert_to_float8_training(chunk, config=config, module_filter_fn=lambda m, _fqn: id(m) in chosen)
    return len(chosen), len(linears), len(banks)


def fp8_line(converted: int, linears: int, scaling: str = "tensor", expert_banks: int = 0) -> str:
    """The run's one line on what dtype=fp8 converted (rank 0's blocks)."""
    if not converted:
        return (f"fp8: none of the {linears} linears in this rank's blocks has both dimensions a multiple of "
                f"{FP8_DIM_MULTIPLE}, so nothing runs in float8; the plan's fp8 prediction does not apply")
    line = (f"fp8: {converted} of the {linears} linears in this rank's blocks run in float8 (torchao, "
            f"{TORCHAO_RECIPES[scaling]} scaling); the head, MoE routers and every other op run as they would "
            "without fp8")
    if expert_banks:  # the plan priced their GEMMs at the fp8 rate (planner/pass_model.py)
        line += (f"; the {expert_banks} expert bank{'s' if expert_banks != 1 else ''} too, although the plan priced "
                 "them in fp8: expect this run's MoE layers slower than predicted")
    return line
