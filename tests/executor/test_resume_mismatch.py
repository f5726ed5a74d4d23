"""A refused resume says what changed since the checkpoint (layout, model arguments, the model
file's bytes), from the fingerprint inputs `checkpoint.save` keeps in its meta; a checkpoint
written before it kept them is refused with the fingerprints, as before. One process, no group."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from smplan.executor import checkpoint
from smplan.executor.checkpoint import CheckpointMismatchError, check_resumable
from smplan.executor.config import (
    MAX_CHANGES_NAMED,
    describe_changes,
    fingerprint,
    fingerprint_inputs,
    hash_key,
)
from smplan.executor.run import resolve_plan

MLP = Path(__file__).resolve().parents[2] / "examples" / "mlp.py"
LAYOUT = {"dp": 2, "tp": 1, "pp": 1, "micro_batch": 2, "global_batch": 8, "schedule": "1f1b",
          "virtual_stages": 1, "zero": 0, "sequence_parallel": False, "stage_blocks": None}


def _inputs(**changes) -> dict:
    key = {"model": "model", "model_args": {"layers": 2, "width": 16}, "seq_len": None,
           "layout": dict(LAYOUT), "model_sha256": "a" * 64}
    for name, value in changes.items():
        where = key["layout"] if name in LAYOUT else key["model_args"] if name in ("layers", "width") else key
        where[name] = value
    return key


@pytest.mark.parametrize(("changes", "said"), [
    ({"dp": 1, "tp": 2}, "layout: dp 2 -> 1, tp 1 -> 2"),
    ({"micro_batch": 1}, "layout: micro_batch 2 -> 1"),
    ({"model_sha256": "b" * 64}, "the model file's contents differ (an edited file, or another one)"),
    ({"layers": 4}, "model_args: layers 2 -> 4"),
    ({"model": "tiny", "seq_len": 64}, "seq_len null -> 64; builder model -> tiny"),
])
def test_describe_changes_names_each_difference(changes, said):
    assert describe_changes(_inputs(), _inputs(**changes)) == said


def test_a_later_layout_key_left_at_its_default_is_named_by_its_value():
    """A layout keeps ep, cp and grad_compress only away from their defaults: ep=2 -> ep=1 said
    "ep 2 -> (unset)" (a review)."""
    theirs = _inputs()
    theirs["layout"]["ep"] = 2
    assert describe_changes(theirs, _inputs()) == "layout: ep 2 -> 1"


def test_describe_changes_names_at_most_a_few_and_counts_the_rest():
    ours = _inputs(dp=1, tp=2, pp=2, zero=1, layers=4, model_sha256="b" * 64)
    said = describe_changes(_inputs(), ours)
    assert said == "layout: dp 2 -> 1, pp 1 -> 2, tp 1 -> 2, zero 0 -> 1; and 2 more"
    assert said.count("->") == MAX_CHANGES_NAMED


def test_describe_changes_cuts_long_values_and_names_unset_keys():
    theirs = _inputs()
    del theirs["model_args"]["width"]
    ours = _inputs(stage_blocks=[[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]])
    said = describe_changes(theirs, ours)
    assert "stage_blocks null -> [[0, 1, 2, 3, 4, 5], [6…" in said
    assert "model_args: width (unset) -> 16" in said and "\n" not in said


def _save(root: Path, plan, model_ref: str, sha: str, step: int = 1) -> str:
    """A checkpoint as the executor's rank 0 saves it (meta as executor/train.py builds it)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fp = fingerprint(plan, sha)
    meta = {"fingerprint": fp, "fingerprint_inputs": fingerprint_inputs(plan, sha),
            "plan": plan.replace(model=model_ref).to_dict(), "model": model_ref}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP: "assuming the intent is to save in a single process"
        checkpoint.save(root, step, [model], [opt], meta, 0, lambda: None)
    return fp


@pytest.fixture
def saved(tmp_path):
    """(checkpoint folder, plan, model file) of a dp=2 mbs=2 run of a copy of examples/mlp.py."""
    model = tmp_path / "mlp.py"
    shutil.copy(MLP, model)
    plan, model_file = resolve_plan("dp=2,mbs=2,gbs=8", model=str(model))
    root = tmp_path / "ckpt"
    _save(root, plan, model_file.absolute_ref, model_file.sha256)
    return root, plan, model_file


def _refusal(root: Path, plan, sha: str) -> str:
    with pytest.raises(CheckpointMismatchError) as err:
        check_resumable(root, fingerprint(plan, sha), force=False, inputs=fingerprint_inputs(plan, sha))
    return str(err.value)


def test_the_fingerprint_is_the_hash_of_its_inputs(saved):
    _, plan, model_file = saved
    inputs = fingerprint_inputs(plan, model_file.sha256)
    assert hash_key(inputs) == fingerprint(plan, model_file.sha256) and inputs["layout"]["dp"] == 2


def test_a_changed_layout_is_refused_with_what_changed(saved):
    root, plan, model_file = saved
    said = _refusal(root, plan.replace(dp=1, tp=2), model_file.sha256)
    assert "(checkpoint -> this run: layout: dp 2 -> 1, tp 1 -> 2); use another --checkpoint-dir" in said
    said = _refusal(root, plan.replace(micro_batch=1), model_file.sha256)
    assert "layout: micro_batch 2 -> 1" in said and "fingerprint" not in said


def test_an_edited_model_file_is_refused_as_such(saved):
    root, plan, model_file = saved
    with model_file.path.open("a") as f:
        f.write("# a comment\n")
    _, edited = resolve_plan("dp=2,mbs=2,gbs=8", model=str(model_file.path))
    assert "(checkpoint -> this run: the model file's contents differ (an edited file, or another one))" in _refusal(root, plan, edited.sha256)


def test_a_checkpoint_without_inputs_is_refused_with_the_fingerprints(saved):
    root, plan, model_file = saved
    meta_file = root / "step-1" / "smplan.json"
    meta = json.loads(meta_file.read_text())
    del meta["fingerprint_inputs"]  # as an older smplan wrote it
    meta_file.write_text(json.dumps(meta))
    ours = fingerprint(plan.replace(dp=1, tp=2), model_file.sha256)
    assert f"(fingerprint {meta['fingerprint']} != {ours})" in _refusal(root, plan.replace(dp=1, tp=2),
                                                                       model_file.sha256)
