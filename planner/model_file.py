"""The model file contract: `path/to/file.py[:builder]` with keyword arguments.

A model file defines a builder (default name `model`) returning an `nn.Module`, and may
define `batch(micro_batch_size, model=None, seed=0)`, `loss(outputs, targets)`,
`tp_plan(block, sequence_parallel=False)` (one repeated block) and
`tp_plan_outer(model, sequence_parallel=False)` (the parts around the blocks; DESIGN.md
"The model file"). Every way this can go wrong ends in one
ModelFileError line naming the file, the problem and the fix.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib.util
import inspect
import os
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from smplan.hwprofiles import parse_scalar


class ModelFileError(ValueError):
    """The model file or its arguments are wrong; the message says what to change."""


@dataclass(frozen=True)
class ModelFile:
    path: Path
    builder_name: str
    module: ModuleType = field(repr=False)
    sha256: str = ""
    # the files of the modules its import loaded from its folder (`from lm import Block`): a profile
    # of it is stale when one of them changes too (planner/profile_cache.py)
    local_files: tuple[Path, ...] = ()
    _seen: dict = field(default_factory=dict, repr=False, compare=False)  # what build() learnt
    # The user's own code (hf_model.HFModel, an hf: config, is transformers' code instead).
    is_hf_config: bool = field(default=False, init=False, repr=False, compare=False)

    @property
    def ref(self) -> str:
        return f"{self.path}:{self.builder_name}"

    @property
    def absolute_ref(self) -> str:
        return f"{self.path.resolve()}:{self.builder_name}"

    @property
    def builder(self):
        return getattr(self.module, self.builder_name)

    @property
    def has_tp_plan(self) -> bool:
        return self.hook("tp_plan") is not None

    def defines(self, name: str) -> bool:
        """Whether the file itself defines function `name` (not hf_model's, which `hook` falls back to)."""
        return callable(getattr(self.module, name, None))

    def hook(self, name: str):
        """The optional function `name` of the file (batch, loss, tp_plan, tp_plan_outer, data, init_weights) or None.
        A file that builds a transformers PreTrainedModel gets hf_model's hooks for those it lacks."""
        fn = getattr(self.module, name, None)
        if callable(fn):
            return fn
        if fn is not None and name == "loss":  # `loss = 3`: training on the default loss hid it
            # (only loss: a module-level `data` is often `from torch.utils import data`)
            raise ModelFileError(f"{self.path}: {name} is {type(fn).__name__}, not a function; smplan calls the "
                                 f"file's {name}() (README: The model file): define it, or rename the variable")
        if self._builds_hf():
            from . import hf_model

            return hf_model.HOOKS.get(name)
        return None

    def _builds_hf(self) -> bool:
        """Whether the builder returns a PreTrainedModel: known once build() ran; before any
        build, from a build on the meta device with the builder's defaults, so that every
        process resolves the same hooks whatever it looked up first (a file importing its
        model from another file of the user's shows no transformers name of its own)."""
        if "hf" not in self._seen:
            if "transformers" not in sys.modules:  # nothing the file imported loaded it: no PreTrainedModel
                return False
            try:
                self.build({}, device="meta")
            except ModelFileError:  # defaults that do not build: whether the file imports transformers
                return any(getattr(v, "__name__", "").startswith("transformers") or
                           str(getattr(v, "__module__", "")).startswith("transformers")
                           for v in vars(self.module).values())
        return self._seen["hf"]

    def builder_parameters(self) -> dict[str, inspect.Parameter]:
        try:
            return dict(inspect.signature(self.builder).parameters)
        except (TypeError, ValueError):
            return {}

    def accepts(self, arg: str) -> bool:
        params = self.builder_parameters()
        return arg in params or any(p.kind == p.VAR_KEYWORD for p in params.values())

    def check_args(self, args: dict) -> None:
        """Raise ModelFileError for an argument the builder does not take, or a value of another
        type than its default's (whatif checks swept values with it before any point is built)."""
        unknown = [k for k in args if not self.accepts(k)]
        if unknown:
            names = [k for k, p in self.builder_parameters().items() if p.kind != p.VAR_KEYWORD]
            near = difflib.get_close_matches(unknown[0], names, n=1)
            raise ModelFileError(
                f"{self.path}: builder {self.builder_name}() takes no argument {unknown[0]!r}"
                f"{f' (did you mean {near[0]!r}?)' if near else ''}; it takes: {', '.join(names) or 'no arguments'}"
            )
        params = self.builder_parameters()
        for key, value in args.items():
            default = params[key].default if key in params else inspect.Parameter.empty
            if default is inspect.Parameter.empty or default is None:
                continue
            if isinstance(default, bool) and not isinstance(value, bool):
                raise ModelFileError(f"{self.path}: --arg {key} must be true or false, got {value!r}")
            if isinstance(default, int | float) and not isinstance(default, bool) and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                kind = "a whole number" if isinstance(default, int) else "a number"
                raise ModelFileError(f"{self.path}: --arg {key} must be {kind}, got {value!r}")
            if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float):
                raise ModelFileError(f"{self.path}: --arg {key} must be a whole number, got {value!r}")
            if isinstance(default, str) and not isinstance(value, str):
                raise ModelFileError(f"{self.path}: --arg {key} must be text (default {default!r}), got {value!r}")

    def build(self, args: dict | None = None, device: str | None = "meta", dtype=None):
        """Call the builder with `args` under `device` (meta by default: no weights allocated)."""
        import torch

        args = dict(args or {})
        self.check_args(args)
        previous = torch.get_default_dtype()
        try:
            if dtype is not None:
                torch.set_default_dtype(dtype)
            with torch.device(device) if device else _nullcontext(), _meta_init_skipped(), warnings.catch_warnings():
                # torch.nn.init's notice for a size-0 weight (e.g. vocab=0): noise before the one-line result
                warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op")
                built = self.builder(**args)
        except TypeError as err:
            raise ModelFileError(f"{self.path}: {self.builder_name}({format_args(args)}) failed: {first_line(err)}; check the --arg values") from None
        except SystemExit as err:  # sys.exit or argparse inside the builder: one line, not smplan's exit
            raise ModelFileError(f"{self.path}: {self.builder_name}() called sys.exit"
                                 f"{f' ({err.code})' if err.code not in (None, 0) else ''}; a builder must return "
                                 "the model, not exit") from None
        except (ValueError, AssertionError) as err:
            if args:
                raise ModelFileError(f"{self.path}: {self.builder_name}({format_args(args)}) rejected its arguments: "
                                     f"{first_line(err)}") from None
            where = traceback.extract_tb(err.__traceback__)[-1]
            raise ModelFileError(f"{self.path}: {self.builder_name}() raised {type(err).__name__}: {first_line(err)} "
                                 f"(line {where.lineno} of {Path(where.filename).name})") from None
        except Exception as err:  # noqa: BLE001 - any crash in user code becomes one line
            where = traceback.extract_tb(err.__traceback__)[-1]
            raise ModelFileError(
                f"{self.path}: {self.builder_name}() raised {type(err).__name__}: {first_line(err)} "
                f"(line {where.lineno} of {Path(where.filename).name})"
            ) from None
        finally:
            torch.set_default_dtype(previous)
        if not isinstance(built, torch.nn.Module):
            raise ModelFileError(
                f"{self.path}: {self.builder_name}() returned {type(built).__name__}, not a torch.nn.Module; "
                "return the model"
            )
        from .hf_model import is_hf_module

        self._seen["hf"] = is_hf_module(built)
        if self._seen["hf"] and not (self.defines("batch") and self.defines("loss")):  # hf_model's next-token batches or loss: it must be causal
            from .hf_checks import check_causal

            check_causal(built, self.path.name, fix="define batch() and loss() in the file for its own task "
                         "(hf_model's are next-token prediction)")
        params = self.builder_parameters()
        if self._seen["hf"] and "seq_len" in params:  # the builder's seq_len, not the config's context, is batch()'s
            from .hf_model import record_seq_len

            record_seq_len(built, args.get("seq_len", params["seq_len"].default), self.path)
        if self._seen["hf"] and getattr(built.config, "use_cache", False):
            built.config.use_cache = False  # training: no KV cache kept beside what autograd saves
        return built


