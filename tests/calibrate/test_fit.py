"""The pure fit (smplan.calibrate.fit): recovers known factors, error measures, profile files."""

import dataclasses
import math

import pytest
from smplan.hwprofiles import GroupSpan, load_cluster
from smplan.hwprofiles.perf import collective_time_s, matmul_time_s, memory_bound_time_s
from smplan.hwprofiles.profile_file import profile_path, with_efficiency, write_profile

from smplan.calibrate.fit import (
    CalibrationError,
    ape,
    fit_efficiency,
    median,
    spearman,
    undetermined_keys,
)

# Synthetic "runs": smallest GEMM dimension (fp32, compute-bound), GEMM count, element-wise bytes, all-reduce bytes, layer passes.
# They mix the terms differently (small and large GEMMs, comm-heavy, host-heavy), as the
# plans that `smplan calibrate` picks do, so every factor is identifiable.
RUNS = [
    (4096, 4, 2e9, 0.0, 50),
    (32, 400, 1e8, 0.0, 400),
    (1024, 20, 8e9, 1e8, 100),
    (64, 80, 5e8, 4e9, 60),
    (8192, 1, 1e9, 1e9, 20),
    (128, 200, 3e9, 0.0, 3000),
    (2048, 10, 0.0, 2e10, 30),
    (512, 50, 1e10, 5e8, 800),
]
SPAN = GroupSpan(size=8, ranks_per_node=8)


def synthetic(cluster):
    host_s = cluster.efficiency.host_overhead_us_per_layer * 1e-6
    return [
        count * matmul_time_s(4096, 4096, d, cluster, dtype="fp32") + memory_bound_time_s(elem, cluster)
        + collective_time_s("all_reduce", comm, SPAN, cluster) + passes * host_s
        for d, count, elem, comm, passes in RUNS
    ]


def with_eff(cluster, **values):
    return dataclasses.replace(cluster, efficiency=dataclasses.replace(cluster.efficiency, **values))


def test_fit_recovers_known_factors():
    base = load_cluster("a100x8")
    truth = with_eff(base, matmul_max=0.55, matmul_half_dim=80.0, memory_bound=0.6, network=0.7,
                     host_overhead_us_per_layer=300.0)
    start = with_eff(base, matmul_max=0.9, matmul_half_dim=20.0, memory_bound=0.95, network=0.95,
                     host_overhead_us_per_layer=1000.0)
    result = fit_efficiency(start, synthetic, synthetic(truth), prior_weight=0.0, tolerance=1e-4)
    for key in result.keys:
        got, want = getattr(result.efficiency, key), getattr(truth.efficiency, key)
        assert math.isclose(got, want, rel_tol=0.02), (key, got, want)
    assert result.loss_after < 1e-4 < result.loss_before


def test_fit_only_moves_the_keys_it_is_given():
    base = load_cluster("a100x8")
    truth = with_eff(base, matmul_max=0.5)
    result = fit_efficiency(base, synthetic, synthetic(truth), keys=("matmul_max",), prior_weight=0.0)
    assert math.isclose(result.efficiency.matmul_max, 0.5, rel_tol=0.01)
    assert result.efficiency.network == base.efficiency.network
    assert result.changes(base.efficiency) == {"matmul_max": (base.efficiency.matmul_max, result.efficiency.matmul_max)}


def overlapped(cluster):
    """The runs with host time overlapping GPU work, as the cost model has it: max(GPU, host)."""
    host_s = cluster.efficiency.host_overhead_us_per_layer * 1e-6
    return [max(t - passes * host_s, passes * host_s) for t, (*_, passes) in zip(synthetic(cluster), RUNS, strict=True)]


