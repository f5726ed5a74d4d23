"""Which parallel dimensions a model can run, decided once for the planner and the executor.

A dimension the executor would reject is never offered by the planner: the profiler
records the reason here (`ModelProfile.unsupported`), the search leaves the dimension out,
`plan --explain` and `profile` print the reason, and `execute` refuses with the same line.
"""

from __future__ import annotations

import torch
from torch import nn

from .structure import Layout, cut_chunk


def pipeline_problem(model: nn.Module, layout: Layout, inputs, call) -> str | None:
    """Why `model` cannot be cut into pipeline stages, or None.

    A pipeline stage holds some blocks and sets the others (and the embedding or head of
    the other stages) to None, so the model's forward must skip missing layers, as
    examples/gpt.py does and Hugging Face, torchvision and timm forwards do not. Checked
    for real: the first and last one-block chunks run on the meta device (`call(chunk,
    inputs)`, no memory), the second on the first one's output.
    """
    name = type(model).__name__
    if layout.num_blocks < 2:
        return f"{name} has {layout.num_blocks} repeated block(s); pipeline stages need at least 2"
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
        return (f"{name}.forward does not skip the layers another stage holds ({type(err).__name__}: "
                f"{first_line}); skip None layers in forward, as examples/gpt.py does, to allow pp")
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


def context_parallel_support_problem(hook, name: str) -> str | None:
    """Why the model file `name` cannot run context parallelism (its `hook`, or None), or None."""
    if hook is None:
        return (f"{name} defines no {CP_HOOK}(model, sequence) hook (attention must see the whole sequence's "
                "K/V, masked by global position; see examples/gpt.py)")
    return None