def first_line(err: BaseException) -> str:
    """The first line of an exception's message: torch's C++ errors append a stack trace."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


# torch.nn.init's fills whose meta path runs a torch._refs function that imports torch._dynamo on
# its first call: about 0.9 s of each process's start-up (cProfile of `smplan execute`, 2 cores).
# Measured on torch 2.13 with a (4, 4) meta tensor: normal_, kaiming_normal_, xavier_normal_ and
# eye_ import it; uniform_, trunc_normal_, the kaiming/xavier uniforms, orthogonal_, constant_,
# zeros_, ones_, dirac_ and sparse_ do not. A meta tensor has nothing to fill: the skip keeps each
# function's own argument checks (`_META_CHECKS`), so a wrong call still fails as it would on CPU.
def _fan_checked(tensor, *args, **kwargs):
    from torch.nn import init

    init._calculate_fan_in_and_fan_out(tensor)  # xavier_normal_'s check: 2 or more dims


def _kaiming_checked(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", *args, **kwargs):
    from torch.nn import init

    if 0 not in tensor.shape:  # kaiming_normal_ returns a zero-element tensor before its checks
        init._calculate_correct_fan(tensor, mode)
        init.calculate_gain(nonlinearity, a)


def _eye_checked(tensor, *args, **kwargs):
    if tensor.ndimension() != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")  # eye_'s own message


def _std_checked(tensor, mean=0.0, std=1.0, *args, **kwargs):
    if std < 0:  # torch's own check, in the fill that the skip leaves out
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")


def _xavier_checked(tensor, gain=1.0, *args, **kwargs):
    _fan_checked(tensor)
    _std_checked(tensor, std=gain)  # its std is gain x a positive factor


_META_CHECKS = {"normal_": _std_checked, "xavier_normal_": _xavier_checked,
                "kaiming_normal_": _kaiming_checked, "eye_": _eye_checked}


@contextlib.contextmanager
def _meta_init_skipped():
    """torch.nn.init's `_META_CHECKS` functions check their arguments and return a meta tensor
    unfilled (any other tensor is filled); the originals come back however the build ends."""
    from torch.nn import init

    originals = {name: getattr(init, name) for name in _META_CHECKS}

    def skipping(name, fill):
        @functools.wraps(fill)
        def call(tensor, *args, **kwargs):
            if not getattr(tensor, "is_meta", False):
                return fill(tensor, *args, **kwargs)
            _META_CHECKS[name](tensor, *args, **kwargs)
            return tensor
        return call

    for name, fill in originals.items():
        setattr(init, name, skipping(name, fill))
    try:
        yield
    finally:
        for name, fill in originals.items():
            setattr(init, name, fill)


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def format_args(args: dict) -> str:
    """Builder arguments as they read in a call: key=value, ..."""
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


def split_ref(ref: str, base: Path | None = None) -> tuple[Path, str]:
    """`file.py:builder` -> (Path, builder); the builder defaults to `model`; `hf:DIR` -> (DIR, "hf").
    Whether a colon belongs to a folder name is read from the files there, relative paths from
    `base` (default: the working directory)."""
    from .hf_model import BUILDER, hf_dir, is_hf_ref

    if is_hf_ref(ref):
        return hf_dir(ref), BUILDER

    def there(text: str) -> Path:
        return base / text if base is not None and not Path(text).is_absolute() else Path(text)

    left, _, right = ref.rpartition(":")
    if left and ":" in left and there(left).is_file():  # a colon in a folder name: models/a:b/m.py:tiny
        return Path(left), right or "model"
    path, _, builder = ref.partition(":") if ref.count(":") == 1 and not there(ref).exists() else (ref, "", "")
    return Path(path), builder or "model"


def not_a_model_problem(ref: str) -> str | None:
    """Why `ref`, which is no plan file, is not a model either (an existing file that is not
    Python, a folder: a config folder is named hf:DIR), or None: a command taking
    PLAN.json|MODEL says so instead of asking for a model's --hw."""
    from .hf_model import is_hf_ref

    if is_hf_ref(ref):
        return None
    path = split_ref(ref)[0]
    if path.is_dir() or (path.is_file() and path.suffix != ".py"):
        return (f"{ref!r} is neither a plan file (.json, from smplan plan -o) nor a model (FILE.py[:builder], "
                "or hf:DIR for a Hugging Face config folder)")
    return None


