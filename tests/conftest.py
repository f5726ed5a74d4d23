import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(ROOT))


@pytest.fixture
def cli_runner():
    from click.testing import CliRunner

    return CliRunner()


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    # The profiler caches on disk; tests must not share a cache with the user or each other.
    monkeypatch.setenv("SMPLAN_CACHE_DIR", str(tmp_path / "cache"))
