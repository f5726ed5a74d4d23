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


@pytest.fixture(autouse=True, scope="session")
def _session_cache(tmp_path_factory):
    # Module- and session-scoped fixtures profile before the per-test cache below is set: they
    # get one of their own per pytest process (each xdist worker), never the user's ~/.cache.
    before = os.environ.get("SMPLAN_CACHE_DIR")
    os.environ["SMPLAN_CACHE_DIR"] = str(tmp_path_factory.mktemp("session-cache"))
    yield
    if before is None:
        os.environ.pop("SMPLAN_CACHE_DIR", None)
    else:
        os.environ["SMPLAN_CACHE_DIR"] = before


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
