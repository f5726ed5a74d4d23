"""One import name: the five folders install as smplan.*, and nothing else lands in site-packages."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

FOLDERS = {"smplan": "smplan", "smplan.planner": "planner", "smplan.simulator": "simulator",
           "smplan.executor": "executor", "smplan.hwprofiles": "hwprofiles"}


def _python(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", ["planner", "simulator", "executor", "hwprofiles"])
def test_bare_names_do_not_import_outside_the_checkout(tmp_path, name):
    out = _python(f"import {name}", tmp_path)
    assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr


def test_smplan_subpackages_import_outside_the_checkout(tmp_path):
    out = _python("import smplan.planner, smplan.simulator, smplan.executor, smplan.hwprofiles; "
                  "from smplan.hwprofiles import bundled_profiles; print(len(bundled_profiles()))", tmp_path)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 1  # the bundled TOML files are package data


def test_every_package_folder_is_installed():
    """A new subpackage folder must be listed in pyproject.toml, or it is missing after `pip install .`."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == FOLDERS
    listed = set(config["packages"])
    for name, folder in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            dotted = ".".join((name, *rel.parts)) if rel.parts else name
            assert dotted in listed, f"{dotted} ({init.parent}) is not in pyproject.toml [tool.setuptools] packages"
