"""Bundled profiles load and hold their datasheet numbers; user files and overrides work."""

import re

import pytest
from smplan.hwprofiles import HardwareProfileError, bundled_profiles, load_cluster
from smplan.hwprofiles.loader import PROFILE_DIR
from smplan.hwprofiles.paths import tomllib

EXPECTED_PROFILES = {
    "v100x8",
    "a100x8",
    "a100-40gx8",
    "h100x8",
    "h200x8",
    "b200x8",
    "mi300xx8",
    "l40sx8",
    "b300x8",
    "gb200nvl72",
    "gb300nvl72",
}
NVL72 = {"gb200nvl72", "gb300nvl72"}

# (profile, dotted key, datasheet value): the figures the planner leans on hardest.
DATASHEET = [
    ("v100x8", "gpu.memory_bandwidth_gbps", 900.0),
    ("v100x8", "gpu.peak_tflops.fp16", 125.0),
    ("v100x8", "inter_node.bandwidth_gbps", 6.25),
    ("a100-40gx8", "gpu.memory_gib", 39.59),  # as CUDA reports it: 40,536 MiB
    ("a100-40gx8", "gpu.memory_bandwidth_gbps", 1555.0),
    ("h100x8", "gpu.peak_tflops.bf16", 989.0),
    ("h100x8", "gpu.peak_tflops.fp8", 1979.0),
    ("h100x8", "gpu.memory_bandwidth_gbps", 3350.0),
    ("h100x8", "intra_node.bandwidth_gbps", 450.0),
    ("h100x8", "inter_node.bandwidth_gbps", 50.0),
    ("h200x8", "gpu.memory_gib", 140.4),  # as CUDA reports it: 143,771 MiB
    ("h200x8", "gpu.memory_bandwidth_gbps", 4800.0),
    ("b200x8", "gpu.memory_gib", 179.06),  # 183,359 MiB
    ("b200x8", "gpu.peak_tflops.bf16", 2250.0),
    ("b200x8", "gpu.peak_tflops.fp8", 4500.0),
    ("b200x8", "intra_node.bandwidth_gbps", 900.0),
    ("mi300xx8", "gpu.memory_gib", 191.69),  # rocm-smi 205,822,885,888 B
    ("mi300xx8", "gpu.memory_bandwidth_gbps", 5300.0),
    ("mi300xx8", "gpu.peak_tflops.bf16", 1307.4),
    ("l40sx8", "gpu.memory_bandwidth_gbps", 864.0),
    ("l40sx8", "gpu.peak_tflops.bf16", 362.05),
    ("l40sx8", "intra_node.bandwidth_gbps", 32.0),
    ("b300x8", "gpu.peak_tflops.fp8", 4500.0),
    ("b300x8", "inter_node.bandwidth_gbps", 100.0),
    ("gb200nvl72", "gpu.memory_gib", 185.03),  # 189,471 MiB
    ("gb200nvl72", "gpu.peak_tflops.bf16", 2500.0),
    ("gb200nvl72", "nvlink_domain_gpus", 72),
    ("gb300nvl72", "gpu.peak_tflops.fp8", 5000.0),
    ("gb300nvl72", "inter_node.bandwidth_gbps", 100.0),
]

