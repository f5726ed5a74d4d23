"""Token data from disk: memory-mapped shards, the same global batch for every layout,
bad files refused before launch, and a real 2-process run on a learnable stream."""

import json

import numpy as np
import pytest
import torch
from smplan.executor.config import hash_key
from smplan.executor.recipe import Recipe, lr_at
from smplan.executor.token_data import (
    CHECK_WINDOW_TOKENS,
    CHECK_WINDOWS,
    Sequences,
    TokenBatchSource,
    TokenDataError,
    TokenStream,
    check_stream,
    looks_like_uint32,
    sequence_indices,
)

from smplan.cli.main import cli
from tests.executor.runs import GPT_TINY, metrics, rank_logs, run_execute

SEQ = 16  # examples/gpt.py:tiny's seq_len; its vocab is 64


def write_bin(path, tokens, dtype=np.uint16):
    np.asarray(tokens, dtype=dtype).tofile(path)
    return path


def source(seqs, gbs, mbs, dp, rank):
    return TokenBatchSource(seqs, mbs, gbs // (mbs * dp), rank, gbs)


def global_batch(seqs, step, gbs, mbs, dp):
    """Every dp rank's micro-batches of `step`, in rank order, as one (inputs, targets)."""
    parts = [mb for r in range(dp) for mb in source(seqs, gbs, mbs, dp, r).microbatches(step)]
    return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def test_shards_in_a_folder_read_as_one_stream(tmp_path):
    tokens = np.arange(1000) % 50
    write_bin(tmp_path / "b.bin", tokens[300:700])
    write_bin(tmp_path / "a.bin", tokens[:300])  # sorted by name, not by creation
    np.save(tmp_path / "c.npy", tokens[700:].astype(np.int32))
    (tmp_path / "notes.txt").write_text("not a shard")
    stream = TokenStream(tmp_path)
    assert stream.total == 1000 and [f.name for f in stream.files] == ["a.bin", "b.bin", "c.npy"]
    assert np.array_equal(stream.read(0, 1000), tokens)
    assert np.array_equal(stream.read(290, 420), tokens[290:710])  # spans all three shards
    assert isinstance(stream.shards[0], np.memmap)


@pytest.mark.parametrize("dp, mbs", [(1, 1), (1, 8), (2, 2), (2, 4), (4, 1), (8, 1)])
def test_every_layout_sees_the_same_global_batch(tmp_path, dp, mbs):
    tokens = np.random.default_rng(0).integers(0, 64, 40 * (SEQ + 1))
    seqs = Sequences(TokenStream(write_bin(tmp_path / "t.bin", tokens)), SEQ)
    for step in (1, 2, 3):
        x, y = global_batch(seqs, step, gbs=8, mbs=mbs, dp=dp)
        ref_x, ref_y = global_batch(seqs, step, gbs=8, mbs=8, dp=1)
        assert torch.equal(x, ref_x) and torch.equal(y, ref_y)
    # step k is sequences (k-1)*8 .. k*8-1, consecutive; targets are the inputs shifted by one
    rows = tokens.reshape(40, SEQ + 1)
    x, y = global_batch(seqs, 2, gbs=8, mbs=mbs, dp=dp)
    assert x.dtype == torch.int64 and x.shape == (8, SEQ)
    assert np.array_equal(x.numpy(), rows[8:16, :-1]) and np.array_equal(y.numpy(), rows[8:16, 1:])


def test_the_stream_wraps_around_and_reports_its_epoch(tmp_path):
    tokens = np.arange(5 * (SEQ + 1) + 3) % 64  # 5 sequences, 3 tokens left over (dropped)
    seqs = Sequences(TokenStream(write_bin(tmp_path / "t.bin", tokens)), SEQ)
    assert seqs.count == 5
    assert sequence_indices(2, 4, 2, 1, 1) == [[6, 7]]
    assert np.array_equal(seqs.get(6), seqs.get(1)) and seqs.epoch(6) == 1
    src = source(seqs, 4, 2, 2, 0)
    assert src.position(3) == {"path": str(tmp_path / "t.bin"), "sequences_consumed": 12,
                               "sequences_per_epoch": 5, "epoch": 2, "seq_len": SEQ}


def test_uint32_and_npy_dtypes(tmp_path):
    big = np.arange(100, dtype=np.uint32) + 70000
    assert TokenStream(write_bin(tmp_path / "t.bin", big, np.uint32), "uint32").read(0, 3).tolist() == [
        70000, 70001, 70002]
    np.save(tmp_path / "t.npy", big.astype(np.int64))
    assert TokenStream(tmp_path / "t.npy", "uint16").read(99, 1).tolist() == [70099]  # the file's dtype


@pytest.mark.parametrize("case, message", [
    ("missing", "no such file or folder"),
    ("odd_size", "7 bytes is not a multiple of 2 (uint16)"),
    ("empty_dir", "the folder holds no .bin or .npy files"),
    ("float_npy", "a .npy shard must be a 1-D integer array"),
    ("empty", "the file holds no tokens"),
    ("script", "a .py file is not token data; give a .bin (flat token ids, --data-dtype uint16|uint32), a .npy"),
    ("no_suffix", "a file without a suffix is not token data"),
])
def test_unreadable_files_are_one_line(tmp_path, case, message):
    path = tmp_path / "data.bin"
    if case == "odd_size":
        path.write_bytes(b"\0" * 7)
    elif case == "empty_dir":
        path = tmp_path / "shards"
        path.mkdir()
    elif case == "float_npy":
        path = tmp_path / "data.npy"
        np.save(path, np.zeros(10))
    elif case == "empty":
        path.write_bytes(b"")
    elif case in ("script", "no_suffix"):  # text read as uint16 ids would fail mid-run
        path = tmp_path / ("first.py" if case == "script" else "train")
        path.write_text("import torch\n" * 100)
    with pytest.raises(TokenDataError) as err:
        TokenStream(path, label="--data")
    assert message in str(err.value) and str(err.value).startswith("--data ") and "\n" not in str(err.value)


def test_an_id_the_launch_did_not_sample_is_refused_by_the_batch_that_holds_it(tmp_path):
    """check_stream samples a large file; the rest is held to the vocabulary batch by batch, so a
    stray id is one line naming where it lies, not an IndexError in the embedding mid-run."""
    tokens = np.zeros(300_000, dtype=np.uint16)
    at = 70_500  # between the sampled windows
    tokens[at] = 1000
    stream = TokenStream(write_bin(tmp_path / "t.bin", tokens))
    check_stream(stream, SEQ, 8, vocab=64)  # not sampled: the launch passes it
    seqs = Sequences(stream, SEQ)
    batches = TokenBatchSource(seqs, 8, 1, 0, 8, vocab=64)
    step = at // (SEQ + 1) // 8 + 1  # the step whose global batch holds that sequence
    batches.microbatches(step - 1)  # the batch before is clean
    with pytest.raises(TokenDataError, match=rf"t.bin: token id 1000 at token {at} is outside the model's "
                                             r"vocabulary \[0, 64\)"):
        batches.microbatches(step)


def test_tokens_outside_the_vocabulary_and_short_streams_are_refused(tmp_path):
    tokens = np.zeros(300_000, dtype=np.uint16)
    tokens[-1] = 64  # in the last chunk
    with pytest.raises(TokenDataError, match=r"token id 64 \(last tokens of t.bin\) is outside .* \[0, 64\)"):
        check_stream(TokenStream(write_bin(tmp_path / "t.bin", tokens)), SEQ, 8, vocab=64)
    middle = (300_000 - CHECK_WINDOW_TOKENS) * 32 // (CHECK_WINDOWS - 1) + 10  # inside the 33rd sampled window
    tokens[-1], tokens[middle] = 0, 1000
    with pytest.raises(TokenDataError, match="token id 1000"):
        check_stream(TokenStream(write_bin(tmp_path / "t.bin", tokens)), SEQ, 8, vocab=64)
    short = TokenStream(write_bin(tmp_path / "s.bin", np.zeros(7 * (SEQ + 1))))
    with pytest.raises(TokenDataError, match=r"make 7 sequences of seq_len\+1=17, fewer than one global batch \(8\)"):
        check_stream(short, SEQ, 8, vocab=64)
    assert check_stream(short, SEQ, 7, vocab=64).count == 7
    one = TokenStream(write_bin(tmp_path / "one.bin", np.zeros(SEQ + 1)))
    with pytest.raises(TokenDataError, match=r"make 1 sequence of seq_len\+1=17, fewer"):
        check_stream(one, SEQ, 2, vocab=64)
    np.save(tmp_path / "neg.npy", np.array([0, -3] * 200, dtype=np.int32))  # a model without config.vocab
    with pytest.raises(TokenDataError, match=r"token id -3 .* is outside token ids >= 0"):
        check_stream(TokenStream(tmp_path / "neg.npy"), 4, 2, vocab=None)


def test_a_uint32_file_read_as_uint16_is_refused(tmp_path):
    """uint32 ids < 65536 read as uint16 are the ids with a 0 after each (little-endian)."""
    ids = np.random.default_rng(0).integers(1, 50_000, 5000)
    wide = write_bin(tmp_path / "t32.bin", ids, np.uint32)
    with pytest.raises(TokenDataError, match=r"^--data .*t32.bin: read as uint16, every other token is near 0 .*; "
                                             r"pass --data-dtype uint32$"):
        check_stream(TokenStream(wide, label="--data"), SEQ, 8, vocab=None)
    assert check_stream(TokenStream(wide, "uint32"), SEQ, 8, vocab=None).count == 5000 // (SEQ + 1)


def test_no_plausible_uint16_stream_looks_like_uint32():
    rng = np.random.default_rng(1)
    zipf = np.minimum(rng.zipf(1.2, 1 << 16), 50_000).astype(np.uint16) - 1  # many 0s, not every other one
    assert not looks_like_uint32(zipf)
    assert not looks_like_uint32(np.zeros(4096, np.uint16))  # all 0: no evidence either way
    short = np.zeros(1022, np.uint16)
    short[::2] = 7
    assert not looks_like_uint32(short)  # too few tokens to judge
    alternating = np.zeros(1024, np.uint16)
    alternating[::2] = 7
    assert looks_like_uint32(alternating)
    alternating[5] = 2  # one odd-index id no uint32 id under 131,072 has as its high half
    assert not looks_like_uint32(alternating)


def test_uint32_ids_of_a_large_vocabulary_read_as_uint16_are_caught():
    # Llama 3's 128,256 ids: half of them have a high half of 1, so "every other token is 0" missed them
    ids = np.random.default_rng(2).integers(0, 128_256, 4096).astype(np.uint32)
    as_uint16 = ids.view(np.uint16)
    assert looks_like_uint32(as_uint16, vocab=128_256) and looks_like_uint32(as_uint16)
    o200k = np.random.default_rng(3).integers(0, 200_019, 4096).astype(np.uint32).view(np.uint16)
    assert looks_like_uint32(o200k, vocab=200_019)  # high halves up to 3
    genuine = np.random.default_rng(4).integers(0, 50_257, 4096).astype(np.uint16)
    assert not looks_like_uint32(genuine, vocab=128_256) and not looks_like_uint32(genuine)


def pattern(n_tokens: int) -> np.ndarray:
    """A learnable stream: 0, 1, ..., 63, 0, 1, ... (the next token is always the successor)."""
    return np.arange(n_tokens) % 64


@pytest.mark.parametrize("args, message", [
    (["--data", "{tmp}/missing.bin"], "--data {tmp}/missing.bin: no such file or folder"),
    (["--data", "{tmp}/odd.bin"], "is not a multiple of 2 (uint16)"),
    (["--data", "{tmp}/big.bin"], "token id 64 (first tokens of big.bin) is outside the model's vocabulary [0, 64)"),
    (["--data", "{tmp}/short.bin"], "fewer than one global batch (8)"),
    (["--data", "{tmp}/ok.bin", "--val-data", "{tmp}/short.bin", "--eval-every", "2"], "--val-data"),
    (["--data", "{tmp}/ok.bin", "--eval-every", "2"], "--eval-every needs --val-data PATH"),
    # 2000 tokens make 117 sequences of 17: 14 global batches of 8, not 20 (past them the stream wraps)
    (["--data", "{tmp}/ok.bin", "--val-data", "{tmp}/ok.bin", "--eval-every", "2", "--eval-batches", "20"],
     "--eval-batches 20 needs that many global batches of --val-data, but {tmp}/ok.bin holds 14"),
    # one global batch of --val-data: one eval batch, or more data
    (["--data", "{tmp}/ok.bin", "--val-data", "{tmp}/one.bin", "--eval-every", "2", "--eval-batches", "2"],
     "{tmp}/one.bin holds 1 (8 sequences of seq_len+1=17 tokens, 8 a batch); use --eval-batches 1, or more --val-data"),
    (["--data", "{tmp}/ok.bin", "--lr-schedule", "cosine", "--warmup-steps", "5"], "--warmup-steps (5) must be below"),
    (["--grad-clip", "nan"], "--grad-clip must be a finite number"),
    (["--adam-betas", "0.9"], "--adam-betas must be B1,B2"),
    (["--min-lr", "1"], "--min-lr must be between 0 and --lr"),
])
def test_execute_refuses_bad_data_and_recipes_before_launch(cli_runner, tmp_path, args, message):
    (tmp_path / "odd.bin").write_bytes(b"\0" * 11)
    write_bin(tmp_path / "big.bin", pattern(2000) + 1)
    write_bin(tmp_path / "short.bin", pattern(7 * (SEQ + 1)))
    write_bin(tmp_path / "ok.bin", pattern(2000))
    write_bin(tmp_path / "one.bin", pattern(8 * (SEQ + 1)))
    args = [a.format(tmp=tmp_path) for a in args]
    result = cli_runner.invoke(cli, ["execute", "dp=2,mbs=2,gbs=8", "--model", GPT_TINY, "--steps", "5",
                                     "-o", str(tmp_path / "run"), *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message.format(tmp=tmp_path) in lines[0], result.output
    assert not (tmp_path / "run").exists()


STEPS = 10
RUN_ARGS = ("--steps", str(STEPS), "--eval-every", "4", "--eval-batches", "2", "--lr", "3e-3", "--lr-schedule",
            "cosine", "--warmup-steps", "3", "--min-lr", "1e-4", "--weight-decay", "0.1", "--adam-betas", "0.9,0.95",
            "--checkpoint-every", "5")


def write_streams(folder):
    write_bin(folder / "train.bin", pattern(200 * (SEQ + 1)))
    write_bin(folder / "val.bin", (pattern(40 * (SEQ + 1)) + 7) % 64)  # the same rule, another phase
    return ("--data", str(folder / "train.bin"), "--val-data", str(folder / "val.bin"))


@pytest.fixture(scope="module")
def stream_run(tmp_path_factory):
    """dp=2 on a learnable stream: warmup + cosine, validation every 4 steps."""
    folder = tmp_path_factory.mktemp("stream")
    out = folder / "run"
    result = run_execute("dp=2,mbs=2,gbs=8", out, *write_streams(folder), *RUN_ARGS, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    return out, metrics(out)


def test_two_processes_learn_a_token_stream_with_warmup_and_cosine(stream_run):
    out, records = stream_run
    recipe = Recipe(lr=3e-3, schedule="cosine", total_steps=STEPS, warmup_steps=3, min_lr=1e-4)
    assert [r["lr"] for r in records] == pytest.approx([lr_at(k, recipe) for k in range(1, STEPS + 1)])
    assert max(r["lr"] for r in records) == pytest.approx(3e-3) and records[-1]["lr"] == pytest.approx(1e-4)
    losses = [r["loss"] for r in records]
    assert losses[-1] < losses[0] - 0.5, losses
    val = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    assert sorted(val) == [4, 8, 10] and val[10] < val[4], val  # every 4 steps and the last
    meta = json.loads((out / "checkpoints" / "step-10" / "smplan.json").read_text())
    assert meta["data"]["sequences_consumed"] == 80 and meta["data"]["sequences_per_epoch"] == 200
    assert meta["recipe"]["schedule"] == "cosine" and meta["recipe"]["betas"] == [0.9, 0.95]
    # what a refused resume diffs against (executor/checkpoint.py): the launch's own fingerprint inputs
    assert meta["fingerprint_inputs"]["layout"]["dp"] == 2
    assert hash_key(meta["fingerprint_inputs"]) == meta["fingerprint"]


def test_a_pipeline_killed_and_resumed_sees_the_same_data_and_schedule(stream_run, tmp_path):
    """pp=2 (forward-only schedule for validation), SIGKILLed at step 7 and resumed from the
    step-5 checkpoint: losses, lrs and validation losses are dp=2's uninterrupted ones."""
    out = tmp_path / "run"
    result = run_execute("pp=2,mbs=2,gbs=8", out, *write_streams(tmp_path), *RUN_ARGS, "--max-restarts", "1",
                         env={"SMPLAN_FAIL_AT_STEP": "7"}, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "at step 7" in rank_logs(out) and "resumed from" in result.stdout
    ref, got = stream_run[1], metrics(out)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for key in ("loss", "lr", "val_loss"):
        mine, theirs = [r.get(key, -1.0) for r in got], [r.get(key, -1.0) for r in ref]
        assert mine == pytest.approx(theirs, rel=1e-5), key
