"""`smplan execute --init-from PATH`: start training from existing weights.

PATH is a Hugging Face folder (`model.safetensors`, or shards with an index, as `smplan
export` and `save_pretrained` write), a DCP checkpoint folder (`step-N`), or a run directory
or checkpoint root (its latest complete step). The names are the model's state-dict names
(transformers' names for hf:DIR models); the second name of a tied parameter may be absent.

- Before launch (`check_source`): the source's names and shapes, read from file headers and
  DCP metadata only, against the model built on meta; a mismatch is one line.
- In every worker (`load_weights`, collective): `dcp.load` into this rank's sharded state
  dict (`get_model_state_dict`: DTensor shards under TP / FSDP), so each rank reads only its
  slices: torch's HuggingFaceStorageReader cuts them with `safe_open(...).get_slice(...)`,
  its FileSystemReader reads the DCP chunks that overlap them. Never the whole model per
  rank (a DDP replica holds whole tensors anyway).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from smplan.model import tied_aliases

from . import checkpoint
from .metrics import CHECKPOINTS_DIR

SAFETENSORS = "safetensors"
DCP = "dcp"
DCP_METADATA = ".metadata"  # FileSystemWriter's metadata file name
MODEL_KEY = "model."  # checkpoint.train_state's model part, flattened by DCP


class InitFromError(ValueError):
    """--init-from names no readable weights, or weights of another model (one line)."""


@dataclass(frozen=True)
class WeightSource:
    kind: str  # SAFETENSORS or DCP
    path: str  # the folder dcp.load reads
    shapes: dict  # {state-dict name: shape tuple}


def resolve(path: str | Path) -> tuple[str, Path]:
    """(kind, folder) of `path`; one line naming what was expected otherwise."""
    path = Path(path)
    if not path.exists():
        raise InitFromError(f"--init-from {path} does not exist; pass a safetensors folder or a DCP checkpoint")
    if path.is_file() and path.suffix == ".safetensors":
        raise InitFromError(f"--init-from {path} is a file; pass the folder holding it (with config.json beside it)")
    if (path / DCP_METADATA).is_file():
        return DCP, path
    if any(path.glob("*.safetensors")):
        return SAFETENSORS, path
    for root in (path, path / CHECKPOINTS_DIR):
        found = checkpoint.latest(root)
        if found is not None:
            return DCP, found[1]
    raise InitFromError(f"--init-from {path} holds neither *.safetensors nor a DCP checkpoint "
                        "(.metadata, or step-N folders); pass an smplan export folder or a step-N folder")


def _safetensors_shapes(folder: Path) -> dict:
    try:
        from safetensors import safe_open
    except ImportError:
        raise InitFromError(f"--init-from {folder} is a safetensors folder, which needs the safetensors "
                            "package: pip install 'smplan[hf]'") from None

    shapes, seen = {}, {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name in seen:
                    raise InitFromError(f"--init-from {folder}: {name} is in both {seen[name]} and {file.name}; "
                                        "keep one export per folder")
                seen[name] = file.name
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def _dcp_shapes(folder: Path) -> dict:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(folder)).read_metadata()
    return {key[len(MODEL_KEY):]: tuple(md.size) for key, md in meta.state_dict_metadata.items()
            if key.startswith(MODEL_KEY) and isinstance(md, TensorStorageMetadata)}


def open_source(path: str | Path) -> WeightSource:
    kind, folder = resolve(path)
    shapes = _safetensors_shapes(folder) if kind == SAFETENSORS else _dcp_shapes(folder)
    if not shapes:
        raise InitFromError(f"--init-from {folder} holds no model tensors; pass an smplan export folder "
                            "or a checkpoint of smplan execute")
    return WeightSource(kind=kind, path=str(folder.resolve()), shapes=shapes)


def shape_mismatch(shapes: dict[str, tuple], model) -> str | None:
    """How a saved set of tensors (name -> shape) differs from `model`'s (built on meta), as the
    tail of a sentence about the source ("lacks 9 of the model's tensors ..."), or None when it
    holds exactly the model: every tensor, with its shape, a tie's second name excepted."""
    expected = {n: tuple(t.shape) for n, t in model.state_dict(keep_vars=True).items()}
    aliases = tied_aliases(model)
    missing = [n for n in expected if n not in shapes and n not in aliases]
    unexpected = [n for n in shapes if n not in expected]
    if missing:
        return (f"lacks {len(missing)} of the model's tensors (first: {missing[0]}"
                f"{'; it has ' + unexpected[0] if unexpected else ''})")
    if unexpected:
        return f"has {len(unexpected)} tensors the model lacks (first: {unexpected[0]})"
    for name, shape in expected.items():  # in the model's order: the first mismatch is the first layer's
        if name in shapes and tuple(shapes[name]) != shape:
            return f"has {name} as {tuple(shapes[name])}, where the model has {shape}"
    return None


def check_source(source: WeightSource, model) -> None:
    """Every tensor of `model` (built on meta) is in the source with its shape, and nothing else is."""
    why = shape_mismatch(source.shapes, model)
    if why:
        raise InitFromError(f"--init-from {source.path} {why}: it holds another model (or names this version of "
                            "transformers does not use); check --model and --arg (layers, hidden size, vocabulary)")


def load_weights(chunks, source: WeightSource) -> None:
    """Collective: every rank fills its shards of `chunks` from the source."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    per_chunk = [{n: t for n, t in get_model_state_dict(chunk).items() if n in source.shapes} for chunk in chunks]
    state = {n: t for part in per_chunk for n, t in part.items()}
    if source.kind == SAFETENSORS:
        dcp.load(state, storage_reader=HuggingFaceStorageReader(source.path))
    else:
        nested = {"model": state}
        dcp.load(nested, checkpoint_id=source.path)
        state = nested["model"]
    for chunk, part in zip(chunks, per_chunk, strict=True):
        set_model_state_dict(chunk, {n: state[n] for n in part}, options=StateDictOptions(strict=False))
