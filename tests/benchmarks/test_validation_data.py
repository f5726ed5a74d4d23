"""benchmarks/validation_data.py: one setting finds the published runs; a missing folder is one line, exit 2."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from validation_data import ENV_VAR, ValidationDirError, resolve_validation_dir, validation_file  # noqa: E402


def test_option_beats_variable_beats_default(tmp_path, monkeypatch):
    opt, env = tmp_path / "opt", tmp_path / "env"
    opt.mkdir()
    env.mkdir()
    monkeypatch.setenv(ENV_VAR, str(env))
    assert resolve_validation_dir(str(opt)) == opt
    assert resolve_validation_dir(None) == env


@pytest.mark.parametrize("use_env", [False, True])
def test_missing_folder_names_the_setting(tmp_path, monkeypatch, use_env):
    missing = tmp_path / "nowhere"
    if use_env:
        monkeypatch.setenv(ENV_VAR, str(missing))
    with pytest.raises(ValidationDirError, match=f"{ENV_VAR}=DIR") as err:
        resolve_validation_dir(None if use_env else str(missing))
    assert str(missing) in str(err.value)


def test_missing_file_names_file_and_folder(tmp_path):
    with pytest.raises(ValidationDirError, match="has no megatron_sc21_table1.csv"):
        validation_file(tmp_path, "megatron_sc21_table1.csv")


@pytest.mark.parametrize("script", ["validate_published.py", "plan_vs_vtrain.py"])
def test_benchmarks_say_what_to_set(tmp_path, script):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--validation-dir", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and ENV_VAR in out.stderr
