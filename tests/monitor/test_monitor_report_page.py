"""`smplan report RUN_DIR`: a headline that says what ran and how, a heatmap at the real steps."""

from __future__ import annotations

import json
import re
from html import unescape

import numpy as np
import pytest

from smplan.monitor import load_run
from smplan.monitor.charts import grad_norm_heatmap
from smplan.monitor.report import render_run_html
from tests.monitor.fake_runs import write_run


def test_the_headline_names_model_layout_steps_and_measured_against_predicted(tmp_path):
    # it only repeated the folder's name, already the page's title
    run_dir = write_run(tmp_path / "demo", steps=6, total_steps=10, finished=False)
    config = json.loads((run_dir / "run_config.json").read_text())
    (run_dir / "run_config.json").write_text(json.dumps({**config, "model_ref": "/home/me/examples/gpt.py:tiny"}))
    page = render_run_html(load_run(run_dir))
    headline = unescape(re.search(r'<p class="question">(.*?)</p>', page).group(1))
    assert headline.startswith("gpt.py:tiny, dp=2 tp=1 pp=1 mbs=1 gbs=4: 6 of 10 steps so far")
    assert "measured 40.0 ms a step, 0.80x the predicted 50.0 ms" in headline
    assert str(run_dir) not in headline


def test_the_gradient_norm_heatmap_puts_each_recorded_step_at_its_step(tmp_path):
    # steps 1, 2, 4, 6 were four equal columns; a column now spans the steps nearest its record
    run = load_run(write_run(tmp_path / "demo", steps=6, blocks=3))
    ax = grad_norm_heatmap(run).axes[0]
    (mesh,) = [c for c in ax.collections if c.get_gid() == "heatmap"]
    edges = mesh.get_coordinates()[0, :, 0].tolist()
    assert edges == pytest.approx([0.5, 1.5, 3.0, 5.0, 6.5])
    norms = np.array([r["block_grad_norms"] for r in run.records if r.get("block_grad_norms")]).T
    assert np.asarray(mesh.get_array()).reshape(norms.shape) == pytest.approx(norms)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "6"]
