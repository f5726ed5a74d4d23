"""What a Hugging Face config must be for `hf:` to train it, checked before or right after the
build, each refusal one line naming the fix (planner/hf_model.py builds; these say no):
a causal LM (not an encoder or an encoder-decoder), query heads in whole groups per key/value
head, a batch no longer than a learned position table, --arg values of the config's types."""

from __future__ import annotations

from .model_file import ModelFileError

# Names transformers gives learned absolute position tables: GPT-2 / GPT-Neo / BioGPT "wpe",
# OPT / XGLM "embed_positions", BERT-style "position_embeddings" (transformers' modeling files).
LEARNED_POSITION_TABLES = ("wpe", "embed_positions", "position_embeddings")


def causal_lm_class(cfg, ref: str):
    """The class AutoModelForCausalLM builds for `cfg`, or one line on why there is none."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    name = type(cfg).__name__
    if type(cfg) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]
    what = ("is an encoder-decoder model" if getattr(cfg, "is_encoder_decoder", False)
            else f"(model_type {cfg.model_type!r}) has no causal-LM class in transformers")
    raise ModelFileError(f"{ref}: {name} {what}, which hf: does not support; hf: trains causal (decoder-only) "
                         "language models: use a decoder config (Llama, Qwen2, GPT-2, ...) or a model file "
                         "with batch()/loss()")


def check_causal(model, ref: str, fix: str | None = None) -> None:
    """Refuse a bidirectional encoder built as a causal LM: BertLMHeadModel with is_decoder=False
    attends to the tokens it predicts. The encoder families (those with a masked-LM class) are
    causal only with is_decoder=True (modeling_bert.BertLayer); others mark their attention
    modules' `is_causal` (modeling_llama.LlamaAttention)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING

    cfg = model.config
    if getattr(cfg, "is_decoder", False) or getattr(cfg, "causal", False) is True:  # XLMConfig(causal=True)
        return
    flags = {m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)}
    if type(cfg) in MODEL_FOR_MASKED_LM_MAPPING or flags == {False}:
        decoder = " (or --arg is_decoder=true)" if hasattr(cfg, "is_decoder") else ""
        fix = fix or (f"hf: trains causal language models: use a decoder config{decoder} or a model file with "
                      "batch()/loss()")
        raise ModelFileError(f"{ref}: {type(cfg).__name__} is an encoder-only model (bidirectional attention: "
                             f"it would see the tokens it predicts); {fix}")


def check_heads(cfg, ref: str) -> None:
    """Grouped-query attention serves each key/value head to a whole group of query heads
    (Ainslie et al. 2023): transformers repeats them num_attention_heads // num_key_value_heads
    times and fails at the first forward on a remainder."""
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    if isinstance(heads, int) and isinstance(kv, int) and heads > 0 and kv > 0 and heads % kv:
        raise ModelFileError(f"{ref}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv} "
                             "(each key/value head serves a group of query heads); change either with --arg")


def derived_head_dim(cfg, overrides: dict) -> dict:
    """{"head_dim": hidden // heads} when --arg changes hidden_size or num_attention_heads of a
    config.json whose head_dim is that quotient (as Llama's and Qwen's files write it) and leaves
    head_dim itself: the stale value would build projections of the old width, silently. A
    head_dim the file sets apart from the quotient (Gemma, Qwen3) is the user's to change."""
    names = ("hidden_size", "num_attention_heads")
    if "head_dim" in overrides or not any(n in overrides for n in names):
        return {}
    hidden, heads, head_dim = (getattr(cfg, n, None) for n in (*names, "head_dim"))
    if not all(isinstance(v, int) and v > 0 for v in (hidden, heads, head_dim)) or head_dim != hidden // heads:
        return {}
    new_hidden, new_heads = (overrides.get(n, v) for n, v in zip(names, (hidden, heads), strict=True))
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (new_hidden, new_heads)):
        return {}  # a wrong type or value: setting it on the config says so (HFModel.config)
    return {"head_dim": new_hidden // new_heads}


def check_positions(model, seq_len: int, ref) -> None:
    """A learned position table (GPT-2's wpe, OPT's embed_positions) holds so many positions
    and no more: a longer batch fails at its first forward. Rotary and ALiBi models have no
    table and run longer sequences (untrained there), so pass."""
    import torch

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and name.rsplit(".", 1)[-1] in LEARNED_POSITION_TABLES:
            limit = positions_held(module)
            if seq_len > limit:
                raise ModelFileError(
                    f"{ref}: seq_len {seq_len} is beyond the {limit} positions its learned position table "
                    f"({name}) holds; pass --seq-len N (or --arg seq_len=N) with N <= {limit}")


def positions_held(table) -> int:
    """How many positions a learned table serves: its rows, less those before position 0 (OPT's
    `offset` of 2; RoBERTa-style tables count from padding_idx + 1, modeling_roberta.py)."""
    skipped = getattr(table, "offset", 0) or 0
    if table.padding_idx is not None:
        skipped = max(skipped, table.padding_idx + 1)
    return table.num_embeddings - skipped


def strict_errors() -> tuple:
    """huggingface_hub's @strict dataclass errors (transformers 5 configs), or none before it had them."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)
