"""Hugging Face causal LMs as models: `hf:DIR` (a folder with a Hub `config.json`) and
model files whose builder returns a `transformers.PreTrainedModel`.

`HFModel` has the `ModelFile` interface (builder, hook, accepts, build, sha256, path,
builder_name), so the profiler, planner and executor take it unchanged. Nothing is
downloaded: the model is built from the config (`AutoModelForCausalLM.from_config`) on the
requested device, the meta device for profiling.

- `--arg key=value` overrides a config field (`--arg num_hidden_layers=2`); `seq_len` is the
  batch length, default `min(max_position_embeddings, 4096)` (2048 without one); beyond a
  learned position table (GPT-2's `wpe`) it is refused, beyond a rotary model's context not.
- Hooks (also what a model file returning a PreTrainedModel gets for those it lacks):
  `batch` (synthetic tokens in the vocabulary; targets are the inputs shifted by one, as
  `--data` streams give them), `loss` (causal-LM cross-entropy on `outputs.logits`, a
  DTensor under loss_parallel), `tp_plan(block)` / `tp_plan_outer(model)` from the config's
  own `base_model_tp_plan` (transformers' style strings mapped to torch's styles).
- Sequence parallelism: the embedding stays whole (transformers derives positions, rotary
  embeddings and the mask from its length), the first layer splits it into shards.
- No pipeline parallelism: HF forwards do not skip None layers; the capability check
  (smplan.model.capabilities) finds that and records it in the profile.
- Refused in one line: encoder-only configs (BERT without is_decoder: bidirectional attention
  would see the targets), encoder-decoders and configs with no causal-LM class (T5), and
  --arg values transformers' config checks reject (field types, heads vs hidden size).
- fp32 MoE profiles: torch._grouped_mm's meta kernel takes bf16 only; `meta_forward` gives it
  fp32 shapes while profiling (an fp32 run on CPU uses the real kernel).
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import functools
import hashlib
import inspect
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .hf_checks import (
    causal_lm_class,
    check_causal,
    check_heads,
    check_positions,
    derived_head_dim,
    strict_errors,
)
from .model_file import ModelFileError, first_line, format_args

PREFIX = "hf:"
BUILDER = "hf"
# The default batch length: the model's context, capped to keep a default profile and plan
# cheap (Llama 3's 8192 context plans at 4096 unless --arg seq_len=8192 says otherwise).
DEFAULT_SEQ_CAP = 4096
DEFAULT_SEQ_LEN = 2048  # for configs without max_position_embeddings (GPT-2 era: n_positions)
SEQ_ARG = "seq_len"
DEFAULT_INIT_STD = 0.02  # transformers' initializer_range default (LlamaConfig, MistralConfig, Qwen2Config)
_SEQ_ATTR = "smplan_seq_len"  # where build() leaves the batch length on the config


class TPUnsupported(ModelFileError):
    """The config's tensor-parallel plan uses a style torch's ColwiseParallel/RowwiseParallel
    cannot express: the profiler records the message as profile.unsupported["tp"]."""


def is_hf_ref(ref) -> bool:
    return isinstance(ref, str) and ref.startswith(PREFIX)


def hf_dir(ref: str) -> Path:
    return Path(ref[len(PREFIX):])


def config_path(ref: str) -> Path:
    """`hf:DIR` -> DIR/config.json, checked (one line naming the fix otherwise)."""
    folder = hf_dir(ref)
    if not ref[len(PREFIX):].strip():  # Path("") is ".", which is a folder
        raise ModelFileError("hf: needs a folder, e.g. hf:models/llama3-8b holding a config.json from the Hub")
    if not folder.is_dir():
        raise ModelFileError(f"{ref}: {str(folder)!r} is not a folder; pass hf:DIR where DIR holds a config.json")
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise ModelFileError(f"{ref}: {folder} has no config.json; put the model's Hub config.json there")
    return cfg


def hf_digest(ref: str) -> tuple[Path, str, str]:
    """(folder, builder name, sha256 of config.json): the profile cache key, without importing transformers."""
    cfg = config_path(ref)
    return hf_dir(ref), BUILDER, hashlib.sha256(cfg.read_bytes()).hexdigest()


def load_hf(ref: str) -> HFModel:
    folder, _, digest = hf_digest(ref)
    try:
        raw = json.loads(config_path(ref).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ModelFileError(f"{ref}: config.json is not valid JSON ({first_line(err)}); fix the file") from None
    if not isinstance(raw, dict):
        raise ModelFileError(f"{ref}: config.json holds {type(raw).__name__}, not an object; fix the file")
    return HFModel(path=folder, sha256=digest, raw_config=raw)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ModelFileError("hf: models need transformers; pip install 'smplan[hf]'") from None
    return transformers


@dataclass(frozen=True)
class HFModel:
    """A Hub config as a model (the ModelFile interface)."""

    path: Path  # the folder holding config.json
    sha256: str  # of config.json
    raw_config: dict = field(repr=False, compare=False, default_factory=dict)
    builder_name: str = BUILDER
    # transformers' code, none of it the user's: a reason a dimension cannot run says use 1
    # (smplan.model.hf_config_fix), not what to change in a model file
    is_hf_config: bool = field(default=True, init=False, repr=False, compare=False)

    @property
    def ref(self) -> str:
        return f"{PREFIX}{self.path}"

    @property
    def absolute_ref(self) -> str:
        return f"{PREFIX}{self.path.resolve()}"

    @property
    def builder(self):
        return self.build

    @property
    def has_tp_plan(self) -> bool:
        return bool(self.raw_config.get("base_model_tp_plan")) or self._class_has_tp_plan()

    def _class_has_tp_plan(self) -> bool:
        try:
            return bool(self.config().base_model_tp_plan)
        except ModelFileError:
            return False

    def hook(self, name: str):
        if name == "init_weights":
            std = self.raw_config.get("initializer_range", DEFAULT_INIT_STD)
            return functools.partial(init_weights, std=std if isinstance(std, float) else DEFAULT_INIT_STD)
        return HOOKS.get(name)

    def config(self, args: dict | None = None):
        """The transformers config with `args` (other than seq_len) set on it."""
        tf = _transformers()
        try:
            cfg = tf.AutoConfig.from_pretrained(str(self.path), local_files_only=True)
        except (ValueError, KeyError, OSError, *strict_errors()) as err:
            # transformers 5 configs check field types and relations (hidden size a multiple of the heads)
            raise ModelFileError(f"{self.ref}: transformers cannot read config.json ({first_line(err.__cause__ or err)}); "
                                 "check model_type and the fields") from None
        overrides = {k: v for k, v in (args or {}).items() if k != SEQ_ARG}
        derived = derived_head_dim(cfg, overrides)
        for key, value in {**overrides, **derived}.items():
            try:
                setattr(cfg, key, value)
            except strict_errors() as err:  # transformers 5 configs check field types on assignment
                cause = first_line(err.__cause__ or err)
                raise ModelFileError(f"{self.ref}: --arg {key}={value!r} is refused ({cause}); "
                                     "pass a value of that type") from None
        layers, kinds = overrides.get("num_hidden_layers"), getattr(cfg, "layer_types", None)
        if isinstance(layers, int) and layers > 0 and "layer_types" not in overrides and isinstance(kinds, list) \
                and kinds and len(kinds) != layers:
            # a per-layer list (Gemma 2's sliding / full attention) follows the layer count (else
            # validate() refuses): the file's first N, or for more layers than it lists the class's
            # own pattern, as transformers builds it without the list
            if layers < len(kinds):
                cfg.layer_types = kinds[:layers]
            else:
                fields = {k: v for k, v in cfg.to_dict().items() if k != "layer_types"}
                cfg = type(cfg)(**fields)
        if overrides and hasattr(cfg, "validate"):  # transformers' @strict architecture checks (heads | hidden)
            try:
                cfg.validate()
            except (ValueError, TypeError, *strict_errors()) as err:
                raise ModelFileError(f"{self.ref}: --arg {format_args(overrides)} makes an invalid {type(cfg).__name__} "
                                     f"({first_line(err.__cause__ or err)}); change the --arg values") from None
        return cfg

    def builder_parameters(self) -> dict[str, inspect.Parameter]:
        """The config's fields and seq_len, with their values as defaults (what --arg may set)."""
        kw = inspect.Parameter.KEYWORD_ONLY
        params = {k: inspect.Parameter(k, kw, default=v) for k, v in self.raw_config.items()
                  if k.isidentifier() and not k.startswith("_")}
        params[SEQ_ARG] = inspect.Parameter(SEQ_ARG, kw, default=default_seq_len(self.raw_config))
        return params

    def accepts(self, arg: str) -> bool:
        return arg == SEQ_ARG or arg in self.raw_config or self._is_config_attr(arg)

    def _is_config_attr(self, arg: str) -> bool:
        try:
            return hasattr(self.config(), arg)
        except ModelFileError:
            return False

    def check_args(self, args: dict) -> None:
        """Raise ModelFileError for an --arg or a config.json field transformers cannot build
        (profile_model asks before it says it is profiling)."""
        self._checked_config(dict(args or {}))

    def _checked_config(self, args: dict):
        """The config with `args` set, after the checks transformers does not make (or makes
        with a traceback)."""
        unknown = [k for k in args if not self.accepts(k)]
        if unknown:
            near = difflib.get_close_matches(unknown[0], list(self.builder_parameters()), n=1)
            raise ModelFileError(f"{self.ref}: config.json has no field {unknown[0]!r}"
                                 f"{f' (did you mean {near[0]!r}?)' if near else ''}; --arg sets config fields "
                                 f"(e.g. num_hidden_layers) or seq_len")
        for key, value in args.items():  # counts and sizes: transformers builds a negative one without a word
            if ((key.startswith("num_") or key.endswith("_size")) and isinstance(value, int | float)
                    and not isinstance(value, bool) and value < 0):
                raise ModelFileError(f"{self.ref}: --arg {key}={value} is negative; counts and sizes are >= 0")
        seq_len = args.get(SEQ_ARG)
        if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
            raise ModelFileError(f"{self.ref}: --arg seq_len must be a positive whole number, got {seq_len!r}")
        cfg = self.config(args)
        for key in WIDTHS:  # a zero width builds nothing sensible (transformers divides by some)
            value = getattr(cfg, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value < 1:
                where = f"--arg {key}" if key in args else f"config.json's {key}"
                raise ModelFileError(f"{self.ref}: {where} is {value}; it must be at least 1")
        check_heads(cfg, self.ref)
        return cfg

    def build(self, args: dict | None = None, device: str | None = "meta", dtype=None):
        import torch

        args = dict(args or {})
        cfg = self._checked_config(args)
        seq_len = args.get(SEQ_ARG)
        cfg.use_cache = False  # training: no KV cache kept beside what autograd saves
        setattr(cfg, _SEQ_ATTR, seq_len or default_seq_len(cfg.to_dict()))
        tf = _transformers()
        model_class = causal_lm_class(cfg, self.ref)
        # SDPA where the class has it; attention-free (Mamba) and eager-only (Bloom) classes run
        # transformers' default, "eager" (modeling_utils.get_correct_attn_implementation)
        kwargs = {"attn_implementation": "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"}
        if dtype is not None:
            kwargs["dtype" if _takes_dtype(tf) else "torch_dtype"] = dtype
        try:
            with torch.device(device) if device else _null():
                model = tf.AutoModelForCausalLM.from_config(cfg, **kwargs)
        except (ValueError, TypeError, AssertionError, KeyError, ArithmeticError, *strict_errors()) as err:
            given = {k: v for k, v in args.items() if k != SEQ_ARG}
            fix = f"check the --arg values ({format_args(given)})" if given else "check config.json's fields"
            raise ModelFileError(f"{self.ref}: transformers cannot build this config "
                                 f"({type(err).__name__}: {first_line(err)}); {fix}") from None
        check_causal(model, self.ref)
        check_positions(model, getattr(cfg, _SEQ_ATTR), self.ref)
        return model


# The config fields a model's tensors are sized by: 0 (or less) is a typo, not a model.
WIDTHS = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "head_dim")