NUMBER_LINE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*=\s*[-+]?[0-9][0-9_.eE+-]*\s*(#.*)?$")


def test_all_expected_profiles_are_bundled():
    assert EXPECTED_PROFILES <= set(bundled_profiles())


@pytest.mark.parametrize("name", sorted(EXPECTED_PROFILES))
def test_profile_loads_and_is_plausible(name):
    c = load_cluster(name)
    assert c.name == name and c.nodes == 1
    # NVL72 racks: 4-GPU trays in one 72-GPU NVLink domain; every other profile is one 8-GPU node.
    assert (c.gpus_per_node, c.fast_domain_gpus) == ((4, 72) if name in NVL72 else (8, 8))
    peaks = c.gpu.peak_tflops
    assert 0 < peaks.fp32 <= peaks.fp16
    assert peaks.fp8 == 0 or peaks.fp8 == pytest.approx(2 * peaks.bf16, rel=0.02)
    assert c.inter_node.bandwidth_gbps < c.intra_node.bandwidth_gbps
    assert c.inter_node.latency_us >= c.intra_node.latency_us
    assert c.cost.usd_per_gpu_hour > 0 and re.search(r"20\d\d", c.cost.source)


@pytest.mark.parametrize("name,key,value", DATASHEET)
def test_datasheet_numbers(name, key, value):
    assert load_cluster(name).get(key) == pytest.approx(value)


@pytest.mark.parametrize("name", sorted(EXPECTED_PROFILES))
def test_every_number_has_a_source_comment(name):
    """Each number has a comment on its line, right above it, or on its table header."""
    lines = (PROFILE_DIR / f"{name}.toml").read_text().splitlines()
    header_commented = False
    previous = ""
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("["):
            header_commented = "#" in stripped
        match = NUMBER_LINE.match(line)
        if match and match.group(1) not in ("nodes", "gpus_per_node"):
            assert match.group(2) or previous.startswith("#") or header_commented, (
                f"{name}: {line!r}"
            )
        if stripped:
            previous = stripped


@pytest.mark.parametrize("name", sorted(EXPECTED_PROFILES))
def test_profiles_keep_efficiency_defaults(name):
    # Global efficiency factors live in cluster.Efficiency, not per profile (DESIGN.md).
    data = tomllib.loads((PROFILE_DIR / f"{name}.toml").read_text())
    assert "efficiency" not in data


def test_user_toml_path(tmp_path):
    text = (PROFILE_DIR / "h100x8.toml").read_text().replace('name = "h100x8"', 'name = "mine"')
    path = tmp_path / "mine.toml"
    path.write_text(text)
    c = load_cluster(str(path))
    assert c.name == "mine" and c.gpu.peak_tflops.bf16 == 989.0


def test_a_folder_named_like_a_bundled_profile_does_not_hide_it(tmp_path, monkeypatch):
    from smplan.hwprofiles import load_stack

    monkeypatch.chdir(tmp_path)
    (tmp_path / "h100x8").mkdir()  # e.g. a `whatif -o h100x8` report
    (tmp_path / "torchtitan").mkdir()  # e.g. a torchtitan checkout
    assert load_cluster("h100x8").gpu.name == "H100-SXM5-80GB"
    assert load_stack("torchtitan").name == "torchtitan"
    (tmp_path / "mine").mkdir()
    with pytest.raises(HardwareProfileError, match="unknown hardware profile 'mine'"):
        load_cluster("mine")


def test_nodes_and_overrides():
    c = load_cluster(
        "a100x8", nodes=16, overrides=["inter_node.bandwidth_gbps=50", "gpu.memory_gib=40"]
    )
    assert c.nodes == 16 and c.num_gpus == 128
    assert c.inter_node.bandwidth_gbps == 50.0 and isinstance(c.inter_node.bandwidth_gbps, float)
    assert c.gpu.memory_gib == 40.0
    d = load_cluster("a100x8", overrides={"efficiency.network": 0.5, "cost.usd_per_gpu_hour": 3})
    assert d.efficiency.network == 0.5 and d.cost.usd_per_gpu_hour == 3.0
    assert load_cluster("a100x8").with_nodes(4).num_gpus == 32


def _profile_text(**replace):
    text = (PROFILE_DIR / "a100x8.toml").read_text()
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    return text


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message.strip(), message
    return message


BAD_FILES = {
    "missing key": (
        _profile_text(**{"memory_bandwidth_gbps = 2039.0": ""}),
        "missing key 'gpu.memory_bandwidth_gbps'",
    ),
    "zero bandwidth": (
        _profile_text(**{"bandwidth_gbps = 25.0": "bandwidth_gbps = 0"}),
        "inter_node.bandwidth_gbps must be greater than 0",
    ),
    "negative bandwidth": (
        _profile_text(**{"bandwidth_gbps = 300.0": "bandwidth_gbps = -1"}),
        "intra_node.bandwidth_gbps must be greater than 0",
    ),
    "string for number": (
        _profile_text(**{"memory_gib = 80.0": 'memory_gib = "80 GB"'}),
        "'gpu.memory_gib' must be a number (GiB)",
    ),
    "broken syntax": (_profile_text(**{"[cost]": "[cost"}), "is not valid TOML"),
    "unknown key": (
        _profile_text(**{"[cost]": "[cost]\ncurrency = 1"}),
        "unknown key 'cost.currency'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_profile_file_one_line(tmp_path, case):
    text, expected = BAD_FILES[case]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(HardwareProfileError) as err:
        load_cluster(str(path))
    assert expected in _one_line(err)


@pytest.mark.parametrize(
    "override,expected",
    [
        ("gpu.nope=1", "unknown hardware key 'gpu.nope'"),
        ("inter_node.bandwidth_gbps=0", "inter_node.bandwidth_gbps must be greater than 0"),
        ("intra_node.bandwidth_gbps=-5", "intra_node.bandwidth_gbps must be greater than 0"),
        ("gpu.memory_gib=lots", "'gpu.memory_gib' must be a number (GiB)"),
        ("nodes=1.5", "'nodes' must be a whole number"),
        ("no_equals_sign", "needs the form key=value"),
        ("efficiency.elementwise_fusion=1.5", "efficiency.elementwise_fusion must be in [0, 1]"),
        ("efficiency.single_nic_network=0", "efficiency.single_nic_network must be in (0, 1]"),
    ],
)
def test_bad_override_one_line(override, expected):
    with pytest.raises(HardwareProfileError) as err:
        load_cluster("a100x8", overrides=[override])
    assert expected in _one_line(err)


def test_missing_file_and_unknown_name():
    with pytest.raises(HardwareProfileError) as err:
        load_cluster("/nonexistent/dir/hw.toml")
    assert "does not exist" in _one_line(err)
    with pytest.raises(HardwareProfileError) as err:
        load_cluster("h900x8")
    assert "unknown hardware profile 'h900x8'" in _one_line(err)


# Regressions found by tests/fuzz/test_hw_toml_fuzz.py and test_plan_json_fuzz.py (an
# OverflowError or ValueError traceback, or NaN accepted as a latency, before the fix).
@pytest.mark.parametrize("value", ["1" * 5000, "nan", "inf", "-inf", "1e16", "9" * 30, "1e-300", "-1e-10"])
def test_a_number_no_profile_can_use(tmp_path, value):
    path = tmp_path / "bad.toml"
    path.write_text(_profile_text(**{"latency_us = 6.0": f"latency_us = {value}"}))
    with pytest.raises(HardwareProfileError) as err:
        load_cluster(str(path))
    assert ("over 4300 digits" if len(value) > 1000 else "'inter_node.latency_us' must be a finite number") \
        in _one_line(err)


@pytest.mark.parametrize("value", [10**400, float("nan"), 1e300, 1e-300])
def test_an_override_no_profile_can_use(value):
    # 1e-300 GB/s (with 1e-300 efficiencies) underflowed to a ZeroDivisionError in the perf model
    with pytest.raises(HardwareProfileError) as err:
        load_cluster("a100x8", overrides={"inter_node.bandwidth_gbps": value})
    assert "must be a finite number of at most 1e+15 in size, and at least 1e-09 unless 0 (GB/s)" in _one_line(err)
    assert len(_one_line(err)) < 300
    assert load_cluster("a100x8", overrides={"inter_node.latency_us": 0}).inter_node.latency_us == 0


@pytest.mark.parametrize("name, near", [("H100x8", "h100x8"), ("a100_x8", "a100x8"), ("GB200NVL72", "gb200nvl72")])
def test_a_profile_name_off_by_case_or_a_typo_names_the_bundled_one(name, near):
    with pytest.raises(HardwareProfileError) as err:
        load_cluster(name)
    assert f"unknown hardware profile {name!r} (did you mean {near!r}?); use one of" in _one_line(err)


def test_a_one_gpu_node_without_intra_node_says_why_the_table_is_asked(tmp_path):
    text = (PROFILE_DIR / "a100x8.toml").read_text().replace("gpus_per_node = 8", "gpus_per_node = 1")
    start = text.index("[intra_node]")
    path = tmp_path / "one.toml"
    path.write_text(text[:start] + text[text.index("[", start + 1):])
    with pytest.raises(HardwareProfileError) as err:
        load_cluster(str(path))
    assert "missing key 'intra_node'; add it (with one GPU per node it is only used if --hw-set " \
           "gpus_per_node raises that)" in _one_line(err)


def test_a_misspelled_override_key_names_the_key_meant():
    for overrides in (["inter_node.bandwith_gbps=50"], {"gpu.memory_gb": 80}):
        with pytest.raises(HardwareProfileError) as err:
            load_cluster("a100x8", overrides=overrides)
        line = _one_line(err)
        assert "did you mean 'inter_node.bandwidth_gbps'?" in line or "did you mean 'gpu.memory_gib'?" in line
        assert "valid keys" not in line and len(line) < 200
    with pytest.raises(HardwareProfileError) as err:  # nothing near: every key, to pick from
        load_cluster("a100x8", overrides=["zzz=1"])
    assert "valid keys: name, description, nodes, gpus_per_node" in _one_line(err)


def test_nvlink_domain_holds_whole_nodes():
    with pytest.raises(HardwareProfileError, match="multiple of gpus_per_node"):
        load_cluster("gb200nvl72", overrides=["nvlink_domain_gpus=70"])
    assert load_cluster("h100x8", overrides=["nvlink_domain_gpus=16"]).fast_domain_gpus == 16
