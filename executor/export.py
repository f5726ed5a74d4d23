"""`smplan export`: a run's DCP checkpoint as a Hugging Face folder (safetensors + config.json).

One process reads the checkpoint with torch.distributed.checkpoint's own loader (no process
group: DCP reassembles every rank's shards into whole tensors), shard by shard, so the peak
memory is one output file's worth of weights; the optimizer states are never read.

Names: a run of an `hf:DIR` model or of a model file returning a `PreTrainedModel` keeps the
model's own state-dict names (DCP's `model.` prefix aside: `get_model_state_dict` drops the
DDP / FSDP / recomputation wrappers), which are transformers' names; tied parameters are
written once, under their first name, as `save_pretrained` does, and re-tied by
`from_pretrained`. Models that are not transformers models (examples/gpt.py) are refused:
its Llama presets leave out rotary embeddings, so no transformers class computes what they do.

Files follow transformers' layout: `model.safetensors`, or `model-0000K-of-0000N.safetensors`
shards of at most `max_shard_gib` each with `model.safetensors.index.json` (metadata.total_size
and weight_map), the layout `save_pretrained(max_shard_size=...)` writes.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from . import checkpoint
from .metrics import CHECKPOINTS_DIR, METRICS_FILE, RUN_CONFIG_FILE, SUMMARY_FILE, read_metrics
from .run_lock import running_launch

# Files `execute` writes at the top of a run directory and nothing else does under these names
# (a folder merely holding a `checkpoints` or `ranks` subfolder is no run).
RUN_FILES = (RUN_CONFIG_FILE, METRICS_FILE, SUMMARY_FILE)

MODEL_KEY = "model."  # train_state's {"model": ..., "optim": ...}, flattened by DCP
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # transformers.utils.SAFE_WEIGHTS_INDEX_NAME
GIB = 2**30
# transformers 4.x's save_pretrained default max_shard_size "5GB", which its
# convert_file_size_to_int reads as 5e9 bytes (only "GiB" is 2**30-based): 4.66 GiB (5.x: "50GB")
DEFAULT_MAX_SHARD_GIB = 5e9 / GIB


class ExportError(ValueError):
    """The run, the checkpoint or the output folder is not what export needs (one line)."""


@dataclass
class ExportResult:
    out_dir: str
    run_dir: str
    step: int
    checkpoint: str
    files: list[str]
    tensors: int
    total_size_bytes: int
    model_class: str
    running: str | None = None  # the launch still training the run ("pid 123 on host, since ..."), if any

    def to_dict(self) -> dict:
        return asdict(self)


def run_checkpoint_dir(run_dir: str | Path) -> Path:
    """Where a run directory's checkpoints are: its run_config.json's checkpoint_dir, else RUN_DIR/checkpoints."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "is a file, not a run directory" if run_dir.exists() else "does not exist"
        raise ExportError(f"run directory {run_dir} {what}; pass the -o/--output folder of smplan execute")
    config = run_dir / RUN_CONFIG_FILE
    if not config.is_file() and not (run_dir / CHECKPOINTS_DIR).is_dir():
        raise ExportError(f"{run_dir} is not a run directory of smplan execute (no {RUN_CONFIG_FILE}, no "
                          f"{CHECKPOINTS_DIR}/); pass the -o/--output folder of smplan execute")
    if config.is_file():
        try:
            saved = json.loads(config.read_text()).get("checkpoint_dir")
        except (ValueError, AttributeError):
            raise ExportError(f"{config} is not a run's JSON config; pass the -o/--output folder of "
                              "smplan execute") from None
        if saved:
            return Path(saved)
    return run_dir / CHECKPOINTS_DIR


def _checkpoint_every(run_dir: str | Path) -> int:
    """The run's --checkpoint-every (run_config.json), 0 when it saved none or says nothing."""
    try:
        every = json.loads((Path(run_dir) / RUN_CONFIG_FILE).read_text()).get("checkpoint_every")
    except (OSError, ValueError, AttributeError):
        return 0
    return every if isinstance(every, int) else 0


