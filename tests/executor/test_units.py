"""Single-process pieces of the executor: structure, data seeds, checkpoint folders,
fingerprints, metrics summary, validation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from smplan.executor import PlanMismatchError, fingerprint, resolve_plan, validate_plan
from smplan.executor.checkpoint import (
    CheckpointMismatchError,
    check_resumable,
    complete_steps,
    latest,
)
from smplan.executor.data import BatchSource
from smplan.executor.metrics import summarize
from smplan.executor.pipeline import chunks_of_rank
from smplan.planner import load_model_file

from smplan.model.structure import cut_chunk, find_layout, owned_blocks
from tests.conftest import EXAMPLES

GPT = f"{EXAMPLES / 'gpt.py'}:tiny"


@pytest.fixture(scope="module")
def gpt_file():
    return load_model_file(GPT)


def test_layout_of_the_examples(gpt_file):
    layout = find_layout(gpt_file.build({}, device="meta"))
    assert (layout.container, layout.num_blocks, layout.before, layout.after) == ("blocks", 4, ("embed",), ("head",))
    for name in ("mlp.py", "cnn.py"):
        lay = find_layout(load_model_file(str(EXAMPLES / name)).build({}, device="meta"))
        assert lay.container == "blocks" and lay.before == ("embed",) and lay.after == ("head",)


def test_chunks_keep_parameter_names(gpt_file):
    meta = gpt_file.build({}, device="meta")
    layout = find_layout(meta)
    first = cut_chunk(meta, layout, 0, 2, is_first=True, is_last=False)
    last = cut_chunk(meta, layout, 2, 4, is_first=False, is_last=True)
    names = set(first.state_dict()) | set(last.state_dict())
    assert names == set(meta.state_dict())
    assert not set(first.state_dict()) & set(last.state_dict())
    assert [i for i, _ in owned_blocks(last, layout)] == [2, 3] and last.embed is None and first.head is None


def test_interleaved_chunk_placement():
    assert chunks_of_rank(0, 2, 2) == [0, 2] and chunks_of_rank(1, 2, 2) == [1, 3]


def test_global_batch_is_the_same_under_dp(gpt_file):
    ref = gpt_file.build({}, device="meta")
    single = BatchSource(gpt_file, ref, 1, 4, dp_rank=0, dp=1, seed=3).microbatches(step=7)
    split = [mb for r in range(2) for mb in BatchSource(gpt_file, ref, 1, 2, dp_rank=r, dp=2, seed=3).microbatches(7)]
    for (x1, y1), (x2, y2) in zip(single, split, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    other = BatchSource(gpt_file, ref, 1, 4, 0, 1, seed=3).microbatches(step=8)
    assert not torch.equal(other[0][0], single[0][0])


def _fake_checkpoint(root, step, fp, complete=True):
    path = root / f"step-{step}"
    path.mkdir(parents=True)
    (path / "smplan.json").write_text(json.dumps({"fingerprint": fp, "step": step}))
    if complete:
        (path / "COMPLETE").write_text("ok\n")


def test_only_complete_checkpoints_count(tmp_path):
    _fake_checkpoint(tmp_path, 2, "a")
    _fake_checkpoint(tmp_path, 10, "a")
    _fake_checkpoint(tmp_path, 12, "a", complete=False)  # crashed mid-save
    (tmp_path / ".step-14.tmp").mkdir()
    assert [s for s, _ in complete_steps(tmp_path)] == [2, 10]  # numeric, not lexical order
    assert latest(tmp_path)[0] == 10
    assert check_resumable(tmp_path, "a", force=False)[0] == 10
    with pytest.raises(CheckpointMismatchError):
        check_resumable(tmp_path, "b", force=False)
    assert check_resumable(tmp_path, "b", force=True)[0] == 10
    assert check_resumable(tmp_path / "none", "a", force=False) is None


class _DCPFailure(BaseException):
    """Like DCP's CheckpointException: a BaseException holding {rank: (exception, traceback)}."""

    def __init__(self, failures: dict):
        super().__init__("CheckpointException ranks:" + str(list(failures)))
        self.failures = failures


