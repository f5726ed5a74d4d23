"""Which parallel dimensions a model can run, decided once for the planner and the executor.

A dimension the executor would reject is never offered by the planner: the profiler
records the reason here (`ModelProfile.unsupported`), the search leaves the dimension out,
`plan --explain` and `profile` print the reason, and `execute` refuses with the same line.
"""

from __future__ import annotations

import linecache
import re
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .inputs import inputs_kind, is_one_tensor
from .structure import Layout, cut_chunk, tied_groups, unlike_blocks

# What a model file changes to allow each dimension (the tail of each reason below); a caller
# whose model is not the user's own code (a Hugging Face config) passes its own.
PIPELINE_FIX = "skip None layers in forward, as examples/gpt.py does, to allow pp"
EXPERT_BANK_FIX = "give the bank examples/moe.py's Experts interface, or use ep=1"
EXPERT_WEIGHTS_FIX = "batch the expert weights as examples/moe.py's Experts does, or use ep=1"


def pipeline_problem(model: nn.Module, layout: Layout, inputs, call, fix: str = PIPELINE_FIX) -> str | None:
    """Why `model` cannot be cut into pipeline stages, or None.

    A pipeline stage holds some blocks and sets the others (and the embedding or head of
    the other stages) to None, so the model's forward must skip missing layers, as
    examples/gpt.py does and Hugging Face, torchvision and timm forwards do not. Checked
    for real: the first and last one-block chunks run on the meta device (`call(chunk,
    inputs)`, no memory), the second on the first one's output.
    """
    name = type(model).__name__
    if layout.num_blocks < 2:
        unlike = unlike_blocks(model, layout)  # a pyramid of one class: say why it is not one run
        return (f"{name} has {layout.num_blocks} repeated block(s); pipeline stages need at least 2"
                + (f": {unlike}" if unlike else ""))
    if not is_one_tensor(inputs):  # forward(*inputs) / forward(**inputs): stages pass one tensor on
        return f"batch() gives {name}'s inputs as {inputs_kind(inputs)}; pipeline stages pass one tensor on"
    n = layout.num_blocks
    first = cut_chunk(model, layout, 0, 1, is_first=True, is_last=False)
    last = cut_chunk(model, layout, n - 1, n, is_first=False, is_last=True)
    try:
        with torch.no_grad():
            hidden = call(first, inputs)
            if not isinstance(hidden, torch.Tensor):
                return (f"{name}.forward returns {type(hidden).__name__} from a stage without its head; "
                        "pipeline stages pass one tensor on")
            call(last, hidden)
    except Exception as err:  # any failure means the stage cannot run; say which
        while type(err).__module__.startswith("smplan") and (err.__cause__ or err.__context__):
            err = err.__cause__ or err.__context__  # the model's own error, not our wrapper of it
        first_line = (str(err).strip().splitlines() or [""])[0][:100]
        caller = _library_caller(err) if fix == PIPELINE_FIX else None
        if caller:  # a library's forward calls the blocks: nothing of it is the user's to edit
            return (f"{name}'s blocks are called by {caller}.forward, which does not skip the layers "
                    f"another stage holds ({type(err).__name__}: {first_line}); call them from a forward of your "
                    "own that skips None layers, as examples/gpt.py does, to allow pp")
        if fix != PIPELINE_FIX:  # transformers' code: neither its line nor its layers (nor its exception,
            # a None layer called inside it) are the user's to act on
            return f"{name}.forward does not skip the layers another stage holds; {fix}"
        where = _user_line(model, err)  # the user's own line: what to edit, and what was None there
        return (f"{name}.forward does not skip the layers another stage holds{': ' + where + ' ' if where else ' '}"
                f"({type(err).__name__}: {first_line}); {_none_on_a_stage(layout)}; {fix}")
    tied = _tied_apart(model, layout)  # after the forward: a forward that cannot be cut says so first
    if tied:
        return (f"{name} ties {tied[0]} to {tied[1]} (one Parameter), which pipeline stages would hold apart; "
                "untie them in the model to allow pp")
    return None


def _library_caller(err: BaseException) -> str | None:
    """"torch's Sequential", "transformers' LlamaModel": the class whose forward raised `err`
    when that forward is an installed library's (a whole-model nn.Sequential, an
    nn.TransformerEncoder or a Hugging Face model calling its layers), or None: the innermost
    module forward of the traceback is the one that met the missing layer. The line a user
    could edit is not in it (it named transformers' deprecation.py, a review's finding)."""
    innermost = None
    for frame, _ in traceback.walk_tb(err.__traceback__):
        me = frame.f_locals.get("self")
        if frame.f_code.co_name == "forward" and isinstance(me, nn.Module):
            innermost = me
    forward = type(innermost).forward if innermost is not None else None
    module = getattr(forward, "__module__", None) or ""
    if module.startswith("torch.nn"):
        return f"torch's {type(innermost).__name__}"
    code = getattr(forward, "__code__", None)
    installed = code is not None and any(part in ("site-packages", "dist-packages")
                                         for part in Path(code.co_filename).parts)
    if not (installed and module):
        return None
    library = module.split(".")[0]
    possessive = "'" if library.endswith("s") else "'s"  # transformers' LlamaModel, timm's ResNet
    return f"{library}{possessive} {type(innermost).__name__}"


