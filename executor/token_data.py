"""Token data from disk: flat binaries of token ids, memory-mapped, never read whole.

`--data PATH` is one of
  - a flat binary of token ids (nanoGPT's train.bin; the .bin of Megatron's indexed
    dataset, whose .idx is not needed), dtype --data-dtype (uint16 or uint32);
  - a .npy array (its own integer dtype);
  - a folder of such files: the .bin/.npy files in it, sorted by name, read as one stream.

The stream is cut into consecutive sequences of seq_len+1 tokens (the last partial one is
dropped); inputs are the first seq_len tokens, targets the same shifted by one. Step k
(1-based) trains on sequences (k-1)*G .. k*G-1 (G = global batch), in the order the
synthetic batches use (executor/data.py): micro-batch i of dp-rank r holds the global
micro-batch j = r*m + i, i.e. sequences (k-1)*G + j*mbs + b. Every layout (dp, tp, pp,
micro-batch split) therefore sees the same global batch at the same step.

When the sequences run out the stream wraps around: sequence index s reads sequence
s mod N of the file (N sequences), in epoch s // N. The position is a function of the step
alone, so a resumed run neither repeats nor skips data; checkpoints record it anyway.

Refused before launch, one line each: a file that is neither .bin nor .npy (a script or text
file given by mistake), a uint32 file read as uint16 (every other sampled token 0), ids outside
the model's vocabulary (Vocab: from its config, else from the embedding the ids index).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
SUFFIXES = (".bin", ".npy")
# How many tokens the vocabulary check reads: the first and last chunk of every shard and
# evenly spaced windows across the stream (a cheap sample, not a full scan).
CHECK_CHUNK_TOKENS = 1 << 16
CHECK_WINDOWS = 64
CHECK_WINDOW_TOKENS = 1024
# The fewest tokens of a shard's first chunk the uint32-read-as-uint16 test judges: 512 zeros at
# every odd index of a real uint16 stream do not happen (this module's choice, not measured).
WIDE_CHECK_MIN_TOKENS = 1024
# The content digest a resume holds --data against reads this many windows of this many bytes,
# evenly spaced over the whole stream (its first and last bytes among them): 4 MiB at most, however
# many shards (a review's 1,000-shard folder would have read 1 GiB at a window set per shard).
DIGEST_WINDOWS = 64
DIGEST_WINDOW_BYTES = 1 << 16


class TokenDataError(ValueError):
    """A --data/--val-data file cannot feed this run (one line, exit 2 on the CLI)."""


class TokenStream:
    """Shards read as one logical array of token ids."""

    def __init__(self, path: str | Path, dtype: str = "uint16", label: str = "--data"):
        self.path, self.label = Path(path), label
        if dtype not in DTYPES:
            raise TokenDataError(f"--data-dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        files = _shard_files(self.path, label)
        self.files = files
        self.shards = [_open_shard(f, DTYPES[dtype], label) for f in files]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])
        self.total = int(self.starts[-1])

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens [start, start+count) of the stream as int64 (may span shards)."""
        out = np.empty(count, dtype=np.int64)
        pos, filled = start, 0
        while filled < count:
            k = int(np.searchsorted(self.starts, pos, side="right")) - 1
            shard, offset = self.shards[k], pos - int(self.starts[k])
            take = min(count - filled, len(shard) - offset)
            out[filled:filled + take] = shard[offset:offset + take]
            filled, pos = filled + take, pos + take
        return out


def _shard_files(path: Path, label: str) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in SUFFIXES and not p.name.startswith("."))
        if not files:
            raise TokenDataError(f"{label} {path}: the folder holds no .bin or .npy files")
        return files
    if not path.is_file():
        raise TokenDataError(f"{label} {path}: no such file or folder")
    if path.suffix not in SUFFIXES:
        got = f"a {path.suffix} file" if path.suffix else "a file without a suffix"
        raise TokenDataError(f"{label} {path}: {got} is not token data; give a .bin (flat token ids, "
                             "--data-dtype uint16|uint32), a .npy (1-D integer array) or a folder of them")
    return [path]


