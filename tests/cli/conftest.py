"""Fixtures shared by the CLI tests."""

import pytest
from smplan.hwprofiles.probe import ProbeResult, to_toml


@pytest.fixture
def probed(tmp_path):
    """A profile as `smplan hw probe` writes it, with CPU-like figures."""
    result = ProbeResult(device="cpu", nproc=2, peak_tflops={"fp32": 0.15, "bf16": 0.15}, matmul_half_dim=40.0,
                         memory_bandwidth_gbps=12.0, memory_gib=4.0, link_bandwidth_gbps=1.5, link_latency_us=100.0)
    path = tmp_path / "probed.toml"
    path.write_text(to_toml(result))
    return path