def test_a_checkpoint_that_does_not_read_back_falls_back_to_the_one_before(tmp_path):
    from smplan.executor.checkpoint import (
        CheckpointLoadError,
        CheckpointUnreadableError,
        load_newest_readable,
    )

    _fake_checkpoint(tmp_path, 2, "other")  # an older run of another plan: never a fallback
    for step in (4, 6, 8):
        _fake_checkpoint(tmp_path, step, "a")
    bad, said = {"step-8", "step-6"}, []

    def load(path):
        if path.name in bad:
            raise _DCPFailure({1: (EOFError(), None)})  # rank 1's shard ends early
        return path.name

    def alone(item):  # one rank: every rank's outcome is this one's
        return [item]

    assert load_newest_readable(tmp_path, "a", False, load, alone, said.append) == (4, tmp_path / "step-4", "step-4")
    assert [line.split(" could")[0] for line in said] == [str(tmp_path / "step-8"), str(tmp_path / "step-6")]
    assert "(rank 1: EOFError)" in said[0]
    bad.add("step-4")
    with pytest.raises(CheckpointUnreadableError, match=r"no checkpoint of this run in .* could be read: step-8 .*"
                                                        r"step-4 \(rank 1: EOFError\); the one before them, step-2, "
                                                        r"is another plan's; move the damaged step-N folders aside"):
        load_newest_readable(tmp_path, "a", False, load, alone)

    # this rank read step-8 well, rank 1 could not read its rank-1.pt: both move on, and the
    # report gives rank 1's own reason
    tries = []

    def rank_one_torn(item):  # rank 1 cannot read steps 8, 6 and 4; forced, other plan's step-2 is tried
        tries.append(item)
        torn = (1, None, "RuntimeError: PytorchStreamReader failed reading zip archive")
        return [item, torn if len(tries) <= 3 else item]

    said.clear()
    assert load_newest_readable(tmp_path, "a", True, lambda p: p.name, rank_one_torn, said.append)[0] == 2
    assert "(rank 1: RuntimeError: PytorchStreamReader" in said[0] and len(said) == 3

    # a failure that is not damage (a shape that no longer fits the model) is raised as it is,
    # and a rank whose own load went well says which rank failed, not "damaged"
    def mismatch(path):
        raise _DCPFailure({0: (ValueError("Size mismatch for tok.weight"), None)})

    with pytest.raises(_DCPFailure):
        load_newest_readable(tmp_path, "a", False, mismatch, alone)
    with pytest.raises(CheckpointLoadError, match=r"rank 1 could not load .*step-8 \(ValueError: Size mismatch"):
        load_newest_readable(tmp_path, "a", False, lambda p: p.name,
                             lambda item: [item, (2, None, "ValueError: Size mismatch")])

    from smplan.executor.checkpoint import _failure_reason

    long = ("PytorchStreamReader failed reading zip archive: failed finding central directory. This is an "
            "internal miniz error. If you are seeing this error, there is a high likelihood that your checkpoint "
            "file is corrupted.")
    assert _failure_reason(RuntimeError(long)) == (None, "RuntimeError: PytorchStreamReader failed reading zip "
                                                         "archive: failed finding central directory.")

    def interrupted(path):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        load_newest_readable(tmp_path, "a", False, interrupted, alone)
    assert load_newest_readable(tmp_path / "none", "a", False, load, alone) is None