def _callable_without_arguments(fn) -> bool:
    """Whether `fn` can be called with keyword arguments alone, as a builder is (`--arg`)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params)


def _with_path(ref: str, path: str, base: Path | None = None) -> str:
    """`ref` (read from `base`, see `split_ref`) naming `path` instead, its builder or hf: prefix kept."""
    from .hf_model import PREFIX, is_hf_ref

    if is_hf_ref(ref):
        return PREFIX + path
    old, builder = split_ref(ref, base)
    return f"{path}:{builder}" if str(old) != ref else path


def beside(ref: str, folder: Path) -> str:
    """A plan file's relative model path, found from the plan file's `folder` first (how
    `Plan.save` writes it) and else from the working directory (plan files written before it
    did, run where `smplan plan` ran); `ref` as is when neither names a file."""
    if not isinstance(ref, str) or not ref:
        return ref
    path = split_ref(ref, folder)[0]
    if path.is_absolute() or not (folder / path).exists():
        return ref
    found = (folder / path).resolve()
    try:  # named from the working directory where it lies below it, as `smplan plan` was given it
        return _with_path(ref, str(found.relative_to(Path.cwd().resolve())), folder)
    except ValueError:
        return _with_path(ref, str(found), folder)


def relative_to_folder(ref: str, folder: Path) -> str:
    """`ref` with a relative path that names a file from the working directory rewritten
    relative to `folder`, where the plan file that records it lives, so that the plan works
    from any directory (`beside` reads it back); anything else as is."""
    if not isinstance(ref, str) or not ref:
        return ref
    path = split_ref(ref)[0]
    if path.is_absolute() or not path.exists():
        return ref
    return _with_path(ref, os.path.relpath(path.resolve(), folder.resolve()))


def file_digest(ref: str) -> tuple[Path, str, str]:
    """(path, builder name, sha256 of the file) without importing it (what a cache key needs);
    for `hf:DIR` the sha256 of DIR/config.json."""
    from .hf_model import hf_digest, is_hf_ref

    if is_hf_ref(ref):
        return hf_digest(ref)
    if not ref.strip():
        raise ModelFileError("the model reference is empty; pass path/to/model.py[:builder] or hf:DIR")
    path, builder_name = split_ref(ref)
    if ref.endswith(":") and not Path(ref).exists():
        raise ModelFileError(f"{ref!r} names no builder after ':'; drop the ':' (builder model) or give one, "
                             f"e.g. {ref}tiny")
    if not path.exists():
        head = str(path).partition(".py:")[0] + ".py"
        if ".py:" in str(path) and Path(head).is_file():  # examples/gpt.py:tiny:x, examples/gpt.py::tiny
            raise ModelFileError(f"{ref!r}: {head} exists but {str(path)[len(head) + 1:]!r} is not one builder "
                                 f"name; pass {head}:BUILDER with one colon")
        if path.suffix != ".py" and path.with_name(path.name + ".py").is_file():  # `mymodel` for mymodel.py
            fixed = f"{path}.py" + (f":{builder_name}" if ":" in ref else "")  # the builder, as given
            raise ModelFileError(f"model file {str(path)!r} does not exist; did you mean {fixed}?")
        raise ModelFileError(f"model file {str(path)!r} does not exist; pass path/to/model.py[:builder] or hf:DIR")
    if path.is_dir() and (path / "config.json").is_file():
        raise ModelFileError(f"{str(path)!r} is a folder holding a config.json; pass hf:{path} for a Hugging Face "
                             "config, or path/to/model.py[:builder]")
    if path.suffix != ".py":
        raise ModelFileError(f"model file {str(path)!r} is not a .py file; pass path/to/model.py[:builder]")
    if not path.is_file():
        raise ModelFileError(f"model file {str(path)!r} is not a file; pass path/to/model.py[:builder]")
    return path, builder_name, hashlib.sha256(path.read_bytes()).hexdigest()


def load_model_file(ref: str) -> ModelFile:
    """`path/to/model.py[:builder]`, or `hf:DIR` (an HFModel, planner/hf_model.py)."""
    from .hf_model import is_hf_ref, load_hf

    if is_hf_ref(ref):
        return load_hf(ref)
    path, builder_name, digest = file_digest(ref)
    import torch  # noqa: F401 - loaded before the user's code runs: a torch.py beside it (or it) cannot stand in

    name = f"smplan_model_{digest[:16]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    # its folder last on sys.path while it runs: `from lm import LM` finds lm.py beside it (the
    # executor's workers load the file through this function too, executor/train.py), and a sibling
    # named like an installed package (numpy.py) does not replace it
    folder = path.resolve().parent
    before = set(sys.modules)
    local_files: list[Path] = []
    sys.path.append(str(folder))
    try:
        spec.loader.exec_module(module)
    except SystemExit as err:  # a training script's sys.exit, or argparse's (code 2), at import
        sys.modules.pop(name, None)
        raise ModelFileError(f"{path}: importing it called sys.exit"
                             f"{f' ({err.code})' if err.code not in (None, 0) else ''}"
                             f"{', as argparse does on a command line it cannot parse' if err.code == 2 else ''}"
                             "; a model file must not exit at import: put a script's "
                             "top level under `if __name__ == \"__main__\":`") from None
    except SyntaxError as err:
        sys.modules.pop(name, None)
        raise ModelFileError(f"{path}: syntax error on line {err.lineno}: {err.msg}; fix the file") from None
    except Exception as err:  # noqa: BLE001 - user code
        sys.modules.pop(name, None)
        top = (getattr(err, "name", None) or "").partition(".")[0] if isinstance(err, ImportError) else ""
        if top and _sibling_of(folder, top) and not _from_folder(sys.modules.get(top), folder):
            raise ModelFileError(_hidden_sibling(path, top)) from None
        where = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename) == path.resolve()]
        line = f" on line {where[-1].lineno}" if where else ""
        raise ModelFileError(f"{path}: importing it raised {type(err).__name__}{line}: {first_line(err)}; fix the file") from None
    finally:
        if str(folder) in sys.path:  # the entry appended above (the user's code may have taken it off)
            del sys.path[len(sys.path) - 1 - sys.path[::-1].index(str(folder))]
        shadowed = _forget_siblings(folder, before, keep=name, loaded=local_files)
    if shadowed:
        raise ModelFileError(_hidden_sibling(path, shadowed[0]))
    builder = getattr(module, builder_name, None)
    if builder is None or not callable(builder):
        candidates = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                      and getattr(v, "__module__", None) == name and not isinstance(v, type)
                      and n not in ("batch", "loss", "tp_plan", "tp_plan_outer", "data", "init_weights",
                                    "context_parallel") and _callable_without_arguments(v)]
        hint = f"; functions there: {', '.join(candidates)}" if candidates else ""
        near = difflib.get_close_matches(builder_name, candidates, n=1)
        raise ModelFileError(
            f"{path}: no builder function {builder_name!r}{f' (did you mean {near[0]!r}?)' if near else ''}; "
            f"define def {builder_name}(**args) -> nn.Module "
            f"or name one with {path}:NAME{hint}"
        )
    return ModelFile(path=path, builder_name=builder_name, module=module, sha256=digest,
                     local_files=tuple(sorted(set(local_files))))


def _forget_siblings(folder: Path, before: set[str], keep: str, loaded: list[Path] | None = None) -> set[str]:
    """Drop from sys.modules the modules the model file's import loaded from its `folder` (its
    `lm.py`, a package `mylib/` beside it), so that another model file's own `lm.py` in another
    folder is not this one; the loaded model keeps its references. Only modules whose top-level
    name is a file or package directly in the folder go: not an installed package that happens to
    lie under it (a project's .venv), nor a module of a package loaded before (smplan's own, when
    the file lies in smplan's tree). Returns, sorted, the top-level modules the import took from
    elsewhere though a file or package of that name lies in the folder (installed modules come
    first on sys.path). `loaded` gets the files of the modules dropped."""
    shadowed = set()
    for mod_name in set(sys.modules) - before - {keep}:
        top = mod_name.partition(".")[0]
        if top in before or not _sibling_of(folder, top):
            continue
        if _from_folder(sys.modules[mod_name], folder):
            file = getattr(sys.modules.pop(mod_name), "__file__", None)
            if file and loaded is not None:
                loaded.append(Path(file).resolve())
        elif mod_name == top:
            shadowed.add(top)
    return sorted(shadowed)


def _hidden_sibling(path: Path, top: str) -> str:
    return (f"{path}: `import {top}` found the installed {top}, not {top}.py beside the model file; rename that "
            "file (an installed module comes first)")


def _sibling_of(folder: Path, top: str) -> bool:
    """Whether `top` names a module or package directly in `folder`."""
    return (folder / f"{top}.py").is_file() or (folder / top).is_dir()


def _from_folder(mod, folder: Path) -> bool:
    files = [getattr(mod, "__file__", None)] + list(getattr(mod, "__path__", None) or [])
    return any(f and Path(f).resolve().is_relative_to(folder) for f in files)


def parse_model_args(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """`--arg key=value` strings -> dict with int / float / bool / str values."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ModelFileError(f"--arg {item!r} needs the form key=value, e.g. --arg {item.strip() or 'layers'}=VALUE")
        key, raw = (s.strip() for s in item.split("=", 1))
        if key in out:
            raise ModelFileError(f"--arg {key} is given twice ({key}={out[key]!r} and {item!r}); keep one")
        out[key] = parse_scalar(raw)  # as --hw-set parses its values
    return out

