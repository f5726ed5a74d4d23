"""--reference-batch / --lr-scaling: the rule (pure) and one real run that records it."""

from __future__ import annotations

import json
import math

import pytest
from smplan.executor.lr_scaling import lr_scale

from tests.executor.runs import metrics, run_execute


def test_rules():
    assert lr_scale(512, None) == 1.0
    assert lr_scale(512, 128, "linear") == 4.0  # Goyal et al. 2017
    assert lr_scale(512, 128, "sqrt") == 2.0  # Malladi et al. 2022
    assert lr_scale(32, 128) == pytest.approx(math.sqrt(0.25))
    assert lr_scale(64, 64, "linear") == 1.0
    for bad in (("cubic", 4), ("sqrt", 0)):
        with pytest.raises(ValueError, match="--lr-scaling|--reference-batch"):
            lr_scale(8, bad[1], bad[0])


def test_execute_scales_lr_and_records_it(tmp_path):
    out = tmp_path / "run"
    result = run_execute("mbs=1,gbs=8", out, "--steps", "1", "--lr", "1e-3", "--min-lr", "1e-4",
                         "--reference-batch", "2", "--lr-scaling", "sqrt")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "lr scaled sqrt (Malladi et al. 2022, Adam)" in result.stdout and "= 0.002" in result.stdout
    assert metrics(out)[0]["lr"] == pytest.approx(2e-3)
    config = json.loads((out / "run_config.json").read_text())
    assert (config["reference_batch"], config["lr_scaling"], config["lr_scale"]) == (2, "sqrt", 2.0)
    assert config["lr"] == pytest.approx(2e-3) and config["min_lr"] == pytest.approx(2e-4)
