"""A model file imports a module beside it (`from lm import LM` next to lm.py), as `python
file.py` would; the folder leaves sys.path afterwards."""

from __future__ import annotations

import sys

from smplan.planner import load_model_file, profile_model

from tests.conftest import EXAMPLES

# The sibling's name is one no other test uses: sys.modules keeps it for the process.
SIBLING = "sibling_mlp_smplan_test"


def test_a_model_file_imports_its_neighbour(tmp_path, monkeypatch):
    (tmp_path / f"{SIBLING}.py").write_text((EXAMPLES / "mlp.py").read_text())
    (tmp_path / "uses_it.py").write_text(f"from {SIBLING} import model, batch  # noqa: F401\n")
    monkeypatch.chdir(EXAMPLES)  # not the file's folder: the import must not depend on the cwd
    before = list(sys.path)
    try:
        loaded = load_model_file(str(tmp_path / "uses_it.py"))
        assert loaded.module.model is sys.modules[SIBLING].model
        assert sys.path == before  # the folder was on sys.path while the file ran, not after
        assert profile_model(str(tmp_path / "uses_it.py")).num_blocks > 0  # the profiler loads it the same way
    finally:
        sys.modules.pop(SIBLING, None)
