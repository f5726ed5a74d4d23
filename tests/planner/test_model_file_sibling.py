"""A model file imports a module beside it (`from lm import LM` next to lm.py), as `python
file.py` would; the folder leaves sys.path afterwards, its modules leave sys.modules, and a
file beside it named like an installed package does not replace that package."""

from __future__ import annotations

import subprocess
import sys

from smplan.planner import load_model_file, profile_model

from tests.conftest import EXAMPLES, ROOT

SIBLING = "sibling_mlp_smplan_test"
# A valid model file that needs the real torch (nn, a Linear) when imported.
USES_TORCH = "import torch\nfrom torch import nn\n\n\ndef model():\n    return nn.Linear(4, 4)\n"


def test_a_model_file_imports_its_neighbour(tmp_path, monkeypatch):
    (tmp_path / f"{SIBLING}.py").write_text((EXAMPLES / "mlp.py").read_text())
    (tmp_path / "uses_it.py").write_text(f"from {SIBLING} import model, batch  # noqa: F401\n")
    monkeypatch.chdir(EXAMPLES)  # not the file's folder: the import must not depend on the cwd
    before = list(sys.path)
    loaded = load_model_file(str(tmp_path / "uses_it.py"))
    assert loaded.module.model.__module__ == SIBLING
    assert sys.path == before  # the folder was on sys.path while the file ran, not after
    assert SIBLING not in sys.modules  # nor is its neighbour left to stand in for another folder's
    assert profile_model(str(tmp_path / "uses_it.py")).num_blocks > 0  # the profiler loads it the same way


def test_each_folder_gets_its_own_neighbour(tmp_path):
    widths = {}
    for folder, width in (("a", 16), ("b", 64)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "lm.py").write_text(f"WIDTH = {width}\n")
        (tmp_path / folder / "m.py").write_text("from torch import nn\nfrom lm import WIDTH\n\n\n"
                                                "def model():\n    return nn.Linear(WIDTH, WIDTH)\n")
    for folder in ("a", "b"):
        widths[folder] = load_model_file(str(tmp_path / folder / "m.py")).build().in_features
    assert widths == {"a": 16, "b": 64}
    assert "lm" not in sys.modules


def test_a_torch_py_neither_beside_nor_as_the_model_replaces_torch(tmp_path):
    """A fresh process, as the CLI is: torch is not imported before the model file."""
    (tmp_path / "torch.py").write_text(USES_TORCH)
    (tmp_path / "numpy.py").write_text("raise ImportError('the sibling numpy.py was imported')\n")
    (tmp_path / "m.py").write_text("import numpy  # noqa: F401\n" + USES_TORCH)
    code = ("import sys\nfrom smplan.planner import load_model_file\n"
            f"for name in ('m.py', 'torch.py'):\n"
            f"    print(load_model_file({str(tmp_path)!r} + '/' + name).build().in_features)\n"
            "print(sys.modules['torch'].__file__)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split()
    assert lines[:2] == ["4", "4"] and str(tmp_path) not in lines[2]


def test_an_installed_package_under_the_folder_stays_loaded(tmp_path, monkeypatch):
    """A project whose .venv lies beside the model file: its packages are not the model's siblings."""
    site = tmp_path / ".venv" / "site-packages"
    (site / "pkgx_smplan_test").mkdir(parents=True)
    (site / "pkgx_smplan_test" / "__init__.py").write_text("VALUE = 3\n")
    monkeypatch.syspath_prepend(str(site))
    (tmp_path / "m.py").write_text("from torch import nn\nimport pkgx_smplan_test\n\n\n"
                                   "def model():\n    return nn.Linear(pkgx_smplan_test.VALUE, 1)\n")
    try:
        assert load_model_file(str(tmp_path / "m.py")).build().in_features == 3
        assert "pkgx_smplan_test" in sys.modules
    finally:
        sys.modules.pop("pkgx_smplan_test", None)


def test_a_sibling_hidden_by_an_installed_module_is_one_line(tmp_path):
    """The folder comes after the installed modules: a `wave.py` beside the model loses to the
    standard library's, and the user hears so instead of a puzzling error later."""
    import pytest
    from smplan.planner import ModelFileError

    if "wave" in sys.modules:
        pytest.skip("the standard library's wave is already imported here")
    (tmp_path / "wave.py").write_text("SIBLING = True\n")
    (tmp_path / "m.py").write_text("import wave  # noqa: F401\nfrom torch import nn\n\n\n"
                                   "def model():\n    return nn.Linear(2, 2)\n")
    try:
        with pytest.raises(ModelFileError, match=r"`import wave` found the installed wave, not wave.py beside"):
            load_model_file(str(tmp_path / "m.py"))
    finally:
        sys.modules.pop("wave", None)


def test_a_model_file_that_takes_its_folder_off_sys_path_still_loads(tmp_path):
    (tmp_path / "m.py").write_text("import sys\nsys.path.pop()\nfrom torch import nn\n\n\n"
                                   "def model():\n    return nn.Linear(2, 2)\n")
    before = list(sys.path)
    assert load_model_file(str(tmp_path / "m.py")).build().in_features == 2
    assert sys.path == before[:-1] or sys.path == before


def test_a_failed_import_of_a_hidden_sibling_names_it(tmp_path):
    """`from wave import WIDTH` with a wave.py beside the model: the installed module has no WIDTH,
    and the error says why, not only that the import failed."""
    import pytest
    from smplan.planner import ModelFileError

    (tmp_path / "wave.py").write_text("WIDTH = 4\n")
    (tmp_path / "m.py").write_text("from wave import WIDTH\nfrom torch import nn\n\n\n"
                                   "def model():\n    return nn.Linear(WIDTH, 2)\n")
    with pytest.raises(ModelFileError, match=r"`import wave` found the installed wave, not wave.py beside"):
        load_model_file(str(tmp_path / "m.py"))


def test_a_hidden_sibling_through_the_cli_is_one_line_exit_2(tmp_path):
    from click.testing import CliRunner

    from smplan.cli.main import cli

    (tmp_path / "wave.py").write_text("WIDTH = 4\n")
    (tmp_path / "m.py").write_text("from wave import WIDTH\nfrom torch import nn\n\n\n"
                                   "def model():\n    return nn.Linear(WIDTH, 2)\n")
    result = CliRunner().invoke(cli, ["profile", str(tmp_path / "m.py"), "--no-cache"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "found the installed wave, not wave.py beside" in errors[0]
    assert (tmp_path / "wave.py").read_text() == "WIDTH = 4\n"  # nothing of the user's touched
