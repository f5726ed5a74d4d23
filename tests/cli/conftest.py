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


def fake_runs(monkeypatch, model: str, cluster, factor: float, ran: list | None = None) -> None:
    """calibrate's runs replaced by measurements `factor` x the cost model's step on `cluster`
    (the plans' own list in `ran`, if given): a machine slower than predicted, in milliseconds."""
    from smplan.planner import estimate, profile_model

    from smplan.calibrate.measure import Measured

    def run(plan, label, model_file, steps, nproc, run_dir):
        if ran is not None:
            ran.append(plan)
        profile = profile_model(model, dtype=plan.dtype)
        return Measured(plan, label, factor * estimate(plan, profile, cluster).step_time_s, str(run_dir))

    monkeypatch.setattr("smplan.calibrate.run.run_plan", run)