def record_seq_len(model, seq_len, ref) -> None:
    """A model file's builder that takes seq_len and returns a PreTrainedModel: its seq_len (the
    argument, else its default) is the batch length batch() gives, not the config's context."""
    if isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len > 0:
        check_positions(model, seq_len, ref)
        setattr(model.config, _SEQ_ATTR, seq_len)


def _takes_dtype(tf) -> bool:
    """transformers 5 renamed from_config's torch_dtype to dtype."""
    return int(tf.__version__.split(".")[0]) >= 5


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def max_positions(config: dict) -> int | None:
    """The context the config states (max_position_embeddings; GPT-2 era n_positions), or None."""
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def default_seq_len(config: dict) -> int:
    limit = max_positions(config)
    return min(limit, DEFAULT_SEQ_CAP) if limit is not None else DEFAULT_SEQ_LEN


def capped_context(ref, args: dict | None = None, seq_len: int | None = None) -> int | None:
    """The context an hf: model's config states (with --arg overrides) when the default batch length
    capped it at DEFAULT_SEQ_CAP, i.e. neither --seq-len nor --arg seq_len chose one; else None."""
    args = args or {}
    if not is_hf_ref(ref) or seq_len is not None or SEQ_ARG in args:
        return None
    try:
        limit = max_positions({**load_hf(ref).raw_config, **args})
    except ModelFileError:  # the profile has said what is wrong with it already
        return None
    return limit if limit is not None and limit > DEFAULT_SEQ_CAP else None