def _user_line(model: nn.Module, err: BaseException) -> str | None:
    """"line 37 of tied.py, `return self.out(self.ln(x))`, where self.ln, self.out are None": the
    last line of the file defining the model's forward that the error passed through (the call
    that met a missing layer) and the layers of that frame's `self` it names that are None, or
    None when the traceback never reached that file."""
    code = getattr(type(model).forward, "__code__", None)
    frames = [(frame, line) for frame, line in traceback.walk_tb(err.__traceback__)
              if code is not None and frame.f_code.co_filename == code.co_filename]
    if not frames:
        return None
    frame, lineno = frames[-1]
    source = linecache.getline(frame.f_code.co_filename, lineno).strip()
    out = f"line {lineno} of {Path(frame.f_code.co_filename).name}" + (f", `{source}`" if source else "")
    me = frame.f_locals.get("self")
    missing = [f"self.{n}" for n, m in getattr(me, "_modules", {}).items()
               if m is None and re.search(rf"\bself\.{re.escape(n)}\b", source)]
    return out + (f", where {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} None" if missing else "")


def _none_on_a_stage(layout: Layout) -> str:
    """What the pipeline probe (`cut_chunk`, as the executor's stages) sets to None: the blocks a
    stage does not hold, and the parts before and after them on the stages that do not run them."""
    def names(fqns: tuple[str, ...]) -> str:
        return ", ".join(fqns[:4]) + (", ..." if len(fqns) > 4 else "")

    parts = ([f"{names(layout.before)} (before the blocks) on every stage but the first"] if layout.before else []) \
        + ([f"{names(layout.after)} (after the blocks) on every stage but the last"] if layout.after else [])
    return ("on a pipeline stage the blocks it does not hold are None"
            + (f", and so are {' and '.join(parts)}" if parts else ""))


def _part_of(layout: Layout, fqn: str) -> str:
    """Which piece of a pipeline cut holds parameter `fqn`: a block, the parts before the
    blocks (first stage), those after them (last stage), or the model's own."""
    def under(prefix: str) -> bool:
        return fqn.startswith(prefix + ".")

    for i in range(layout.num_blocks):
        if under(layout.block_fqn(i)):
            return f"block {i}"
    if any(under(p) for p in layout.before):
        return "before"
    if any(under(p) for p in layout.after):
        return "after"
    return "model"


def _tied_apart(model: nn.Module, layout: Layout) -> tuple[str, str] | None:
    """Two names of one Parameter (a tied embedding and head) that pieces of a pipeline cut
    hold apart, or None: each stage materialises only its own modules, so a tie across
    stages cannot hold (the executor's materialize refuses it at launch)."""
    for group in tied_groups(model):
        parts = [_part_of(layout, fqn) for fqn in group]
        for fqn, part in zip(group[1:], parts[1:], strict=True):
            if part != parts[0]:
                return group[0], fqn
    return None


# torch.distributed.tensor.parallel's ColwiseParallel / RowwiseParallel shard nn.Linear and
# nn.Embedding only (torch 2.x style.py: "currently only support nn.Linear and nn.Embedding");
# GPT-2's Conv1D, for one, fails at launch.
TP_MODULE_TYPES = (nn.Linear, nn.Embedding)


def tensor_parallel_problem(styled: dict[str, nn.Module], hook: str = "tp_plan") -> str | None:
    """Why the modules a TP plan shards column- or row-wise (`styled`: name -> module)
    cannot be sharded by torch's styles, or None."""
    for name, module in styled.items():
        if not isinstance(module, TP_MODULE_TYPES):
            return (f"{hook}() shards {name}, a {type(module).__name__}; torch's ColwiseParallel/RowwiseParallel "
                    "take nn.Linear or nn.Embedding only")
    return None


# The model-file hook that runs context parallelism (executor/context_parallel.py says what
# it receives). Attention must see the whole sequence's K/V and mask by global position,
# which only the model's own code can arrange (examples/gpt.py's explicit softmax, RoPE).
CP_HOOK = "context_parallel"


def context_parallel_support_problem(hook, name: str, fix: str = "see examples/gpt.py") -> str | None:
    """Why the model file `name` cannot run context parallelism (its `hook`, or None), or None."""
    if hook is None:
        return (f"{name} defines no {CP_HOOK}(model, sequence) hook (attention must see the whole sequence's "
                f"K/V, masked by global position); {fix}")
    return None


def hf_config_fix(dim: str) -> str:
    """The end of a reason why an `hf:` config cannot run `dim`: the code that would change is
    transformers', not the user's (pp and cp reasons get "; use pp=1" from their callers)."""
    if dim == "ep":
        return ("an hf: model runs transformers' code as it is, so use ep=1 (a model file of your own can batch "
                "its experts: see examples/moe.py)")
    return f"an hf: model runs transformers' code as it is (a model file of your own can allow {dim}: see examples/gpt.py)"