def no_checkpoint_line(run_dir: str | Path, root: Path, running: str | None = None) -> str:
    """Why RUN_DIR has nothing to export, and what gets it a checkpoint: the advice follows what
    `smplan execute` accepts (a folder holding steps but no checkpoint is refused as -o/--output)."""
    every = _checkpoint_every(run_dir)
    records = read_metrics(run_dir)
    reached = records[-1].get("step", len(records)) if records else 0
    where = f"{run_dir} holds no complete checkpoint (looked in {root})"
    new_run = ("run the plan again into a new -o/--output with --checkpoint-every N (its last step is saved too), "
               "then export that")
    if running and every:
        return (f"{where} yet: its run is still going ({running}) and saves its first at step {every}; export "
                "again after that")
    if running:
        return f"{where}: its run is still going ({running}) without --checkpoint-every, so it saves none; {new_run}"
    if not every:
        return f"{where}: it ran without --checkpoint-every, so nothing of it can be exported or continued; {new_run}"
    if not reached:  # no step recorded: execute takes the folder again
        return (f"{where}: the run stopped before its first one was complete; run the same smplan execute command "
                "again to reach one")
    return (f"{where}: the run stopped at step {reached}, before its first checkpoint (every {every} steps) was "
            f"complete, and smplan execute continues no run without one; run the plan again into a new "
            f"-o/--output with --checkpoint-every N (N at most {reached} to have one by then), then export that")


def pick_checkpoint(run_dir: str | Path, step: int | None = None, running: str | None = None) -> tuple[int, Path]:
    """The complete step-N checkpoint of the run: `step`, else the latest. `running`: the launch
    still training it (`running_launch`), which the refusal's advice follows."""
    root = run_checkpoint_dir(run_dir)
    found = checkpoint.complete_steps(root)
    if not found:
        raise ExportError(no_checkpoint_line(run_dir, root, running))
    if step is None:
        return found[-1]
    for n, path in found:
        if n == step:
            return n, path
    raise ExportError(f"{run_dir} has no checkpoint of step {step}; it has steps "
                      f"{', '.join(str(n) for n, _ in found)}")


def checkpoint_tensors(path: Path) -> dict:
    """{model state-dict name: TensorStorageMetadata} of a DCP checkpoint's model part."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(path)).read_metadata()
    return {key[len(MODEL_KEY):]: md for key, md in meta.state_dict_metadata.items()
            if key.startswith(MODEL_KEY) and isinstance(md, TensorStorageMetadata)}


def source_model(run_dir: Path, meta: dict):
    """(model file, model args, the model built on meta) of the run, refused unless a transformers model."""
    from smplan.planner.hf_model import is_hf_module
    from smplan.planner.model_file import load_model_file

    config = Path(run_dir) / RUN_CONFIG_FILE
    saved = json.loads(config.read_text()) if config.is_file() else {}
    ref = saved.get("model_ref") or meta.get("model")
    if not ref:
        raise ExportError(f"{run_dir} has no run_config.json naming its model; export the run directory "
                          "smplan execute wrote")
    args = (saved.get("plan") or meta.get("plan") or {}).get("model_args") or {}
    model_file = load_model_file(ref)
    model = model_file.build(args, device="meta")
    if not is_hf_module(model):
        raise ExportError(f"export needs a Hugging Face model (hf:DIR, or a model file returning a PreTrainedModel); "
                          f"{ref} builds a {type(model).__name__}, which has no transformers counterpart")
    return model_file, args, model


def hub_config(model_file, args: dict, model, dtype):
    """The transformers config to save: the hf:DIR config.json with the run's --arg values
    (without the batch length, which is no config field), or the model file's own config."""
    import copy

    from smplan.planner.hf_model import HFModel

    cfg = model_file.config(args) if isinstance(model_file, HFModel) else copy.deepcopy(model.config)
    cfg.architectures = [type(model).__name__]
    if dtype is not None:  # what from_pretrained(dtype="auto") loads them as: the checkpoint's
        setattr(cfg, "dtype" if hasattr(cfg, "dtype") else "torch_dtype", dtype)  # transformers < 4.56: torch_dtype
    return cfg


def hub_names(model, stored: dict) -> list[str]:
    """The state-dict names to write, in the model's order: every stored tensor except the
    second and later names of a tied parameter (one tensor, as save_pretrained writes it)."""
    from smplan.model import tied_aliases

    aliases = tied_aliases(model)
    wanted = [n for n in model.state_dict(keep_vars=True) if n not in aliases]
    names = [n for n in wanted if n in stored]
    missing = [n for n in wanted if n not in stored]
    if missing:
        raise ExportError(f"the checkpoint lacks {len(missing)} of the model's tensors (first: {missing[0]}); "
                          "it was written by another model; export the run that trained this one")
    return names


def nbytes(md) -> int:
    import math

    return math.prod(md.size) * md.properties.dtype.itemsize


