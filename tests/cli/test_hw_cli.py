import json

import pytest
from smplan.hwprofiles.loader import PROFILE_DIR

from smplan.cli.main import cli


def test_hw_list(cli_runner):
    result = cli_runner.invoke(cli, ["hw", "list"])
    assert result.exit_code == 0, result.output
    assert "a100x8" in result.output


def test_unknown_profile_is_one_line_exit_2(cli_runner):
    result = cli_runner.invoke(cli, ["hw", "show", "nope"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown hardware profile" in lines[0]
    assert "Traceback" not in result.output


def test_a_name_off_by_case_names_the_bundled_profile_and_stack(cli_runner):
    for args, line in ((["hw", "show", "H100x8"], "unknown hardware profile 'H100x8' (did you mean 'h100x8'?)"),
                       (["stack", "show", "TorchTitan"], "unknown stack 'TorchTitan' (did you mean 'torchtitan'?)"),
                       (["hw", "show", "a100x8", "--hw-set", "inter_node.bandwith_gbps=50"],
                        "did you mean 'inter_node.bandwidth_gbps'?"),
                       # a path's typo (.tml): not only "unknown profile" (a new user's review)
                       (["hw", "show", "cpu.tml"], "unknown hardware profile 'cpu.tml' (no such file here either)")):
        result = cli_runner.invoke(cli, args)
        lines = [text for text in result.output.splitlines() if text.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and line in lines[0], (args, result.output)


def test_bad_hw_set_exit_2(cli_runner):
    for bad in ["foo.bar=1", "inter_node.bandwidth_gbps=0", "gpu.memory_gib=lots"]:
        result = cli_runner.invoke(cli, ["hw", "show", "a100x8", "--hw-set", bad])
        assert result.exit_code == 2, (bad, result.output)
        assert "Traceback" not in result.output


def test_version(cli_runner):
    result = cli_runner.invoke(cli, ["--version"])
    assert result.exit_code == 0 and "0.1.0" in result.output


# ---- hardware files and overrides through the CLI: one line, exit 2, no traceback ----


def _assert_one_line_error(result, expected):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert expected in lines[0], lines[0]


def test_hw_list_shows_every_bundled_profile(cli_runner):
    result = cli_runner.invoke(cli, ["hw", "list"])
    assert result.exit_code == 0, result.output
    for name in ("v100x8", "a100-40gx8", "h100x8", "h200x8", "b200x8", "mi300xx8", "l40sx8"):
        assert name in result.output


def test_hw_show_user_toml_with_nodes_and_hw_set(cli_runner, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(
        (PROFILE_DIR / "h100x8.toml").read_text().replace('name = "h100x8"', 'name = "mine"')
    )
    result = cli_runner.invoke(
        cli,
        [
            "hw",
            "show",
            str(path),
            "--nodes",
            "4",
            "--hw-set",
            "inter_node.bandwidth_gbps=25",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["name"] == "mine" and data["nodes"] == 4 and data["num_gpus"] == 32 and data["notes"] == []
    assert data["inter_node"]["bandwidth_gbps"] == 25.0
    # a name and a different --hw are two profiles: refused rather than one silently winning
    result = cli_runner.invoke(cli, ["hw", "show", "a100x8", "--hw", str(path), "--json"])
    assert result.exit_code == 2 and "two profiles" in result.output


def _bad_file(tmp_path, old, new):
    text = (PROFILE_DIR / "a100x8.toml").read_text()
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new))
    return str(path)


@pytest.mark.parametrize(
    "old,new,expected",
    [
        ("memory_bandwidth_gbps = 2039.0", "", "missing key 'gpu.memory_bandwidth_gbps'; add it, as `smplan hw show"),
        ("bf16 = 312.0", "", "missing key 'gpu.peak_tflops.bf16'; add it (0.0 for a GPU without that dtype)"),
        (
            "bandwidth_gbps = 25.0",
            "bandwidth_gbps = 0.0",
            "inter_node.bandwidth_gbps must be greater than 0",
        ),
        (
            "bandwidth_gbps = 300.0",
            "bandwidth_gbps = -300.0",
            "intra_node.bandwidth_gbps must be greater than 0",
        ),
        ("memory_gib = 80.0", 'memory_gib = "80"', "'gpu.memory_gib' must be a number"),
        ("[cost]", "[cost", "is not valid TOML"),
    ],
)
def test_broken_hardware_file_one_line_exit_2(cli_runner, tmp_path, old, new, expected):
    result = cli_runner.invoke(cli, ["hw", "show", _bad_file(tmp_path, old, new)])
    _assert_one_line_error(result, expected)


def test_missing_hardware_file_one_line_exit_2(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["hw", "show", str(tmp_path / "absent.toml")])
    _assert_one_line_error(result, "does not exist")


@pytest.mark.parametrize(
    "override,expected",
    [
        ("foo.bar=1", "unknown hardware key 'foo.bar'"),
        ("inter_node.bandwidth_gbps=0", "inter_node.bandwidth_gbps must be greater than 0"),
        ("intra_node.bandwidth_gbps=-1", "intra_node.bandwidth_gbps must be greater than 0"),
        ("gpu.memory_gib=lots", "'gpu.memory_gib' must be a number (GiB)"),
        ("nodes", "needs the form key=value"),
    ],
)
def test_bad_hw_set_one_line(cli_runner, override, expected):
    result = cli_runner.invoke(cli, ["hw", "show", "a100x8", "--hw-set", override])
    _assert_one_line_error(result, expected)


def test_bad_nodes_is_a_usage_error(cli_runner):
    result = cli_runner.invoke(cli, ["hw", "show", "a100x8", "--nodes", "0"])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_hw_show_takes_the_profile_as_argument_or_hw(cli_runner):
    by_hw = cli_runner.invoke(cli, ["hw", "show", "--hw", "b300x8"])
    assert by_hw.exit_code == 0 and by_hw.output == cli_runner.invoke(cli, ["hw", "show", "b300x8"]).output
    # a 0 that is not a value says what it means
    assert "sm_count = 0 (not stated)" in by_hw.output and "gemm_tile = 0 (off)" in by_hw.output
    none = cli_runner.invoke(cli, ["hw", "show"])
    assert none.exit_code == 2 and "smplan hw list" in none.output


def test_hw_show_says_which_figures_are_a100s(cli_runner):
    """A profile without [gpu.attention] or a bf16 matmul ceiling runs on A100's: show says so."""
    l40s = cli_runner.invoke(cli, ["hw", "show", "l40sx8"]).output
    for key in ("attention.flash2 = 0.63", "attention.cudnn = 0.63", "matmul_ceiling.bf16 = 0.869"):
        assert f"{key} (not in this profile: A100's measured figure)" in l40s, key
    h100 = cli_runner.invoke(cli, ["hw", "show", "h100x8"]).output
    assert "attention.cudnn = 0.54\n" in h100 and "A100's measured figure" not in h100
    assert "A100's measured figure" not in cli_runner.invoke(cli, ["hw", "show", "a100x8"]).output
    given = cli_runner.invoke(cli, ["hw", "show", "l40sx8", "--hw-set", "gpu.attention.cudnn=0.5"]).output
    assert "attention.cudnn = 0.5\n" in given


def test_hw_show_says_tp_comm_overlap_is_unused_on_pcie(cli_runner):
    """TE's userbuffers need NVLink (planner.pass_model._userbuffers_reach): on a PCIe node the
    stack's tp_comm_overlap is shown but marked unused, so nobody reads it as hiding TP comm."""
    l40s = cli_runner.invoke(cli, ["hw", "show", "l40sx8"]).output
    assert "tp_comm_overlap = 1.0 (unused here: TE's userbuffers need NVLink, not PCIe)" in l40s
    h100 = cli_runner.invoke(cli, ["hw", "show", "h100x8"]).output
    assert "tp_comm_overlap = 1.0\n" in h100
