"""A hand-written profile's value in another unit (FLOP/s for TFLOP/s, TB/s for GB/s) is named
in a warning; bundled and probed profiles get none."""

import json

import pytest
from smplan.hwprofiles import bundled_profiles, implausible_values
from smplan.hwprofiles.loader import PROFILE_DIR

from smplan.cli.main import cli

H100 = (PROFILE_DIR / "h100x8.toml").read_text()


@pytest.mark.parametrize("old, new, key", [
    ("bf16 = 989.0", "bf16 = 989e12", "gpu.peak_tflops.bf16"),
    ("bf16 = 989.0", "bf16 = 0.989", "gpu.peak_tflops.bf16"),
    ("memory_gib = 79.65", "memory_gib = 81920.0", "gpu.memory_gib"),
    ("memory_bandwidth_gbps = 3350.0", "memory_bandwidth_gbps = 3.35", "gpu.memory_bandwidth_gbps"),
    ("bandwidth_gbps = 50.0", "bandwidth_gbps = 400e9", "inter_node.bandwidth_gbps"),
])
def test_a_value_in_another_unit_is_named(tmp_path, old, new, key):
    path = tmp_path / "mine.toml"
    assert H100.count(old) == 1
    path.write_text(H100.replace(old, new))
    (warning,) = implausible_values(str(path))
    assert f": {key} = " in warning and "looks like another unit" in warning


def test_bundled_and_probed_profiles_are_plausible(probed):
    assert all(implausible_values(name) == [] for name in bundled_profiles())
    assert implausible_values(str(probed)) == []  # a CPU's 0.15 TFLOP/s and 12 GB/s are its own


def test_plan_warns_and_still_plans(cli_runner, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(H100.replace("bf16 = 989.0", "bf16 = 989e12"))
    result = cli_runner.invoke(cli, ["plan", "examples/gpt.py:tiny", "--hw", str(path), "--top", "1"])
    assert result.exit_code == 0, result.output
    assert "gpu.peak_tflops.bf16 = 9.89e+14 looks like another unit; it is read in TFLOP/s" in result.output


def test_an_override_in_another_unit_is_named_and_the_file_value_it_replaces_is_not(tmp_path):
    (warning,) = implausible_values("h100x8", {"gpu.peak_tflops.bf16": 989e12, "nodes": 4})
    assert warning.startswith("warning: --hw-set: gpu.peak_tflops.bf16 = 9.89e+14 looks like another unit")
    path = tmp_path / "mine.toml"
    path.write_text(H100.replace("memory_gib = 79.65", "memory_gib = 81920.0"))
    assert implausible_values(str(path), {"gpu.memory_gib": 79.65}) == []  # the override is what is used


def test_simulate_warns_about_an_override_in_another_unit(cli_runner):
    result = cli_runner.invoke(cli, ["simulate", "examples/gpt.py:tiny", "--hw", "h100x8", "--plan", "dp=8",
                                     "--hw-set", "inter_node.bandwidth_gbps=400e9"])
    assert result.exit_code == 0, result.output
    assert "warning: --hw-set: inter_node.bandwidth_gbps = 4e+11 looks like another unit" in result.output


def test_hw_show_names_a_value_in_another_unit(cli_runner, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(H100.replace("memory_bandwidth_gbps = 3350.0", "memory_bandwidth_gbps = 3.35"))
    result = cli_runner.invoke(cli, ["hw", "show", str(path)])
    assert result.exit_code == 0, result.output
    assert "gpu.memory_bandwidth_gbps = 3.35 looks like another unit" in result.stderr
    # --json stays one JSON object on stdout, its warnings under "notes" (as plan's and simulate's)
    shown = json.loads(cli_runner.invoke(cli, ["hw", "show", str(path), "--json"]).stdout)
    assert any("gpu.memory_bandwidth_gbps = 3.35 looks like another unit" in note for note in shown["notes"])
