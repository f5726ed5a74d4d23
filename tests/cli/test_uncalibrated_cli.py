"""A profile never calibrated (no [efficiency] table, not bundled) is planned on with a warning."""

from smplan.hwprofiles.loader import PROFILE_DIR

from smplan.cli.main import cli

TINY = "examples/gpt.py:tiny"


def _copy(tmp_path, extra: str = "\n# my cluster: bandwidths measured here\n"):
    path = tmp_path / "mine.toml"
    path.write_text((PROFILE_DIR / "a100x8.toml").read_text() + extra)
    return str(path)


def test_plan_on_an_uncalibrated_profile_warns_on_stderr(cli_runner, tmp_path):
    hw = _copy(tmp_path)
    result = cli_runner.invoke(cli, ["plan", TINY, "--hw", hw, "--top", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert "has never been calibrated" in result.stderr and "smplan calibrate" in result.stderr
    assert "calibrated" not in result.stdout  # the JSON stays parseable


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
