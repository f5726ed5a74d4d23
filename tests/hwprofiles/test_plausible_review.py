"""Review findings on hardware values in the wrong unit (hwprofiles/plausible.py) and the
bundled figures they checked."""

import json

import click
import pytest
from smplan.hwprofiles import PROBED_CPU_NAME, implausible_values, load_cluster
from smplan.hwprofiles.loader import PROFILE_DIR

from smplan.cli.main import cli

TINY = "examples/gpt.py:tiny"
H100 = (PROFILE_DIR / "h100x8.toml").read_text()


def test_l40s_memory_is_what_cuda_reports_with_ecc_on():
    # nvidia-smi shows 46,068 MiB on an L40S with ECC on: 44.99 GiB, not the datasheet's 48 GB
    assert load_cluster("l40sx8").gpu.memory_gib == 45.0


@pytest.mark.parametrize("overrides, key, words", [
    ({"inter_node.bandwidth_gbps": 400}, "inter_node.bandwidth_gbps", "gigabytes, not gigabits"),  # 400 Gb/s typed
    ({"inter_node.bandwidth_gbps": 60}, "inter_node.bandwidth_gbps", "above the link inside one"),  # > PCIe's 32
    ({"intra_node.bandwidth_gbps": 5}, "intra_node.bandwidth_gbps", "above the link inside one"),
    ({"inter_node.latency_us": 8e-6}, "inter_node.latency_us", "multiply a seconds figure by 1e6"),
    ({"efficiency.host_overhead_us_per_layer": 0.001}, "efficiency.host_overhead_us_per_layer", "microseconds"),
])
def test_a_network_figure_in_gbit_or_a_time_in_seconds_is_named(overrides, key, words):
    (warning,) = implausible_values("l40sx8", overrides)
    assert warning.startswith(f"warning: --hw-set: {key} = ") and words in warning, warning
    assert "per GPU per direction" in warning or "microseconds" in warning


def test_a_zero_price_is_named_on_a_gpu_but_not_on_a_probed_cpu():
    (warning,) = implausible_values("h100x8", {"cost.usd_per_gpu_hour": 0})
    assert warning.startswith("warning: --hw-set: cost.usd_per_gpu_hour = 0 makes every $ figure 0"), warning
    assert implausible_values("h100x8", {"cost.usd_per_gpu_hour": 2.5}) == []
    for probed in (PROBED_CPU_NAME, "cuda"):  # `smplan hw probe` writes 0 for "local machine"
        assert implausible_values("h100x8", {"cost.usd_per_gpu_hour": 0, "gpu.name": probed}) == []


def test_the_bundled_fastest_nic_is_not_named():
    assert implausible_values("b300x8") == []  # ConnectX-8, 100 GB/s per GPU: the ceiling itself