def test_a_factor_no_run_depends_on_is_kept_and_said_so():
    """Host time that every run's GPU work hides: the fit must not call its start value fitted."""
    base = with_eff(load_cluster("a100x8"), host_overhead_us_per_layer=1.0)  # hidden in every run
    truth = with_eff(base, matmul_max=0.5)
    result = fit_efficiency(base, overlapped, overlapped(truth))
    assert result.undetermined == ("host_overhead_us_per_layer",)
    assert "host_overhead_us_per_layer" not in result.determined and "matmul_max" in result.determined
    assert result.efficiency.host_overhead_us_per_layer == 1.0  # kept exactly
    exposed = with_eff(base, host_overhead_us_per_layer=1e6)  # a second per pass: every run waits for the host
    assert "host_overhead_us_per_layer" not in fit_efficiency(exposed, overlapped, overlapped(exposed)).undetermined


def test_a_factor_the_fit_moved_counts_as_determined_where_it_no_longer_matters():
    def predict(cluster):  # host time shows only above 1 s a step
        return [max(1.0, cluster.efficiency.host_overhead_us_per_layer * 1e-6)]

    fitted = with_eff(load_cluster("a100x8"), host_overhead_us_per_layer=1e5)
    assert undetermined_keys(fitted, predict, ("host_overhead_us_per_layer",)) == ("host_overhead_us_per_layer",)
    moved_from = with_eff(fitted, host_overhead_us_per_layer=5e6).efficiency  # the runs pulled it down from 5 s
    assert undetermined_keys(fitted, predict, ("host_overhead_us_per_layer",), moved_from) == ()


def test_fractions_stay_at_most_one():
    base = load_cluster("a100x8")
    faster = [t / 3 for t in synthetic(base)]  # faster than any efficiency <= 1 allows
    result = fit_efficiency(base, synthetic, faster)
    for key in ("matmul_max", "memory_bound", "network"):
        assert 0 < getattr(result.efficiency, key) <= 1.0


def test_fit_rejects_bad_input():
    base = load_cluster("a100x8")
    with pytest.raises(CalibrationError, match="cannot fit"):
        fit_efficiency(base, synthetic, synthetic(base), keys=("memory_reserve_gib",))
    with pytest.raises(CalibrationError, match="positive"):
        fit_efficiency(base, synthetic, [0.0] * len(RUNS))
    with pytest.raises(CalibrationError, match="returned 8 times for 2"):
        fit_efficiency(base, synthetic, [1.0, 2.0])


def test_error_measures():
    assert ape(110, 100) == pytest.approx(0.1) and ape(90, 100) == pytest.approx(0.1)
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, rel=1e-6)  # ties averaged


def test_calibrated_profile_keeps_the_file_and_loads(tmp_path):
    source = profile_path("a100x8")
    text = source.read_text()
    eff = dataclasses.replace(load_cluster("a100x8").efficiency, matmul_max=0.61, host_overhead_us_per_layer=7.5)
    new = with_efficiency(text, eff, ["calibrated in a test"])
    assert new.count("[efficiency]") == 1 and "# calibrated in a test" in new
    assert text.split("[efficiency]")[0].strip() in new  # everything before the table is kept
    path = write_profile(new, tmp_path / "cal.toml")
    cluster = load_cluster(str(path))
    assert cluster.efficiency.matmul_max == 0.61 and cluster.efficiency.host_overhead_us_per_layer == 7.5
    assert cluster.gpu == load_cluster("a100x8").gpu


def test_write_profile_refuses_to_overwrite(tmp_path):
    path = tmp_path / "cal.toml"
    path.write_text("keep me")
    text = with_efficiency(profile_path("a100x8").read_text(), load_cluster("a100x8").efficiency)
    with pytest.raises(ValueError, match="--force"):
        write_profile(text, path)
    assert path.read_text() == "keep me"
    write_profile(text, path, force=True)
    assert load_cluster(str(path)).name == load_cluster("a100x8").name


def test_write_profile_refuses_an_invalid_profile(tmp_path):
    text = profile_path("a100x8").read_text().replace("[gpu]", "[gpu]\nbogus = 1", 1)
    with pytest.raises(ValueError, match="nothing written"):
        write_profile(text, tmp_path / "bad.toml")
    assert not list(tmp_path.iterdir())