def is_hf_module(model) -> bool:
    """Whether `model` is a transformers PreTrainedModel. Its class comes from
    transformers.modeling_utils, so with that module never imported it cannot be one; importing
    it only to ask costs about 2 s a process (measured: `python -X importtime`, 2 cores)."""
    modeling_utils = sys.modules.get("transformers.modeling_utils")
    return modeling_utils is not None and isinstance(model, modeling_utils.PreTrainedModel)


def _seq_len_of(model) -> int:
    cfg = model.config
    value = getattr(cfg, _SEQ_ATTR, None)
    return value if isinstance(value, int) and value > 0 else default_seq_len(cfg.to_dict())


@contextlib.contextmanager
def meta_forward(mf=None):
    """Let transformers' forwards run on the meta device while the profiler traces them.

    Without a KV cache (training), transformers >= 4.52 checks position_ids for packed
    sequences (masking_utils.find_packed_sequence_indices), an `if` on a tensor's value:
    `Tensor.item()` on meta. batch() gives one sequence per row, so on meta the answer is
    None (not packed), the check's own result for such a batch. Patched only while profiling."""
    mu = None
    if isinstance(mf, HFModel) or "transformers" in sys.modules:  # a model file using it imported it
        with contextlib.suppress(ImportError):
            import transformers.masking_utils as mu
    original = getattr(mu, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return

    def unpacked_on_meta(position_ids, *args, **kwargs):
        if isinstance(position_ids, __import__("torch").Tensor) and position_ids.device.type == "meta":
            return None
        return original(position_ids, *args, **kwargs)

    mu.find_packed_sequence_indices = unpacked_on_meta
    try:
        with _grouped_mm_meta_any_dtype():
            yield
    finally:
        mu.find_packed_sequence_indices = original


@contextlib.contextmanager
def _grouped_mm_meta_any_dtype():
    """torch._grouped_mm's meta kernel accepts bf16 only (torch/_meta_registrations.py mirrors the
    CUDA fast path), while its CPU kernel runs fp32 too: an fp32 MoE (transformers 5's grouped_mm
    experts) trains on CPU but could not be traced on meta. While profiling, the meta kernel
    gives other dtypes their output shape, so the tracer sees the same aten._grouped_mm calls,
    FLOPs and parameters as in bf16, and fp32 bytes; bf16 keeps torch's own kernel and checks."""
    import torch

    original = getattr(getattr(torch, "_meta_registrations", None), "meta_grouped_mm", None)
    if original is None or not hasattr(torch.ops.aten, "_grouped_mm"):
        yield
        return

    def meta(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
        if mat_a.dtype == mat_b.dtype == torch.bfloat16:
            return original(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)
        # the output shapes of torch's meta kernel (_meta_registrations._create_grouped_mm_output_tensor)
        if mat_a.dim() == 2:  # x [tokens, k] @ w [groups, k, n]; 2-D x 2-D: a weight gradient per group
            shape = (offs.size(0), mat_a.size(0), mat_b.size(1)) if mat_b.dim() == 2 else (mat_a.size(0), mat_b.size(-1))
        else:
            shape = (mat_a.size(1), mat_b.size(1)) if mat_b.dim() == 2 else (mat_a.size(0), mat_a.size(1), mat_b.size(-1))
        return mat_a.new_empty(shape, dtype=out_dtype or mat_a.dtype)

    lib = torch.library.Library("aten", "IMPL")  # dropped on exit: torch's kernel is back
    try:
        lib.impl("_grouped_mm", meta, "Meta")
    except RuntimeError:  # a torch that will not override its own kernel: bf16 profiles still trace
        lib._destroy()
        yield
        return
    try:
        yield
    finally:
        lib._destroy()


# -- hooks ----------------------------------------------------------------------------------

def batch(micro_batch_size: int, model=None, seed: int = 0):
    """Synthetic tokens in the vocabulary: (input_ids, targets), targets already shifted by one
    (transformers' `shift_labels` convention, the same as --data streams)."""
    import torch

    if model is None or not hasattr(getattr(model, "config", None), "vocab_size"):
        raise ModelFileError("the Hugging Face batch() needs the model (its config's vocab_size)")
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (micro_batch_size, _seq_len_of(model) + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss(outputs, targets):
    """Causal-LM cross-entropy on the logits against pre-shifted targets, in fp32 as
    transformers' ForCausalLMLoss; `F.cross_entropy`, so loss_parallel takes vocab-sharded logits."""
    import torch.nn.functional as F

    logits = outputs.logits if hasattr(outputs, "logits") else outputs
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def init_weights(module, std: float = DEFAULT_INIT_STD) -> None:
    """transformers' PreTrainedModel._init_weights for decoder LMs, one module at a time:
    matrices (Linear, Embedding, expert weights) N(0, initializer_range), biases zero, norm
    weights one, an Embedding's padding row zero."""
    import torch

    for name, p in module.named_parameters(recurse=False):
        if name == "bias" or (p.dim() == 1 and "norm" not in type(module).__name__.lower()):
            torch.nn.init.zeros_(p)
        elif p.dim() == 1:
            torch.nn.init.ones_(p)
        else:
            torch.nn.init.normal_(p, mean=0.0, std=std)
    padding = getattr(module, "padding_idx", None)
    if isinstance(module, torch.nn.Embedding) and padding is not None:
        with torch.no_grad():
            module.weight[padding].zero_()


def _config_of(module):
    from transformers import PretrainedConfig

    for m in module.modules():
        cfg = getattr(m, "config", None)
        if isinstance(cfg, PretrainedConfig):
            return cfg
    raise ModelFileError(f"{type(module).__name__} carries no transformers config; its tp_plan cannot be read")


def _style(name: str, style: str):
    """transformers' tensor-parallel style strings (integrations/tensor_parallel.py) as torch styles."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {
        "colwise": lambda: ColwiseParallel(),
        "rowwise": lambda: RowwiseParallel(),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
    }
    if style in ("replicate", "replicated_with_grad_allreduce", "isolated"):
        return None  # stays whole on every rank
    if style not in styles:
        raise TPUnsupported(f"the config's base_model_tp_plan shards {name} as {style!r}, which smplan does not map "
                            f"to torch's styles (it maps {', '.join(styles)})")
    return styles[style]()


def tp_plan(block, sequence_parallel: bool = False) -> dict:
    """The config's `base_model_tp_plan` entries under the repeated layers (`layers.*.X`), named
    relative to one decoder layer. Under sequence parallelism (Korthikanti et al. 2022) the
    norms run on sequence shards, attention and MLP inputs are all-gathered and the
    row-parallel outputs reduce-scattered back to shards (torchtitan's parallelize_llama)."""
    cfg = _config_of(block)
    plan, entries, matched = {}, 0, 0
    # modules and parameters: newer plans name packed expert weights (mlp.experts.gate_up_proj)
    present = [name for name, _ in block.named_modules() if name] + [name for name, _ in block.named_parameters()]
    for key, style in (cfg.base_model_tp_plan or {}).items():
        head, star, rest = key.partition(".*.")
        if not star:
            continue  # a part around the blocks: tp_plan_outer's
        entries += 1
        if not any(fnmatch.fnmatchcase(name, rest) for name in present):
            continue  # another kind of layer's (Qwen3-MoE's plan names the dense MLP of its mlp_only_layers)
        matched += 1
        torch_style = _style(key, style)
        if torch_style is not None:
            plan[rest] = torch_style
    if entries and not matched:
        raise TPUnsupported(f"{type(cfg).__name__}'s base_model_tp_plan names none of {type(block).__name__}'s "
                            "modules, so tensor parallelism would shard nothing")
    if not entries:
        raise TPUnsupported(f"{type(cfg).__name__} has no base_model_tp_plan for its layers (transformers ships no "
                            "tensor-parallel plan for this model)")
    return _sequence_parallel(block, plan) if sequence_parallel else plan


def _sequence_parallel(block, plan: dict) -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleInputOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    children = dict(block.named_children())
    norms = [n for n in ("input_layernorm", "post_attention_layernorm") if n in children]
    if len(norms) != 2 or "self_attn" not in children or "mlp" not in children:
        raise TPUnsupported(f"{type(block).__name__} is not a pre-norm self_attn/mlp layer; sequence "
                            "parallelism is not mapped for it; use sp=0")
    # Sandwich norms (Gemma2/3: pre_/post_feedforward_layernorm around the MLP, and
    # post_attention_layernorm on the attention's output, not its input) put a norm where this
    # mapping has a plain tensor: the residual add then meets a DTensor and fails in execute.
    # The rule goes by the children's names: a norm module named without "norm" would pass it.
    extra = sorted(n for n in children if n not in norms and "norm" in n.lower())
    if extra:
        raise TPUnsupported(f"{type(block).__name__} has norms {', '.join(extra)} beyond a pre-norm layer's two; "
                            "sequence parallelism is not mapped for it; use sp=0")
    out = {n: SequenceParallel() for n in norms}
    # transformers calls self_attn(hidden_states=..., ...) by keyword and mlp(hidden_states) positionally
    out["self_attn"] = PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                          desired_input_kwarg_layouts={"hidden_states": Replicate()})
    if any(name.startswith("mlp.") for name in plan):
        out["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    else:
        # An MLP the config leaves whole (Mixtral's MoE block: router and experts replicated) runs
        # on plain tensors over the gathered sequence on every rank, then keeps its own shard
        # (torchtitan's apply_moe_ep_tp prepares its MoE so, there with Partial, tp-sharded experts).
        out["mlp"] = PrepareModuleInputOutput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                              use_local_input=True, output_layouts=(Replicate(),),
                                              desired_output_layouts=(Shard(1),), use_local_output=True)
    for name, style in plan.items():
        out[name] = RowwiseParallel(output_layouts=Shard(1)) if type(style) is RowwiseParallel else style
    return out


def tp_plan_outer(model, sequence_parallel: bool = False) -> dict:
    """Vocab-parallel embedding and head (Megatron; torchtitan's parallelize_llama): the logits
    stay a DTensor sharded over the vocabulary so the loss runs under loss_parallel. A tied
    embedding and head (one Parameter, sharded two ways) stay replicated. Under sequence
    parallelism the embedding stays whole (transformers derives positions, rotary embeddings
    and the mask from its length), the first layer splits it into sequence shards, the final
    norm runs on shards and the head all-gathers them."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = embed is not None and head is not None and getattr(embed, "weight", None) is getattr(head, "weight", 0)
    names = {id(m): n for n, m in model.named_modules() if n}
    plan = {}
    if not tied and id(embed) in names:
        plan[names[id(embed)]] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if not tied and id(head) in names:
        plan[names[id(head)]] = ColwiseParallel(input_layouts=Shard(1) if sequence_parallel else Replicate(),
                                                output_layouts=Shard(-1), use_local_output=False)
    elif tied and sequence_parallel and id(head) in names:  # a replicated head takes the whole sequence
        plan[names[id(head)]] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                   use_local_output=True)
    if sequence_parallel:
        base = getattr(model, getattr(model, "base_model_prefix", ""), None)
        layers, norm = getattr(base, "layers", None), getattr(base, "norm", None)
        if base is None or not isinstance(layers, __import__("torch").nn.ModuleList) or norm is None or id(base) not in names:
            raise TPUnsupported(f"{type(model).__name__} has no model.layers / model.norm; sequence parallelism is "
                                "not mapped for it; use sp=0")
        prefix = names[id(base)]
        # the first layer a chunk holds: with pp off (HF forwards), layer 0
        plan[f"{prefix}.layers.0"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                                        use_local_output=True)
        plan[f"{prefix}.norm"] = SequenceParallel()
    return plan


HOOKS = {"batch": batch, "loss": loss, "tp_plan": tp_plan, "tp_plan_outer": tp_plan_outer, "init_weights": init_weights}