def test_a_file_with_gbit_inter_node_warns_and_still_plans(cli_runner, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(H100.replace("bandwidth_gbps = 50.0", "bandwidth_gbps = 400.0"))
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", str(path), "--top", "1"])
    assert result.exit_code == 0, result.output
    assert f"warning: {path}: inter_node.bandwidth_gbps = 400 is more than any NIC" in result.stderr


def test_a_peak_past_the_hard_limit_is_refused_with_the_unit_hint(cli_runner, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(H100.replace("bf16 = 989.0", "bf16 = 1.3074e15"))
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", str(path)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "divide a FLOP/s figure by 1e12" in lines[0]


def _stop(*args, **kwargs):
    raise click.exceptions.Exit(0)  # the warnings come before the sweep: no need to run it


def test_whatif_vary_names_hardware_values_in_another_unit(cli_runner, tmp_path, monkeypatch):
    monkeypatch.setattr("smplan.whatif.run_whatif", _stop)
    result = cli_runner.invoke(cli, ["whatif", TINY, "--hw", "h100x8", "-o", str(tmp_path / "r"),
                                     "--vary", "inter_node.bandwidth_gbps=1e6,50", "--vary", "gpu.memory_gib=80e9,80"])
    assert result.exit_code == 0, result.output
    assert "warning: --vary on h100x8: inter_node.bandwidth_gbps = 1e+06 looks like another unit" in result.stderr
    assert "warning: --vary on h100x8: gpu.memory_gib = 8e+10 looks like another unit" in result.stderr
    assert "= 50 " not in result.stderr and "= 80 " not in result.stderr


def test_a_stack_with_seconds_for_microseconds_warns(cli_runner, tmp_path, monkeypatch):
    stack = tmp_path / "s_sec.toml"
    stack.write_text("host_overhead_us_per_layer = 0.001075\nelementwise_fusion = 1.0\noverlap_grad_reduce = true\n")
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", "h100x8", "--stack", str(stack), "--top", "1"])
    assert result.exit_code == 0, result.output
    assert f"warning: {stack}: host_overhead_us_per_layer = 0.001075 looks like another unit" in result.stderr
    monkeypatch.setattr("smplan.whatif.run_whatif", _stop)
    swept = cli_runner.invoke(cli, ["whatif", TINY, "-o", str(tmp_path / "r"), "--vary", f"stack=torchtitan,{stack}"])
    assert "host_overhead_us_per_layer = 0.001075 looks like another unit" in swept.stderr, swept.output
    # the commands that show a stack say it too (a review found them silent)
    for show in (["stack", "show", str(stack)], ["hw", "show", "h100x8", "--stack", str(stack)]):
        shown = cli_runner.invoke(cli, show)
        assert shown.exit_code == 0, shown.output
        assert "host_overhead_us_per_layer = 0.001075 looks like another unit" in shown.stderr, show


@pytest.mark.parametrize("hw, overrides, words", [
    # a PCIe box that left intra_node.fabric at its default "switch" would get NVLink's TP overlap
    ("h100x8", {"intra_node.bandwidth_gbps": 32}, 'is a PCIe figure, but intra_node.fabric is "switch"'),
    ("l40sx8", {"intra_node.bandwidth_gbps": 256}, "more than a PCIe 6.0 x16 slot carries"),  # Gb/s typed
    ("h100x8", {"inter_node.latency_us": 6000}, "divide a nanoseconds figure by 1000"),
    ("h100x8", {"reliability.gpu_mtbf_hours": 1.8e8}, "divide a seconds figure by 3600"),
])
def test_a_link_or_reliability_figure_that_no_hardware_has_is_named(hw, overrides, words):
    (warning,) = implausible_values(hw, overrides)
    (key,) = overrides
    assert warning.startswith(f"warning: --hw-set: {key} = ") and words in warning, warning


def test_hw_show_states_a_link_figure_in_gbit_per_gpu_and_per_node(cli_runner):
    # 100 Gb/s Ethernet typed as 100 passes every bound (an 800 Gb/s NIC per GPU is 100 GB/s):
    # `hw show` says what the figure means, 800 Gb/s per GPU, 6400 Gb/s per node
    result = cli_runner.invoke(cli, ["hw", "show", "h100x8", "--hw-set", "inter_node.bandwidth_gbps=100"])
    assert result.exit_code == 0, result.output
    assert ("bandwidth_gbps = 100.0 (GB/s per GPU per direction = 800 Gb/s per GPU, 6400 Gb/s per node of 8)"
            in result.output), result.output
    # --json lists the warnings it prints, as plan's and simulate's do
    shown = cli_runner.invoke(cli, ["hw", "show", "h100x8", "--hw-set", "intra_node.bandwidth_gbps=32", "--json"])
    assert shown.exit_code == 0, shown.output
    (note,) = json.loads(shown.stdout)["notes"]
    assert 'is a PCIe figure, but intra_node.fabric is "switch"' in note


def test_a_probed_profile_is_not_held_to_link_bounds_it_measured_itself():
    # `hw probe --nproc-per-node 4` on 2 cores measured 1,048 us (review); a GPU probe writes no fabric
    assert implausible_values("h100x8", {"gpu.name": "cpu", "inter_node.latency_us": 1048.6}) == []
    assert implausible_values("h100x8", {"gpu.name": "cuda", "intra_node.bandwidth_gbps": 21,
                                         "inter_node.bandwidth_gbps": 10}) == []