@dataclass(frozen=True)
class ExpertBank:
    name: str
    module: nn.Module
    num_experts: int
    top_k: int  # experts each token uses
    routers: tuple[nn.Module, ...]  # the siblings that score the experts (their FLOPs are the router's)


def _count(module: nn.Module, attr: str) -> int | None:
    value = getattr(module, attr, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def find_expert_banks(model: nn.Module) -> list[ExpertBank]:
    """Every bank of routed experts: a module with integer `num_experts` and `top_k`
    (0 < top_k <= num_experts; examples/moe.py, transformers < 5), or one with `num_experts`
    alone beside a router that states both for the same number of experts (transformers >= 5:
    MixtralExperts next to MixtralTopKRouter; that router is then not a bank). A module that
    holds another bank is the MoE block around it, not a bank. A bank's routers are those
    siblings and the nn.Linear siblings with num_experts outputs."""
    out = []
    for parent_name, parent in model.named_modules():
        children = list(parent.named_children())
        for name, child in children:
            experts, top_k = _count(child, "num_experts"), _count(child, "top_k")
            if experts is None:
                continue
            beside = [c for _, c in children if c is not child and _count(c, "num_experts") == experts]
            if top_k is not None and any(_count(c, "top_k") is None for c in beside):
                continue  # a router; the bank is the sibling without top_k
            routers = [c for c in beside if _count(c, "top_k") is not None] if top_k is None else []
            if top_k is None:
                ks = {_count(c, "top_k") for c in routers}
                if len(ks) != 1:
                    continue
                top_k = ks.pop()
            if not 0 < top_k <= experts:
                continue
            routers += [c for _, c in children if isinstance(c, nn.Linear) and c.out_features == experts
                        and not any(c is r for r in routers)]
            out.append(ExpertBank(f"{parent_name}.{name}" if parent_name else name, child, experts, top_k,
                                  tuple(routers)))
    # a MoE block that states num_experts and top_k itself and holds a bank found beside its
    # router (transformers 5: PhimoeSparseMoeBlock, Llama4TextMoe) is the block, not a bank:
    # its router and shared experts are not routed experts
    return [bank for bank in out if not any(other is not bank and other.name.startswith(bank.name + ".")
                                            for other in out)]


def expert_banks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every bank of routed experts (`find_expert_banks`), as the profiler
    counts them (params_active) and expert parallelism shards them."""
    return [(bank.name, bank.module) for bank in find_expert_banks(model)]


def expert_bank_problem(model: nn.Module, inputs, call, fix: str | None = None) -> str | None:
    """Why the expert banks of `model` cannot be split over expert-parallel ranks, or None
    (also None for a model without banks: feasibility.expert_parallel_problem says ep needs some).

    Expert parallelism (executor/expert_parallel.py, torchtitan's GroupedExperts contract)
    shards dim 0 of every parameter of a bank and hands each rank a [num_experts / ep, slots,
    hidden] slice of the dispatch buffer, so every parameter must have num_experts rows in
    dim 0 and the forward must take one [num_experts, slots, hidden] tensor and return one of
    the same shape (examples/moe.py's `Experts`). Checked for real: the model runs once on the
    meta device (`call(model, inputs)`) with hooks on the banks.
    """
    banks = expert_banks(model)
    for name, bank in banks:
        for pname, p in bank.named_parameters():
            if p.dim() == 0 or p.shape[0] != bank.num_experts:
                return (f"expert bank {name} holds {pname} of shape {tuple(p.shape)}, not num_experts="
                        f"{bank.num_experts} rows in dim 0 (one slice per expert), so it cannot be split over ep "
                        f"ranks; {fix or EXPERT_WEIGHTS_FIX}")
    if not banks:
        return None
    seen: dict[str, str | None] = {}

    def check(name: str, bank: nn.Module):
        def hook(mod, args, kwargs, output):
            x = args[0] if len(args) == 1 and not kwargs else None
            ok = (isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[0] == mod.num_experts
                  and isinstance(output, torch.Tensor) and output.shape == x.shape)
            seen.setdefault(name, None if ok else (
                f"expert bank {name}'s forward takes {_describe(args, kwargs)} and returns {_shape(output)}, "
                f"not one [num_experts={mod.num_experts}, slots, hidden] buffer in and out, so its tokens cannot be "
                f"dispatched to ep ranks; {fix or EXPERT_BANK_FIX}"))
        return bank.register_forward_hook(hook, with_kwargs=True)

    handles = [check(name, bank) for name, bank in banks]
    try:
        with torch.no_grad():
            call(model, inputs)
    except Exception as err:  # the model must run on meta anyway (profiling); say it did not
        return f"{type(model).__name__} did not run on the meta device ({type(err).__name__}); use ep=1"
    finally:
        for h in handles:
            h.remove()
    return next((why for why in seen.values() if why), None)


def _shape(value) -> str:
    return f"[{', '.join(map(str, value.shape))}]" if isinstance(value, torch.Tensor) else type(value).__name__


def _describe(args, kwargs) -> str:
    return "(" + ", ".join([_shape(a) for a in args] + [f"{k}=..." for k in kwargs]) + ")"