def shard_names(names: list[str], sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """Consecutive groups of at most `max_bytes` (a larger tensor alone), as transformers' split."""
    shards, current, used = [], [], 0
    for name in names:
        if current and used + sizes[name] > max_bytes:
            shards.append(current)
            current, used = [], 0
        current.append(name)
        used += sizes[name]
    if current:
        shards.append(current)
    return shards


def shard_file(k: int, n: int) -> str:
    return SINGLE_FILE if n == 1 else f"model-{k:05d}-of-{n:05d}.safetensors"  # transformers' pattern


def check_out_dir(out_dir: Path, force: bool, run_dir: Path | None = None) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{out_dir} is a file; pass a folder as OUT_DIR")
    runs = [name for name in RUN_FILES if (out_dir / name).is_file()] if out_dir.is_dir() else []
    if runs:  # --force replaces safetensors files and config.json: not in a run's own folder
        raise ExportError(f"{out_dir} holds a run ({', '.join(runs)}); export into a new folder, e.g. {out_dir}/hf")
    if run_dir is not None and out_dir.resolve().is_relative_to((run_dir / CHECKPOINTS_DIR).resolve()):
        raise ExportError(f"{out_dir} is inside the run's {CHECKPOINTS_DIR}/, which its resumes read; export into "
                          "a folder outside it")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ExportError(f"{out_dir} is not empty; pass --force to write into it, or choose another OUT_DIR")
    if not out_dir.parent.is_dir():
        raise ExportError(f"{out_dir.parent} does not exist; create it first, or choose another OUT_DIR")


def _readable_as_umask_allows(path: Path) -> None:
    """safetensors writes its files 0600 (a private temporary file renamed into place); the
    exported folder is for sharing, so give each file the mode any other file written here gets
    (0666 less the umask, as config.json from save_pretrained)."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def read_tensors(path: Path, names: list[str], stored: dict) -> dict:
    """`names` as whole CPU tensors, read from the DCP checkpoint in this one process."""
    import torch
    import torch.distributed.checkpoint as dcp

    state = {MODEL_KEY + n: torch.empty(stored[n].size, dtype=stored[n].properties.dtype) for n in names}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return {n: state[MODEL_KEY + n].contiguous() for n in names}


def export_run(run_dir: str | Path, out_dir: str | Path, step: int | None = None, force: bool = False,
               max_shard_gib: float = DEFAULT_MAX_SHARD_GIB,
               progress: Callable[[str], None] = lambda line: None) -> ExportResult:
    """Write the run's checkpoint (`step`, else the newest complete one) to `out_dir`; `progress`
    hears, before the weights are read, that the run is still going, when it is."""
    if max_shard_gib <= 0:
        raise ExportError(f"--max-shard-gib must be positive, got {max_shard_gib}")
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    running = running_launch(run_dir)
    newest = step is None
    step, path = pick_checkpoint(run_dir, step, running)
    check_out_dir(out_dir, force, run_dir)
    try:  # the `hf` extra: the folder is transformers' layout, written with its own tools
        import transformers  # noqa: F401
        from safetensors.torch import save_file
    except ImportError as err:
        raise ExportError(f"smplan export needs {err.name}: pip install 'smplan[hf]'") from None
    model_file, args, model = source_model(run_dir, checkpoint.read_meta(path))
    if running:  # a checkpoint is complete once renamed into place: later saves do not touch it
        newest_note = ", the newest complete checkpoint," if newest else ""
        progress(f"exporting step {step}{newest_note} while the run is still going ({running}); export again later "
                 "for a newer one")
    stored = checkpoint_tensors(path)
    names = hub_names(model, stored)
    expected = model.state_dict(keep_vars=True)
    for name in names:
        want = tuple(expected[name].shape)
        if tuple(stored[name].size) != want:
            raise ExportError(f"{name} is {tuple(stored[name].size)} in the checkpoint but {want} in the model; "
                              "the run's model file or config.json changed since; restore it")
    sizes = {n: nbytes(stored[n]) for n in names}
    groups = shard_names(names, sizes, int(max_shard_gib * GIB))
    out_dir.mkdir(exist_ok=True)
    for old in [*out_dir.glob("*.safetensors"), out_dir / INDEX_FILE]:  # --force: no stale shard stays
        old.unlink(missing_ok=True)
    weight_map, files = {}, []
    for k, group in enumerate(groups, start=1):
        file = shard_file(k, len(groups))
        save_file(read_tensors(path, group, stored), str(out_dir / file), metadata={"format": "pt"})
        _readable_as_umask_allows(out_dir / file)
        weight_map.update(dict.fromkeys(group, file))
        files.append(file)
    total = sum(sizes.values())
    if len(groups) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        files.append(INDEX_FILE)
    dtypes = {stored[n].properties.dtype for n in names}
    hub_config(model_file, args, model, dtypes.pop() if len(dtypes) == 1 else None).save_pretrained(out_dir)
    files.append("config.json")
    return ExportResult(out_dir=str(out_dir), run_dir=str(run_dir), step=step, checkpoint=str(path), files=files,
                        tensors=len(names), total_size_bytes=total, model_class=type(model).__name__,
                        running=running)