def test_a_rank_file_or_metadata_that_does_not_read_back_is_damage_not_a_failure(tmp_path):
    import io

    import torch
    from smplan.executor.checkpoint import UnreadableFileError, _is_unreadable, load_rank_state

    assert load_rank_state(tmp_path, 1) is None  # a checkpoint from before per-rank states: none to load
    torch.save({"rng": 1}, tmp_path / "rank-0.pt")
    (tmp_path / "smplan.json").write_text(json.dumps({"plan": {"dp": 2, "tp": 1, "pp": 1, "cp": 1}}))
    assert load_rank_state(tmp_path, 0) == {"rng": 1}
    with pytest.raises(UnreadableFileError, match="rank-1.pt is missing"):  # rank 0 kept its own: rank 1's was lost
        load_rank_state(tmp_path, 1)
    assert load_rank_state(tmp_path, 2) is None  # --force-resume onto more ranks: no file of its own was written
    (tmp_path / "smplan.json").write_text(json.dumps({"plan": {"dp": 1, "tp": 1, "pp": 1, "cp": 1}}))
    assert load_rank_state(tmp_path, 1) is None  # written by one rank (a review's dp=1 -> dp=2 reshard failed)
    # a one-rank writer's only file lost: its meta says it kept one, so it is damage, not an old checkpoint
    (tmp_path / "rank-0.pt").unlink()
    assert load_rank_state(tmp_path, 0) is None
    (tmp_path / "smplan.json").write_text(json.dumps({"plan": {"dp": 1}, "rank_states": True}))
    with pytest.raises(UnreadableFileError, match="rank-0.pt is missing"):
        load_rank_state(tmp_path, 0)
    # a flipped bit in a name: unpickling raises AttributeError, damage too (a review's resume looped)
    buf = io.BytesIO()
    torch.save({"rng": torch.zeros(2)}, buf)
    (tmp_path / "rank-0.pt").write_bytes(buf.getvalue().replace(b"_rebuild_tensor_v2", b"_rebuiGd_tensor_v2"))
    with pytest.raises(UnreadableFileError, match="AttributeError"):
        load_rank_state(tmp_path, 0)
    (tmp_path / "rank-0.pt").write_bytes(bytes(4096))  # zeroed: torch.load raises KeyError 'storages'
    with pytest.raises(UnreadableFileError, match=r"rank-0.pt does not read back \(KeyError"):
        load_rank_state(tmp_path, 0)
    # torch 2.13's DCP asserts when no metadata reads back; any other assertion is a failure, not damage
    assert _is_unreadable(_DCPFailure({0: (AssertionError("metadata is None; global metadata read failed: invalid "
                                                          "load key, '\\x00'."), None)}))
    assert not _is_unreadable(_DCPFailure({0: (AssertionError("Size mismatch"), None)}))


def test_fingerprint_tracks_plan_and_model(gpt_file):
    plan, _ = resolve_plan("dp=2,mbs=1,gbs=4", model=GPT)
    same = fingerprint(plan, gpt_file.sha256)
    assert fingerprint(plan.replace(hw="other"), gpt_file.sha256) == same
    assert fingerprint(plan.replace(tp=2, dp=1), gpt_file.sha256) != same
    assert fingerprint(plan.replace(model_args={"layers": 6}), gpt_file.sha256) != same
    assert fingerprint(plan, "0" * 64) != same
    # the same file reached by another path (a plan file run from elsewhere) is the same model
    assert fingerprint(plan.replace(model=str(Path(GPT.rsplit(":", 1)[0]).resolve()) + ":" + GPT.rsplit(":", 1)[1]),
                       gpt_file.sha256) == same
    assert fingerprint(plan.replace(model=GPT.rsplit(":", 1)[0] + ":gpt3_175b"), gpt_file.sha256) != same


