"""Running a model file's own code for the profiler: any crash becomes one line naming the
file's line, with a hint for the mistakes users make (the meta device, forward's signature,
a loss given other shapes)."""

from __future__ import annotations

import re
import traceback
from pathlib import Path

from smplan.model.inputs import describe_shapes

from .model_file import ModelFile, ModelFileError, first_line


def user_call(mf: ModelFile, what: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ModelFileError:
        raise
    except Exception as err:  # noqa: BLE001 - any crash in user code becomes one line
        frames = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename).resolve() == mf.path.resolve()]
        line = f" (line {frames[-1].lineno} of {mf.path.name})" if frames else ""
        hint = ""
        meta = meta_device_error(err)
        if what == "forward" and isinstance(err, TypeError) and "argument" in str(err):
            # a signature mismatch, not the meta device: say how batch()'s inputs reach forward
            hint = ("; batch()'s inputs reach forward as forward(**inputs) for a dict, forward(*inputs) for a "
                    "tuple or list, forward(inputs) for a tensor")
        elif what in ("forward", "loss") and meta:
            hint = "; the profiler runs it on the meta device (no data): avoid .item(), .tolist() and data-dependent shapes"
        elif what.startswith("the default loss"):
            hint = f"; define loss(outputs, targets) in {mf.path.name} for what forward returns and batch()'s targets"
        elif what == "loss":  # a plain mismatch (a shape, a dtype): what the loss was given
            hint = f"; it was given {describe_shapes(args[0])} from forward and {describe_shapes(args[1])} from batch()'s targets"
        raise ModelFileError(f"{mf.path}: {what} raised {type(err).__name__}: {first_line(err)}{line}{hint}") from None


# What torch says when code needs a tensor's values and the tensor is on the meta device (no data):
# .item() / .tolist() ("... on meta tensors"), a copy out, an op without a Meta kernel ("from the
# 'Meta' backend"), an op with a data-dependent output shape (nonzero, unique).
META_DEVICE_SIGNS = re.compile(r"\bmeta\b|register_meta|data[- ](?:in)?dependent|no data", re.IGNORECASE)


def meta_device_error(err: Exception) -> bool:
    """Whether `err` is the meta device's doing (code that needs data), not a mismatch real data meets too."""
    return bool(META_DEVICE_SIGNS.search(str(err)))