def stream_digest(path: str | Path, label: str = "--data") -> str:
    """A digest of the token files at `path` (every shard's name and size, DIGEST_WINDOWS windows
    spread over their bytes): a resume refuses a --data path that holds other tokens now, a
    same-size rewrite too (its size alone did not tell). Sampled, not a full hash: an edit between
    windows goes unseen."""
    digest = hashlib.sha256()
    files = _shard_files(Path(path), label)
    sizes = [f.stat().st_size for f in files]
    for file, size in zip(files, sizes, strict=True):
        digest.update(f"{file.name}\0{size}\0".encode())
    starts = list(itertools.accumulate(sizes, initial=0))
    last = max(0, starts[-1] - DIGEST_WINDOW_BYTES)
    for k in range(DIGEST_WINDOWS):
        pos = last * k // (DIGEST_WINDOWS - 1)
        shard = bisect.bisect_right(starts, pos) - 1  # an empty shard starts where the next one does
        left = DIGEST_WINDOW_BYTES
        while left > 0 and shard < len(files):  # a window runs on into the next shards
            with files[shard].open("rb") as fh:
                fh.seek(pos - starts[shard])
                chunk = fh.read(left)
            digest.update(chunk)
            left, pos, shard = left - len(chunk), starts[shard + 1], shard + 1
    return digest.hexdigest()[:16]


def _open_shard(file: Path, dtype, label: str) -> np.ndarray:
    if file.suffix == ".npy":
        try:
            array = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as err:
            raise TokenDataError(f"{label} {file}: not a readable .npy file ({err})") from None
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise TokenDataError(f"{label} {file}: a .npy shard must be a 1-D integer array of token ids, "
                                 f"got shape {array.shape} dtype {array.dtype}")
    else:
        size, itemsize = file.stat().st_size, np.dtype(dtype).itemsize
        if size % itemsize:
            raise TokenDataError(
                f"{label} {file}: {size} bytes is not a multiple of {itemsize} ({np.dtype(dtype).name}); "
                f"pass the --data-dtype it was written with (uint16 or uint32)")
        array = np.memmap(file, dtype=dtype, mode="r") if size else np.zeros(0, dtype=dtype)
    if len(array) == 0:
        raise TokenDataError(f"{label} {file}: the file holds no tokens")
    return array


@dataclass(frozen=True)
class Sequences:
    """Consecutive sequences of seq_len+1 tokens of a stream, wrapping around."""

    stream: TokenStream
    seq_len: int

    @property
    def count(self) -> int:
        return self.stream.total // (self.seq_len + 1)

    def get(self, index: int) -> np.ndarray:
        n = self.seq_len + 1
        return self.stream.read((index % self.count) * n, n)

    def epoch(self, index: int) -> int:
        return index // self.count


def sequence_indices(step: int, global_batch: int, micro_batch: int, n_micro: int, dp_rank: int) -> list[list[int]]:
    """The sequence indices of each of dp-rank `dp_rank`'s micro-batches at 1-based `step`."""
    base = (step - 1) * global_batch
    first = dp_rank * n_micro  # global micro-batch j = r*m + i, as executor/data.py
    return [[base + (first + i) * micro_batch + b for b in range(micro_batch)] for i in range(n_micro)]


class TokenBatchSource:
    """BatchSource's interface (skip, microbatches) over a token stream."""

    def __init__(self, sequences: Sequences, micro_batch: int, n_micro: int, dp_rank: int, global_batch: int,
                 vocab: int | None = None):
        self.sequences = sequences
        self.micro_batch, self.n_micro, self.dp_rank, self.global_batch = micro_batch, n_micro, dp_rank, global_batch
        self.vocab = vocab  # the launch samples the file (check_stream); every batch is held to it here

    def skip(self, steps: int) -> None:
        """Resume: nothing to skip, the position is a function of the step."""

    def microbatches(self, step: int):
        import torch

        out = []
        for indices in sequence_indices(step, self.global_batch, self.micro_batch, self.n_micro, self.dp_rank):
            rows = np.stack([self.sequences.get(s) for s in indices])
            self._check_ids(rows, indices)
            tokens = torch.from_numpy(rows)
            out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
        return out

    def _check_ids(self, rows: np.ndarray, indices: list[int]) -> None:
        """An id outside [0, vocab) would index past the embedding (an IndexError, a device-side
        assert on a GPU) in the middle of a run: one line naming it and where it lies instead."""
        bad = (rows < 0) | (rows >= self.vocab) if self.vocab is not None else rows < 0
        if not bad.any():
            return
        row, col = (int(i) for i in np.argwhere(bad)[0])
        stream, n = self.sequences.stream, self.sequences.seq_len + 1
        where = (indices[row] % self.sequences.count) * n + col
        allowed = f"the model's vocabulary [0, {self.vocab})" if self.vocab is not None else "token ids >= 0"
        raise TokenDataError(f"{stream.label} {stream.path}: token id {int(rows[row, col])} at token {where} is "
                             f"outside {allowed}; check --data-dtype or the tokenizer the data was written with")

    def position(self, steps_done: int) -> dict:
        """Where the data stand after `steps_done` steps (for checkpoint metadata)."""
        consumed = steps_done * self.global_batch
        return {"path": str(self.sequences.stream.path), "sequences_consumed": consumed,
                "sequences_per_epoch": self.sequences.count, "epoch": self.sequences.epoch(consumed),
                "seq_len": self.sequences.seq_len}


