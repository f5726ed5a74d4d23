"""CHECKED_ON_THEIR_GPU names exactly the bundled profiles whose GPU has runs in the validation
CSVs (their `gpu` column), so a new source's GPU (an H200 row) cannot be left warning as
uncalibrated. The data is never in the repository: the test reads the folder the benchmarks
read ($SMPLAN_VALIDATION_DIR, else shared/validation beside the checkout) and skips without it."""

from __future__ import annotations

import csv
import sys

import pytest
from smplan.hwprofiles.calibrated import CHECKED_ON_THEIR_GPU
from smplan.hwprofiles.loader import PROFILE_DIR

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from validation_data import ValidationDirError, resolve_validation_dir  # noqa: E402

# The `gpu` values' first words as the CSVs write them ("A100 40GB", "H100 (DGX-H100)",
# "GB200 (DGX-GB200 NVL72)") -> the bundled profile of that GPU (hwprofiles/profiles/*.toml).
PROFILE_OF_GPU = {
    ("A100", "40GB"): "a100-40gx8",
    ("A100", "80GB"): "a100x8",
    ("H100",): "h100x8",
    ("H200",): "h200x8",
    ("B200",): "b200x8",
    ("B300",): "b300x8",
    ("GB200",): "gb200nvl72",
    ("GB300",): "gb300nvl72",
    ("MI300X",): "mi300xx8",
    ("L40S",): "l40sx8",
    ("V100",): "v100x8",
}


def profile_of(gpu: str) -> str:
    words = tuple(gpu.split())
    found = [p for key, p in PROFILE_OF_GPU.items() if words[:len(key)] == key]
    assert found, f"validation gpu {gpu!r} maps to no bundled profile: add it to PROFILE_OF_GPU"
    return found[0]


def test_the_checked_profiles_are_the_validation_gpus():
    try:
        folder = resolve_validation_dir()
    except ValidationDirError:
        pytest.skip("no folder of published runs here")
    gpus = set()
    for path in sorted(folder.glob("*.csv")):
        with path.open(newline="") as f:
            gpus |= {row["gpu"] for row in csv.DictReader(f) if row.get("gpu")}
    assert gpus, f"{folder} has no CSV with a gpu column"
    assert all((PROFILE_DIR / f"{p}.toml").is_file() for p in PROFILE_OF_GPU.values())
    assert {profile_of(g) for g in gpus} == set(CHECKED_ON_THEIR_GPU)