def test_summary_with_and_without_prediction(tmp_path):
    rows = [{"step": i, "loss": 5.0 - i, "step_time_s": t, "tokens_per_s": 100 / t, "samples_per_s": 4 / t,
             "peak_memory_gib": m, "grad_norm": 1.0} for i, t, m in ((1, 9.0, 1.0), (2, 1.0, 1.5), (3, 2.0, 1.5),
                                                                    (4, 3.0, 1.75))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan, _ = resolve_plan("dp=2,mbs=1,gbs=4", model=GPT)
    summary = summarize(tmp_path, None, plan.to_dict(), "cpu")
    assert summary["measured"]["step_time_s"] == 2.0  # median after the warm-up step
    assert summary["measured"]["peak_memory_gib"] == 1.75  # the peak, not a median
    assert summary["predicted"] is None and "no predicted figures" in summary["note"]
    assert {"cp", "ep", "capacity_factor"} <= summary["plan"].keys()  # the whole layout that ran
    summary = summarize(tmp_path, {"step_time_s": 1.0, "tokens_per_s": 25.0}, plan.to_dict(), "cpu")
    assert summary["ratio_measured_over_predicted"]["step_time_s"] == 2.0
    assert summary["ratio_measured_over_predicted"]["peak_memory_gib"] is None
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 4
    # The plan's memory prediction counts a reserve (CUDA context, fragmentation) that the
    # allocator's peak does not see: on a GPU it is compared without it; on CPU (RSS) not at all.
    predicted = {"step_time_s": 1.0, "peak_memory_gib": 2.5, "memory_breakdown_gib": {"reserve": 2.0}}
    on_cpu = summarize(tmp_path, predicted, plan.to_dict(), "cpu")
    assert on_cpu["predicted"]["peak_memory_gib"] is None
    assert on_cpu["ratio_measured_over_predicted"]["peak_memory_gib"] is None
    on_gpu = summarize(tmp_path, predicted, plan.to_dict(), "cuda")
    assert on_gpu["predicted"]["peak_memory_gib"] == 0.5
    assert on_gpu["ratio_measured_over_predicted"]["peak_memory_gib"] == 3.5  # 1.75 GiB over 0.5


def test_validate_accepts_the_parity_plans(gpt_file):
    for spec in ("dp=2,mbs=1,gbs=4", "pp=2,tp=2,mbs=1,gbs=4,recompute=full", "tp=2,sp=1,mbs=1,gbs=2",
                 "pp=2,schedule=interleaved,v=2,mbs=1,gbs=4"):
        plan, _ = resolve_plan(spec, model=GPT)
        assert validate_plan(plan, gpt_file, world_size=plan.world_size).tokens_per_sample == 16


def test_validate_kv_heads(tmp_path):
    mf = load_model_file(GPT)
    plan, _ = resolve_plan("tp=4,mbs=1,gbs=4", model=GPT, model_args={"kv_heads": 2})
    with pytest.raises(PlanMismatchError, match="kv heads"):
        validate_plan(plan, mf)


def test_selective_recompute_is_the_attention_core_only(gpt_file):
    # Korthikanti et al. 2022 section 5, as the cost model prices it: the s x s work
    # (QK^T, scale, mask, softmax, dropout, probs @ V) is recomputed; linears, norms,
    # activations and everything else are kept.
    from smplan.executor.parallelize import _attention_core
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append((func._overloadpacket.__name__, _attention_core(func, args)))
            return func(*args, **(kwargs or {}))

    model = load_model_file(f"{EXAMPLES / 'gpt.py'}").build({"hidden": 32, "heads": 4, "seq_len": 16, "layers": 1}, device="cpu")
    block = model.blocks[0].train()
    with Record() as rec:
        block(torch.randn(2, 16, 32))
    core = {name for name, is_core in rec.ops if is_core}
    kept = {name for name, is_core in rec.ops if not is_core}
    assert {"bmm", "_softmax", "masked_fill"} <= core
    assert [name for name, is_core in rec.ops if name == "bmm" and is_core] == ["bmm", "bmm"]
    assert {"addmm", "native_layer_norm", "gelu"} <= kept
    assert not ({"addmm", "mm", "native_layer_norm", "gelu"} & core)


def test_a_resumed_run_keeps_the_checkpoint_interval_it_ran_with(tmp_path, monkeypatch):
    # `execute -o RUN --checkpoint-every 2`, then `execute -o RUN --steps 8`: the continuation
    # checkpoints every 2 steps too, so a third resume starts from step 8, not from step 4.
    import dataclasses

    from smplan.executor import checkpoint, run_dir
    from smplan.executor.config import RunConfig

    fields = {f.name: None for f in dataclasses.fields(RunConfig)}
    (tmp_path / "run_config.json").write_text(json.dumps({**fields, "checkpoint_every": 2}))
    ckpt = tmp_path / "checkpoints"
    assert run_dir.earlier_checkpoint_setting(tmp_path, str(ckpt)) == 0  # nothing to continue: nothing inherited
    monkeypatch.setattr(checkpoint, "latest", lambda root: (4, Path(root) / "step-4"))
    assert run_dir.earlier_checkpoint_setting(tmp_path, str(ckpt)) == 2
    (tmp_path / "run_config.json").write_text(json.dumps({**fields, "checkpoint_every": 2, "keep_checkpoints": 1}))
    # --keep-checkpoints continues too (review: a resume kept every checkpoint it then wrote)
    assert run_dir.earlier_checkpoint_setting(tmp_path, str(ckpt), "keep_checkpoints") == 1
    (tmp_path / "run_config.json").write_text("{not json")
    assert run_dir.earlier_checkpoint_setting(tmp_path, str(ckpt)) == 0


def _started_run(folder: Path, **fields):
    """(the RunConfig of a run started in `folder` with `fields`, its checkpoint (4, step-4)): what
    `_refuse_a_changed_recipe` reads."""
    from smplan.executor.config import RunConfig

    started = RunConfig(plan={}, model_ref="m.py", out_dir=str(folder), steps=4, **fields)
    started.save(folder / "run_config.json")
    step_dir = folder / "checkpoints" / "step-4"
    step_dir.mkdir(parents=True)
    (step_dir / "smplan.json").write_text(json.dumps({"recipe": started.recipe().to_dict(), "step": 4}))
    return started, (4, step_dir)


def test_a_resume_refuses_a_changed_recipe_or_seed(tmp_path):
    # resuming with an option left at its default used to switch the schedule (and seed) mid-run
    from smplan.executor import run
    from smplan.executor.config import RunConfig

    started, found = _started_run(tmp_path, seed=3, lr_schedule="cosine", warmup_steps=1)
    same = RunConfig(**{**started.__dict__, "steps": 8})  # training longer is what a resume is for
    run._refuse_a_changed_recipe(found, same, tmp_path)
    for change, says in (({"lr_schedule": "constant"}, "schedule='cosine' (now 'constant')"),
                         ({"lr": 0.01}, "lr=0.001 (now 0.01)"), ({"seed": 0}, "seed=3 (now 0)"),
                         ({"data": "/d/train.bin"}, "--data not given (now /d/train.bin)")):
        with pytest.raises(PlanMismatchError, match=re.escape(says) + ".*--force-resume"):
            run._refuse_a_changed_recipe(found, RunConfig(**{**same.__dict__, **change}), tmp_path)


def test_a_resume_refuses_other_data(tmp_path):
    """Trained on a token file: resuming on another one, or on synthetic batches, reads another
    stream at the step's position; the data options are held as the recipe is."""
    from smplan.executor import run
    from smplan.executor.config import RunConfig

    started, found = _started_run(tmp_path, data="/d/train.bin")
    run._refuse_a_changed_recipe(found, RunConfig(**{**started.__dict__, "steps": 8}), tmp_path)
    for change, says in (({"data": "/d/train.npy"}, "--data /d/train.bin (now /d/train.npy)"),
                         ({"data": None}, "--data /d/train.bin (now not given)"),
                         ({"data_dtype": "uint32"}, "--data-dtype uint16 (now uint32)"),
                         ({"val_data": "/d/val.bin"}, "--val-data not given (now /d/val.bin)")):
        with pytest.raises(PlanMismatchError, match=re.escape(says) + ".*--force-resume"):
            run._refuse_a_changed_recipe(found, RunConfig(**{**started.__dict__, "steps": 8, **change}), tmp_path)


def test_a_resume_into_a_new_run_folder_holds_the_writers_seed_and_data(tmp_path):
    """`execute -o A --checkpoint-dir CK --data d.bin`, then `execute -o B --checkpoint-dir CK` without
    --data (or with another --seed) resumed on synthetic batches: the recipe was held against B's
    run_config.json, which B had none of yet (review). The writer's folder is read, or, gone, what
    the checkpoint records itself."""
    from smplan.executor import run
    from smplan.executor.config import RunConfig

    a, b = tmp_path / "A", tmp_path / "B"
    a.mkdir()
    b.mkdir()
    started, (step, ckpt) = _started_run(a, seed=3, data="/d/train.bin")
    (ckpt / "smplan.json").write_text(json.dumps({"recipe": started.recipe().to_dict(), "step": 4, "seed": 3,
                                                   "run_dir": str(a), "data": {"path": "/d/train.bin"}}))
    same = RunConfig(**{**started.__dict__, "steps": 8, "out_dir": str(b)})
    for folder_a in ("kept", "removed"):
        if folder_a == "removed":
            (a / "run_config.json").unlink()
        run._refuse_a_changed_recipe((step, ckpt), same, b)
        for change, says in (({"seed": 0}, "seed=3 (now 0)"), ({"data": None}, "--data /d/train.bin (now not given)")):
            with pytest.raises(PlanMismatchError, match=re.escape(says) + ".*--force-resume"):
                run._refuse_a_changed_recipe((step, ckpt), RunConfig(**{**same.__dict__, **change}), b)
    # the seed the checkpoint records wins over its folder's run_config.json, which a later launch
    # there (--seed 5 --force-resume) rewrote
    started.save(a / "run_config.json")
    RunConfig(**{**started.__dict__, "seed": 5}).save(a / "run_config.json")
    run._refuse_a_changed_recipe((step, ckpt), same, b)


def test_a_resume_refuses_another_file_at_the_same_data_path(tmp_path):
    """A review overwrote its --data file (20,000 tokens) with 9,000 and resumed without a word."""
    from smplan.executor import run
    from smplan.executor.config import RunConfig

    started, found = _started_run(tmp_path, data="/d/train.bin", data_bytes=40_000)
    run._refuse_a_changed_recipe(found, RunConfig(**{**started.__dict__, "steps": 8}), tmp_path)
    with pytest.raises(PlanMismatchError, match=re.escape("--data /d/train.bin of 40,000 bytes (now 18,000: another "
                                                          "file)") + ".*--force-resume"):
        run._refuse_a_changed_recipe(found, RunConfig(**{**started.__dict__, "steps": 8, "data_bytes": 18_000}), tmp_path)
    # a run started before the size was kept resumes as before
    older = tmp_path / "older"
    older.mkdir()
    _started_run(older, data="/d/train.bin")
    run._refuse_a_changed_recipe(found, RunConfig(**{**started.__dict__, "steps": 8, "data_bytes": 18_000}), older)


def test_a_resume_refuses_a_same_size_rewrite_of_its_data(tmp_path):
    """A rewrite of the same size went unseen: the sampled content digest tells the files apart."""
    import numpy as np
    from smplan.executor import run
    from smplan.executor.config import RunConfig
    from smplan.executor.token_data import stream_digest

    data = tmp_path / "train.bin"
    np.arange(200_000, dtype=np.uint16).tofile(data)
    first = stream_digest(data)
    assert stream_digest(data) == first
    started, found = _started_run(tmp_path, data=str(data), data_bytes=data.stat().st_size, data_digest=first)
    run._refuse_a_changed_recipe(found, RunConfig(**{**started.__dict__, "steps": 8}), tmp_path)
    (np.arange(200_000, dtype=np.uint16)[::-1]).tofile(data)  # the same 400,000 bytes, other tokens
    now = stream_digest(data)
    assert now != first
    with pytest.raises(PlanMismatchError, match="holding other tokens .*--force-resume"):
        run._refuse_a_changed_recipe(found, RunConfig(**{**started.__dict__, "steps": 8, "data_digest": now}), tmp_path)
    folder = tmp_path / "shards"  # a folder of shards: names, sizes and contents of each
    folder.mkdir()
    for i in range(3):  # smaller than a window together: a window runs on through them all
        np.arange(100 * (i + 1), dtype=np.uint16).tofile(folder / f"s{i}.bin")
    before = stream_digest(folder)
    tokens = np.fromfile(folder / "s2.bin", dtype=np.uint16)
    tokens[-1] = 9999
    tokens.tofile(folder / "s2.bin")  # the last shard's last token
    assert stream_digest(folder) != before
    before = stream_digest(folder)
    (folder / "s0.bin").rename(folder / "t0.bin")
    assert stream_digest(folder) != before


def test_a_resume_that_stretches_a_decaying_schedule_says_so(tmp_path, monkeypatch):
    from smplan.executor import checkpoint, run
    from smplan.executor.config import RunConfig

    started = RunConfig(plan={}, model_ref="m.py", out_dir=str(tmp_path), steps=6, lr_schedule="cosine",
                        warmup_steps=2, checkpoint_dir=str(tmp_path / "checkpoints"))
    started.save(tmp_path / "run_config.json")
    monkeypatch.setattr(checkpoint, "latest", lambda root: (6, Path(root) / "step-6"))
    longer = RunConfig(**{**started.__dict__, "steps": 10})
    note = run._stretched_schedule_note(longer)
    assert note.startswith("note: the cosine schedule spans --steps; continuing step 6 of 6 to 10 steps stretches it")
    assert run._stretched_schedule_note(started) is None  # the same span
    assert run._stretched_schedule_note(RunConfig(**{**longer.__dict__, "lr_schedule": "constant"})) is None


def test_unreadable_checkpoint_metadata_is_one_line(tmp_path):
    from smplan.executor.checkpoint import read_meta

    (tmp_path / "smplan.json").write_text("{not json")
    with pytest.raises(CheckpointMismatchError, match="is not valid JSON.*move .* aside"):
        read_meta(tmp_path)
    (tmp_path / "smplan.json").write_text("[1]")
    with pytest.raises(CheckpointMismatchError, match="holds no JSON object"):
        read_meta(tmp_path)


def test_a_new_launch_clears_the_stopped_record(tmp_path):
    from smplan.executor import run_dir
    from smplan.executor.metrics import STOPPED_FILE, mark_stopped

    (tmp_path / "run_config.json").write_text('{"plan": {}, "fingerprint": "0"}')
    mark_stopped(tmp_path, "failed", "rank 1 killed by signal 9")
    run_dir.claim_run_dir(tmp_path, None, world=2)  # what _execute does before either launcher starts
    assert not (tmp_path / STOPPED_FILE).exists()


def test_a_stop_record_on_a_full_disk_is_skipped_not_half_written(tmp_path, monkeypatch, capsys):
    # a run on a full disk: the launcher reported its own OSError instead of the rank's failure, and
    # left an empty stopped.json (review)
    import errno
    from pathlib import Path

    from smplan.executor.metrics import STOPPED_FILE, mark_stopped

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", full)
    mark_stopped(tmp_path, "failed", "rank 1 killed by signal 9")  # no exception
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert "could not record why the run stopped" in capsys.readouterr().err
    mark_stopped(tmp_path, "failed", "rank 1 killed by signal 9")
    assert [p.name for p in tmp_path.iterdir()] == [STOPPED_FILE]


def test_a_run_that_checkpointed_elsewhere_continues_from_there(tmp_path, monkeypatch):
    # `execute -o RUN --checkpoint-dir CK`, then `execute -o RUN --steps 8`: RUN's run_config.json
    # names CK, so the second run resumes from it rather than refusing RUN as a finished run
    import dataclasses

    from smplan.executor import checkpoint, run_dir
    from smplan.executor.config import RunConfig

    ck = tmp_path / "ck"
    fields = {f.name: None for f in dataclasses.fields(RunConfig)}
    (tmp_path / "run_config.json").write_text(json.dumps({**fields, "checkpoint_dir": str(ck)}))
    assert run_dir.recorded_checkpoint_dir(tmp_path) is None  # nothing written there yet
    monkeypatch.setattr(checkpoint, "latest", lambda root: (4, Path(root) / "step-4") if Path(root) == ck else None)
    assert run_dir.recorded_checkpoint_dir(tmp_path) == str(ck)
    # a run folder copied from elsewhere: its recorded checkpoints are the original folder's own,
    # and the copy resumes from (and writes to) its own RUN/checkpoints instead
    elsewhere = tmp_path / "original"
    (tmp_path / "run_config.json").write_text(json.dumps({**fields, "out_dir": str(elsewhere),
                                                          "checkpoint_dir": str(elsewhere / "checkpoints")}))
    monkeypatch.setattr(checkpoint, "latest", lambda root: (4, Path(root) / "step-4"))
    assert run_dir.recorded_checkpoint_dir(tmp_path) is None
    (tmp_path / "run_config.json").write_text("{not json")
    assert run_dir.recorded_checkpoint_dir(tmp_path) is None


def test_slurm_time_limit_rounds_up_and_counts_every_attempt():
    from smplan.executor.launch import check_slurm_time, slurm_time_limit

    assert slurm_time_limit(None, 100)[0] == slurm_time_limit(0.0, 100)[0] == "01:00:00"
    assert "predicts no step time" in slurm_time_limit(None, 100)[1]
    assert slurm_time_limit(0.01, 10)[0] == "00:11:00"  # 600 s + 0.15 s, up to the next minute
    assert slurm_time_limit(2.0, 1000) == ("01:00:00", "1.5x the predicted 2 s/step x 1000 steps, plus 10 minutes "
                                                       "of start-up")  # 600 + 1.5 x 2000 s
    assert slurm_time_limit(2.0, 1000, max_restarts=2) == ("01:20:00", "1.5x the predicted 2 s/step x 1000 steps, "
                                                                       "plus 10 minutes of start-up for each of 3 attempts")
    assert slurm_time_limit(5.0, 100_000, max_restarts=2)[0] == "8-16:50:00"  # days past 24 h
    for ok in ("90", "4:00:00", "2-00:00:00", "1-12", "0:30"):
        assert check_slurm_time(ok) == ok
    for bad in ("0", "00:00:00", "1h", "", "1:2:3:4", "-1"):
        with pytest.raises(ValueError, match="Slurm time"):
            check_slurm_time(bad)


def test_a_stopped_run_is_promised_a_resume_only_with_a_checkpoint(tmp_path):
    from smplan.executor.config import RunConfig
    from smplan.executor.launch import _how_to_continue

    ckpt = tmp_path / "checkpoints"
    cfg = RunConfig(plan={}, model_ref="m.py", out_dir=str(tmp_path), steps=10, checkpoint_dir=str(ckpt))
    assert "stopped before its first step: the same `smplan execute` command starts it again" in _how_to_continue(cfg)
    # a rank that raised before its first step raises again on a rerun (a review's finding)
    assert "failed before its first step, where a rerun is likely to fail the same way: fix" in _how_to_continue(cfg, failed=True)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 4.0}\n')
    assert "cannot be resumed" in _how_to_continue(cfg)
    (ckpt / "step-4").mkdir(parents=True)
    (ckpt / "step-4" / "COMPLETE").write_text("ok\n")
    (ckpt / "step-4" / "smplan.json").write_text("{}")
    # the folder named: a run without -o gets a new one each time (a review's resume started afresh)
    assert _how_to_continue(cfg) == (f"the same `smplan execute` command with -o {tmp_path} resumes it from its "
                                     "newest checkpoint (step-4)")
    # stopped after its last step (in the shutdown): a resume would be refused for having nothing to run
    (tmp_path / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "loss": 4.0}}\n' for s in range(1, 11)))
    assert _how_to_continue(cfg) == "every step ran and was recorded, so there is nothing left to resume"