def check_stream(stream: TokenStream, seq_len: int, global_batch: int, vocab: int | None) -> Sequences:
    """Refuse a stream shorter than one global batch, or one with ids outside [0, vocab)."""
    seqs = Sequences(stream, seq_len)
    if seqs.count < global_batch:
        raise TokenDataError(
            f"{stream.label} {stream.path}: {stream.total} tokens make {seqs.count} "
            f"sequence{'' if seqs.count == 1 else 's'} of "
            f"seq_len+1={seq_len + 1}, fewer than one global batch ({global_batch}); "
            "use more data or a smaller global batch")
    for file, shard in zip(stream.files, stream.shards, strict=True):
        # a .npy states its own dtype: only a flat .bin can be read at the wrong width
        if file.suffix == ".bin" and shard.dtype == np.uint16 and \
                looks_like_uint32(np.asarray(shard[:CHECK_CHUNK_TOKENS]), vocab):
            raise TokenDataError(
                f"{stream.label} {file}: read as uint16, every other token is near 0 (the high halves of uint32 ids, "
                "little-endian); pass --data-dtype uint32")
    for where, tokens in _samples(stream):
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or (vocab is not None and high >= vocab):
            bad = low if low < 0 else high
            source = f" ({vocab.source})" if getattr(vocab, "source", "") else ""
            allowed = f"the model's vocabulary [0, {vocab}){source}" if vocab is not None else "token ids >= 0"
            raise TokenDataError(
                f"{stream.label} {stream.path}: token id {bad} ({where}) is outside {allowed}; "
                "check --data-dtype or the tokenizer the data was written with")
    return seqs


def looks_like_uint32(tokens: np.ndarray, vocab: int | None = None) -> bool:
    """Whether the first tokens of a .bin read as uint16 are uint32 ids (little-endian: every odd
    index holds a high half, id >> 16, at most (vocab - 1) >> 16, and at least 1 bound: 1 for
    Llama 3's 128,256 ids): at least WIDE_CHECK_MIN_TOKENS, every odd one within that bound and
    some even one above it (a stream of tiny ids is not evidence either way)."""
    if len(tokens) < WIDE_CHECK_MIN_TOKENS:
        return False
    high = max(1, (vocab - 1) >> 16) if vocab else 1
    return bool((tokens[1::2] <= high).all() and (tokens[0::2] > high).any())


def _samples(stream: TokenStream):
    for file, shard in zip(stream.files, stream.shards, strict=True):
        yield f"first tokens of {file.name}", np.asarray(shard[:CHECK_CHUNK_TOKENS])
        yield f"last tokens of {file.name}", np.asarray(shard[-CHECK_CHUNK_TOKENS:])
    span = max(stream.total - CHECK_WINDOW_TOKENS, 0)
    for k in range(CHECK_WINDOWS):
        start = span * k // max(CHECK_WINDOWS - 1, 1)
        yield f"near token {start}", stream.read(start, min(CHECK_WINDOW_TOKENS, stream.total - start))


