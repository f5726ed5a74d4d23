"""A profile never calibrated (no [efficiency] table, not bundled) is planned on with a warning."""

import json

from smplan.hwprofiles.loader import PROFILE_DIR

from smplan.cli.main import cli

TINY = "examples/gpt.py:tiny"


def _copy(tmp_path, extra: str = "\n# my cluster: bandwidths measured here\n"):
    """a100x8 with a GPU of one's own: smplan cannot tell what it is."""
    path = tmp_path / "mine.toml"
    text = (PROFILE_DIR / "a100x8.toml").read_text()
    assert 'name = "A100-SXM4-80GB"' in text
    path.write_text(text.replace('name = "A100-SXM4-80GB"', 'name = "my accelerator"') + extra)
    return str(path)


def test_plan_on_an_uncalibrated_profile_warns_on_stderr(cli_runner, tmp_path):
    hw = _copy(tmp_path)
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", hw, "--top", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert "has never been calibrated" in result.stderr and "smplan calibrate" in result.stderr
    json.loads(result.stdout)  # the JSON stays parseable (the warning is in its notes)


def test_simulate_of_a_plan_file_on_an_uncalibrated_profile_warns(cli_runner, tmp_path):
    hw = _copy(tmp_path)
    plan = tmp_path / "p.json"
    assert cli_runner.invoke(cli, ["plan", TINY, "--hw", hw, "-o", str(plan)]).exit_code == 0
    result = cli_runner.invoke(cli, ["simulate", str(plan)])
    assert result.exit_code == 0 and "has never been calibrated" in result.stderr


def test_calibrated_and_bundled_profiles_do_not_warn(cli_runner, tmp_path):
    hw = _copy(tmp_path, "\n[efficiency]\nmatmul_max = 0.8\n")
    verbatim = tmp_path / "copy.toml"
    verbatim.write_bytes((PROFILE_DIR / "a100x8.toml").read_bytes())  # byte for byte: predicts as a100x8 does
    for target in (hw, "a100x8", str(verbatim)):
        result = cli_runner.invoke(cli, ["plan", TINY, "--hw", target, "--top", "1"])
        assert result.exit_code == 0, result.output
        assert "calibrated" not in result.stderr


def test_a_copy_with_a_checked_gpu_and_its_own_network_does_not_warn(cli_runner, tmp_path):
    # the factors belong to the GPU (and the stack); a NIC measured here is an input the file states
    text = (PROFILE_DIR / "a100x8.toml").read_text()
    mine = tmp_path / "nic.toml"
    mine.write_text(text.replace("bandwidth_gbps = 25.0", "bandwidth_gbps = 50.0", 1))
    assert mine.read_text() != text
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", str(mine), "--top", "1"])
    assert result.exit_code == 0 and "calibrated" not in result.stderr, result.output
    faster = mine.read_text().replace("bf16 = 312.0", "bf16 = 400.0", 1)  # another GPU than the A100 checked
    assert faster != mine.read_text()
    mine.write_text(faster)
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", str(mine), "--top", "1"])
    assert result.exit_code == 0 and "has never been calibrated" in result.stderr, result.output


def test_json_notes_carry_the_profile_warnings(cli_runner, tmp_path):
    """A script reading --json sees the warnings stderr printed: plan, simulate, reliability and
    whatif put them in their object's "notes"."""
    hw = _copy(tmp_path)
    plan = tmp_path / "p.json"
    assert cli_runner.invoke(cli, ["plan", TINY, "--hw", hw, "-o", str(plan)]).exit_code == 0
    runs = {
        "plan": ["plan", TINY, "--hw", hw, "--top", "1", "--json"],
        "simulate": ["simulate", str(plan), "--json"],
        "reliability": ["reliability", str(plan), "--days", "1", "--seeds", "2", "--json"],
        "whatif": ["whatif", TINY, "--hw", hw, "--jobs", "1", "--seeds", "2", "--vary", "nodes=1,2",
                   "-o", str(tmp_path / "w"), "--json"],
    }
    for verb, args in runs.items():
        # a fresh profile cache: "profiling ..." is progress on stderr, not a note
        result = cli_runner.invoke(cli, args, env={"SMPLAN_CACHE_DIR": str(tmp_path / f"cache-{verb}")})
        assert result.exit_code == 0, (verb, result.output)
        notes = json.loads(result.stdout)["notes"]
        warned = [line for line in result.stderr.splitlines() if "has never been calibrated" in line]
        assert warned and set(warned) <= set(notes), (verb, notes)
        assert not any(n.startswith("profiling") for n in notes), (verb, notes)
