"""The executor's new records, single-process: block gradient norms, phase timing, the
slow-rank hook's parsing, resuming a metrics file cut short, TensorBoard writing."""

from __future__ import annotations

import json
import math

import pytest
import torch
from smplan.executor.config import parse_slow_rank
from smplan.executor.grad_norms import block_grad_norms, block_index
from smplan.executor.metrics import MetricsWriter, rank_file
from smplan.executor.tensorboard_log import (
    BLOCK_NORMS_TAG,
    MEASURED_TAG,
    PREDICTED_TAG,
    TensorBoardLog,
)
from smplan.executor.timing import PhaseTimer
from smplan.planner.model_file import load_model_file

from smplan.model import Layout
from smplan.model.structure import find_layout
from tests.conftest import EXAMPLES


@pytest.mark.parametrize(("name", "fqn", "index"), [
    ("blocks.2.attn.weight", "blocks", 2),
    ("module.blocks.0._checkpoint_wrapped_module.mlp.fc.weight", "blocks", 0),
    ("transformer.h.11._fsdp_wrapped_module.ln.bias", "transformer.h", 11),
    ("embed.weight", "blocks", None),
    ("head.blocks_norm.weight", "blocks", None),
    ("encoder.layers.encoder_layer_1.mlp.0.weight", "encoder.layers", 1),  # torchvision ViT names
    ("1.weight", "", 1),  # the model itself is the nn.Sequential of blocks
])
def test_block_index(name, fqn, index):
    names = tuple(f"encoder_layer_{i}" for i in range(3)) if "encoder" in fqn else tuple(str(i) for i in range(12))
    assert block_index(name, Layout(fqn, names, (), ())) == index


def test_block_norms_add_up_to_the_global_norm():
    model_file = load_model_file(f"{EXAMPLES / 'gpt.py'}:tiny")
    torch.manual_seed(0)
    model = model_file.build({}, device="cpu")
    x, y = model_file.hook("batch")(2, model=model, seed=0)
    torch.nn.functional.cross_entropy(model(x).flatten(0, -2), y.flatten()).backward()
    layout = find_layout(model)
    norms = block_grad_norms([model], layout, torch.device("cpu"))
    assert len(norms) == layout.num_blocks and all(n > 0 for n in norms)
    in_blocks = [p.grad for n, p in model.named_parameters() if block_index(n, layout) is not None]
    total = torch.nn.utils.get_total_norm(in_blocks, 2.0).item()
    assert math.sqrt(sum(n * n for n in norms)) == pytest.approx(total, rel=1e-5)


def test_phase_timer_sums_repeated_phases():
    timer = PhaseTimer(torch.device("cpu"))
    for _ in range(2):
        timer.mark("forward")
        timer.mark("backward")
    totals = timer.totals_s()
    assert set(totals) == {"forward", "backward"} and all(v >= 0 for v in totals.values())


def test_parse_slow_rank():
    assert parse_slow_rank("1:0.3") == (1, 0.3)
    assert parse_slow_rank(None) is None
    for bad in ("1", "a:1", "1:x", "-1:0.1"):
        with pytest.raises(ValueError, match="RANK:SECONDS"):
            parse_slow_rank(bad)


def test_resume_drops_later_steps_and_a_truncated_line(tmp_path):
    path = rank_file(tmp_path, 3)
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "lo')
    MetricsWriter(tmp_path, resume_step=2, path=path)
    assert path.name == "rank-00003.jsonl"
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


def test_tensorboard_log_round_trip(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = TensorBoardLog(tmp_path, predicted_step_time_s=0.5)
    for step in (1, 2):
        log.write({"step": step, "loss": 3.0, "grad_norm": 1.0, "tokens_per_s": 10.0, "peak_memory_gib": 0.1,
                   "step_time_s": 0.25 * step, "phases_s": {"forward": 0.1},
                   **({"block_grad_norms": [0.1, 0.2, 0.3]} if step == 1 else {})})
    log.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    assert [e.value for e in acc.Scalars(MEASURED_TAG)] == [0.25, 0.5]
    assert [e.value for e in acc.Scalars(PREDICTED_TAG)] == [0.5, 0.5]
    (hist,) = acc.Histograms(BLOCK_NORMS_TAG)
    assert hist.step == 1 and hist.histogram_value.num == 3


def test_tensorboard_missing_is_one_line_before_launch(cli_runner, tmp_path, monkeypatch):
    import sys

    from smplan.cli.main import cli

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard -> ImportError
    out = tmp_path / "run"
    result = cli_runner.invoke(cli, ["execute", "dp=2,mbs=1,gbs=4", "--model", f"{EXAMPLES / 'gpt.py'}:tiny",
                                     "--out", str(out), "--tensorboard"])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == "error: --tensorboard needs the tensorboard package: pip install 'smplan[monitor]'"
    assert not out.exists()


def test_slow_rank_hook_is_checked_before_launch(cli_runner, tmp_path):
    from smplan.cli.main import cli

    result = cli_runner.invoke(cli, ["execute", "dp=2,mbs=1,gbs=4", "--model", f"{EXAMPLES / 'gpt.py'}:tiny",
                                     "--out", str(tmp_path / "run")], env={"SMPLAN_SLOW_RANK": "one"})
    assert result.exit_code == 2 and "must be RANK:SECONDS" in result.output, result.output