def test_a_run_stopped_before_its_first_checkpoint_is_not_told_to_add_checkpoints(tmp_path):
    from smplan.executor.config import RunConfig
    from smplan.executor.launch import _how_to_continue

    cfg = RunConfig(plan={}, model_ref="m.py", out_dir=str(tmp_path), steps=5000, checkpoint_dir=str(tmp_path / "c"),
                    checkpoint_every=1000)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 4.0}\n')
    said = _how_to_continue(cfg)
    assert said.startswith("it stopped before its first checkpoint (step 1000), so it cannot be resumed")
    assert "--checkpoint-every" not in said


def test_ctrl_c_says_on_the_console_whether_the_run_can_be_resumed(tmp_path, monkeypatch):
    """Not only stopped.json: the one line Ctrl-C prints carries the same clause."""
    from smplan.executor.config import RunConfig
    from smplan.executor.launch import LaunchInterrupted, launch_local

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("torch.distributed.launcher.api.elastic_launch", interrupted)
    cfg = RunConfig(plan={}, model_ref="m.py", out_dir=str(tmp_path), steps=10)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 4.0}\n')
    with pytest.raises(LaunchInterrupted) as stopped:
        launch_local(cfg, 1)
    assert str(stopped.value).startswith(f"interrupted; run directory kept at {tmp_path}; it wrote no checkpoint, "
                                         "so it cannot be resumed")


def test_the_default_loss_takes_a_language_models_logits():
    """(batch, seq, vocab) scores against (batch, seq) targets: flattened, as a language model file
    without loss() would otherwise fail in F.cross_entropy; (N, C) and channel-first (N, C, L) as before."""
    import torch.nn.functional as F

    from smplan.model import default_loss

    gen = torch.Generator().manual_seed(0)
    logits, ids = torch.randn(2, 5, 7, generator=gen), torch.randint(0, 7, (2, 5), generator=gen)
    assert default_loss(logits, ids).item() == pytest.approx(F.cross_entropy(logits.reshape(10, 7), ids.reshape(10)).item())
    rows, labels = torch.randn(4, 3, generator=gen), torch.tensor([0, 2, 1, 1])
    assert default_loss(rows, labels).item() == pytest.approx(F.cross_entropy(rows, labels).item())
    channels_first, per_pixel = torch.randn(2, 3, 6, generator=gen), torch.randint(0, 3, (2, 6), generator=gen)
    assert default_loss(channels_first, per_pixel).item() == pytest.approx(
        F.cross_entropy(channels_first, per_pixel).item())

