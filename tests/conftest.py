import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
if os.environ.get("CI"):  # CI runs one fixed set of property examples; locally they are random
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True)
    settings.load_profile("ci")
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(ROOT))


@pytest.fixture
def cli_runner():
    from click.testing import CliRunner

    return CliRunner()


_SESSION_CACHE: list[str] = []


def pytest_configure(config):
    # Profiles made at import or by module and session fixtures, before the per-test cache below is
    # set, go to one cache per pytest process (each xdist worker), never the user's ~/.cache.
    import tempfile

    _SESSION_CACHE.append(tempfile.mkdtemp(prefix="smplan-test-cache-"))
    os.environ["SMPLAN_CACHE_DIR"] = _SESSION_CACHE[-1]


def pytest_unconfigure(config):
    import shutil

    for folder in _SESSION_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    # The profiler caches on disk; tests must not share a cache with the user or each other.
    monkeypatch.setenv("SMPLAN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def probed(tmp_path):
    """A profile as `smplan hw probe` writes it, with CPU-like figures."""
    from smplan.hwprofiles.probe import ProbeResult, to_toml

    result = ProbeResult(device="cpu", nproc=2, peak_tflops={"fp32": 0.15, "bf16": 0.15}, matmul_half_dim=40.0,
                         memory_bandwidth_gbps=12.0, memory_gib=4.0, link_bandwidth_gbps=1.5, link_latency_us=100.0)
    path = tmp_path / "probed.toml"
    path.write_text(to_toml(result))
    return path
