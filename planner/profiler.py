"""`profile_model`: a model file -> ModelProfile, on the meta device, in seconds.

How a model is cut into parts:
- The repeated blocks are the run of structurally identical modules (same class tree,
  same parameter shapes) inside an `nn.ModuleList` / `nn.Sequential` that holds the most
  parameters; for a transformer that is the longest run, the layers (never the experts
  inside one layer, whose run holds fewer parameters than the layers around them).
- Every other module next to the path from the root to those blocks is a part of its own,
  `pre` if it runs before the first block and `post` otherwise; the file's `loss` is the
  last post part. Ops in forward code outside any such module go to a part "forward".
- Only the first block runs; the others return its output (they are identical), so a
  96-layer model costs one layer of tracing.

Conventions: figures are per sample (the file's `batch(1)`). `seq_len` is dim 1 of the
first input when that input is an integer (token) tensor of two or more dims, else 0.
`num_heads` is what tensor parallelism must divide: `model.config`'s `kv_heads` (or
`num_key_value_heads`), else its `heads` / `num_heads` / `n_head` /
`num_attention_heads` (attribute or dict key), else the key/value heads of a block's
scaled_dot_product_attention call (dim -3 of its 4-D key), else 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from smplan.progress import said_after

from . import profile_cache
from .feasibility import profile_dtype
from .model_file import file_digest, load_model_file
from .model_profile import ModelProfile

# Bump when the numbers a profile holds change meaning; old cache entries are then ignored.
PROFILER_VERSION = 36  # 2: elementwise_fusible_bytes_per_sample; 3: tp_plan_outer, params_tp_sharded, output_tp_sharded; 4: unsupported dimensions; 5: experts (num_experts, top_k, params_expert, expert/router FLOPs, all-to-all bytes), attention K/V bytes; 6: K/V bytes of unfused attention too; 7: saved_bytes_expert_per_sample; 8: GQA SDPA as flash, grouped_mm experts; 9: fused RMSNorm's saved bytes, attention core by origin, sac fields; 10: unsupported["cp"] (no context_parallel hook); 11: unsupported["ep"], fusion keys never reused; 12: the loss's saved bytes exclude its input (the logits, counted in the loss buffer); 13: fused attention kernels tagged (MatmulShape.kernel), one shape per call; 14: one record per fused attention call; 15: its head dim is the mean of the q k and v head dims (MLA); 16: hf: seq_len checked against a learned position table (older entries skipped the check); 17: a ModuleList of ModuleLists holds its blocks one level down (its parameters were lost); 18: transformers 5 expert banks found beside their router (MixtralExperts, not MixtralTopKRouter; not the MoE block around them); 19: hf: a tp plan entry for another kind of layer is skipped (Qwen3-MoE), reasons say what an hf: user can change; 20: a top-level TP-styled module (vocab-parallel embedding or head of hf: and moe.py) keeps its collective and sharded output; 21: a Parameter tied across pipeline pieces (embedding and head) or dict/tuple inputs refuse pp, a file without loss() profiles the default loss; 22: num_heads from a block's SDPA key without a config; 23: the query's heads under MQA; 24: sp offered only where the TP hooks map it (Gemma2 sandwich norms refuse); 25: forward_kernels (kernels a part's forward launches); 26: unsupported["sp"] says why sp is left out; 27: unsupported["pp"] names the forward's line that met a None layer, and same-class blocks that differ; 28: seq_len from the token ids (a dict's input_ids, else the first integer tensor), not the first input; 29: the pp reason lists same-class blocks run by run (another class between ends a run); 30: saved_bytes_gathered_per_sample (column-parallel inputs); 31: saved bytes FP8 or fused kernels keep otherwise (saved_bytes_fp8_input_*, saved_bytes_refusable_*); 32: loss_peak_bytes_per_sample; 33: unsupported["tp"] where the block's forward fails on tp's local shards; 34: num_heads held to the largest tp the block runs at (repeat_kv); 35: entries record the modules beside the model file that it imports (profile_cache depends); 36: unsupported["tp"] where the block computes something else on tp's shards (tp_equivalence), and where its forward fails with out_features kept global as torch's styles keep it
DTYPES = ("bf16", "fp16", "fp32")


class ProfileError(ValueError):
    """The profile request itself is wrong (e.g. an unknown dtype); the message says the fix."""


def profile_model(
    ref: str,
    args: dict | None = None,
    seq_len: int | None = None,
    dtype: str = "bf16",
    cache: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ModelProfile:
    """Profile `path/to/model.py[:builder]` built with `args` (and `seq_len`, if given).

    >>> p = profile_model("examples/gpt.py:tiny")
    >>> p.num_blocks, p.params, p.train_flops_per_sample
    """
    dtype = profile_dtype(dtype)  # an fp8 plan's activations are bf16: profile at bf16
    if dtype not in DTYPES:
        raise ProfileError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    args = dict(args or {})
    if seq_len is not None and args.get("seq_len", seq_len) != seq_len:  # one would silently win
        raise ProfileError(f"two sequence lengths: --seq-len {seq_len} and --arg seq_len={args['seq_len']} (or a "
                           "plan file's seq_len and model_args); give it once")
    path, builder, digest = file_digest(ref)
    folder = Path(path).resolve().parent  # where the modules it imports beside it lie
    key = profile_cache.key(file_sha256=digest, builder=builder, args=args, seq_len=seq_len, dtype=dtype,
                            version=PROFILER_VERSION)
    if cache:
        hit = profile_cache.load(key, folder)
        if hit is not None:
            return dataclasses.replace(hit, model=ref)
    model_file = load_model_file(ref)  # a wrong file or builder name is the only line the user sees
    if hasattr(model_file, "check_args"):  # ...and so is a wrong --arg or an hf: config transformers refuses
        model_file.check_args(args)
    # Tracing a block takes seconds: say so, once a second has passed (a builder that fails at once,
    # on a wrong --arg, then prints its one error line alone).
    with said_after(progress, f"profiling {ref} on the meta device ({dtype}; cached for the next run) ..."):
        from .profiler_run import run_profile  # imports torch: only when there is work to do

        profile = run_profile(ref, model_file, args, seq_len, dtype)
    if cache:
        profile_cache.store(key, profile, getattr(model_file, "local_files", ()), folder)
    return profile