def model_int(model, *names: str) -> int | None:
    """An integer from the model's `config` (dataclass or dict), e.g. vocab / vocab_size."""
    cfg = getattr(model, "config", None)
    for name in names:
        value = cfg.get(name) if isinstance(cfg, dict) else getattr(cfg, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


class Vocab(int):
    """A vocabulary size that remembers where it was read (`source`, for the refusal's wording);
    an int everywhere else (JSON, comparisons)."""

    def __new__(cls, size: int, source: str = ""):
        obj = super().__new__(cls, size)
        obj.source = source
        return obj

    def __getnewargs__(self):  # copy/deepcopy (dataclasses.asdict) keep the source
        return int(self), self.source


class _Fed(Exception):
    """Stops the meta forward at the first nn.Embedding the token ids reach."""


def embedding_fed(meta, ids):
    """(name, nn.Embedding) that indexes `ids` itself, or None: transformers' get_input_embeddings(),
    else the first nn.Embedding a meta forward of `ids` hands that tensor (or a view of it). A
    position embedding gets positions, not the ids, so its rows (the sequence length) are never
    taken; ids that reach no nn.Embedding, or a forward that fails on meta, give None."""
    from torch import nn

    names = {module: name for name, module in meta.named_modules() if isinstance(module, nn.Embedding)}
    getter = getattr(meta, "get_input_embeddings", None)
    if callable(getter):
        try:
            embedding = getter()
        except NotImplementedError:
            embedding = None
        if isinstance(embedding, nn.Embedding):
            return names.get(embedding, "input embeddings"), embedding
    if not names:
        return None
    return _first_fed(meta, ids, names)


def _first_fed(meta, ids, names: dict):
    import torch
    from smplan.planner.hf_model import meta_forward

    def check(module, args):
        first = args[0] if args else None
        if first is ids or getattr(first, "_base", None) is ids:
            raise _Fed(names[module], module)

    hooks = [module.register_forward_pre_hook(check) for module in names]
    try:
        with meta_forward(), torch.no_grad():
            meta(ids)
    except _Fed as fed:
        return fed.args
    except Exception:  # the model's own forward failed on meta: nothing tells the vocabulary
        return None
    finally:
        for hook in hooks:
            hook.remove()
    return None


def model_vocab(meta, ids, ref: str) -> Vocab | None:
    """The vocabulary token ids must fit, from the model built on meta (`ref`: its file's name):
    config.vocab / config.vocab_size, else the rows of the nn.Embedding the ids index
    (embedding_fed), else None (unchecked)."""
    for key in ("vocab", "vocab_size"):
        value = model_int(meta, key)
        if value is not None:
            return Vocab(value, f"{ref}'s config.{key}")
    fed = embedding_fed(meta, ids)
    if fed is None:
        return None
    name, embedding = fed
    return Vocab(embedding.num_embeddings, f"the rows of {ref}'s nn.Embedding '{name}', which the token ids index")


def open_checked(path: str, dtype: str, label: str, seq_len: int, global_batch: int, vocab: int | None) -> Sequences:
    return check_stream(TokenStream(path, dtype, label), seq_len, global_batch, vocab)


def resolve_shape(plan, model_file, batch_tokens: int) -> tuple[int, int | None]:
    """(seq_len, vocab) token data must fit: seq_len from the plan, else the model's batch()
    (`batch_tokens`, 1 when it has none), else its config; vocab from model_vocab (None: unchecked)."""
    meta = model_file.build(plan.model_args, device="meta")
    batch = model_file.hook("batch")
    if batch is not None:
        from smplan.model import inputs_kind, is_one_tensor

        inputs, _ = batch(plan.micro_batch, model=meta, seed=0)
        if not is_one_tensor(inputs):  # --data feeds forward(ids): one tensor, no keywords
            raise TokenDataError(f"--data feeds one tensor of token ids, but {model_file.path.name}'s batch() gives "
                                 f"{inputs_kind(inputs)} of inputs; drop --data, or have batch() return the token "
                                 "tensor alone")
        if inputs.is_floating_point():
            raise TokenDataError(f"--data feeds token ids, but {model_file.path.name}'s batch() gives "
                                 f"floating-point inputs ({inputs.dtype}); drop --data for this model")
    seq_len = plan.seq_len or (batch_tokens if batch_tokens > 1 else None) or model_int(meta, "seq_len", "max_seq_len")
    if not seq_len:
        raise TokenDataError(f"--data needs a sequence length: the plan has no seq_len and {model_file.path.name} "
                             "gives none (batch() shape or config.seq_len); set seq_len in the plan")
    import torch

    ids = torch.zeros(plan.micro_batch, seq_len, dtype=torch.long, device="meta")  # what --data feeds forward()
    return seq_len, model_vocab(meta, ids, model_file.path.name)
