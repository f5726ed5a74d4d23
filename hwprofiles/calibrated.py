"""Whether a hardware profile's efficiency factors were ever fitted or checked on its GPU.

A profile from `smplan hw probe`, or one written by hand, has no `[efficiency]` table until
`smplan calibrate` writes one, so it runs on the defaults fitted on A100 clusters: a probed
CPU profile predicted 5.9x too fast that way (issue 14). Such a profile gets a warning.

Bundled profiles have no `[efficiency]` table either. Those whose GPU has published runs
among the validation sources were checked against them (README, "How accurate it is"); the
others (V100, H200, MI300X, L40S) were not, and are exactly as uncalibrated as a user's copy
of them, so they get the same warning (review finding 8: a renamed copy of mi300xx8 warned,
mi300xx8 itself did not, with identical predictions). A user's file with no table is checked
when its [gpu] table is a checked profile's, key for key: the factors are the GPU's (and the
stack's), while its network and node are inputs it states (a copy of a100x8 with its NIC
bandwidth measured used to warn "fitted on A100 clusters", a new-user review's finding); any
other GPU table warns, as smplan cannot tell what GPU it describes.
"""

from __future__ import annotations

import functools
from pathlib import Path

from .loader import PROFILE_DIR, read_profile
from .paths import is_path

# Bundled profiles whose GPU has runs in the validation sources (README, "How accurate it is":
# A100 40/80 GB in vTrain, Megatron-LM SC21 and LLM Foundry; H100 in NeMo, torchtitan and
# Megatron-Bridge; B200, B300, GB200 and GB300 in Megatron-Bridge).
CHECKED_ON_THEIR_GPU = ("a100x8", "a100-40gx8", "h100x8", "b200x8", "b300x8", "gb200nvl72", "gb300nvl72")


def checked_on_its_gpu(name_or_path: str) -> bool:
    """Whether the profile's efficiency factors were fitted (its own [efficiency] table) or checked
    (a bundled profile in CHECKED_ON_THEIR_GPU, or a file with the [gpu] table of one) on its GPU."""
    data = read_profile(name_or_path)
    if "efficiency" in data:
        return True
    path = Path(name_or_path)
    if not is_path(name_or_path):
        return name_or_path in CHECKED_ON_THEIR_GPU
    if path.resolve().parent == PROFILE_DIR.resolve():
        return path.stem in CHECKED_ON_THEIR_GPU
    return data.get("gpu") in _checked_gpu_tables()


def uncalibrated_warning(name_or_path: str) -> str | None:
    """A one-line warning for a profile that was never calibrated on its GPU, else None."""
    if checked_on_its_gpu(name_or_path):
        return None
    return (f"warning: {name_or_path} has never been calibrated (no [efficiency] table, no published run on its "
            "GPU among smplan's validation sources), so predictions "
            f"use factors fitted on A100 clusters and may be far off; run `smplan calibrate MODEL --hw {name_or_path} "
            "-o calibrated.toml` on that hardware first")


@functools.cache
def _checked_gpu_tables() -> list[dict]:
    """The [gpu] tables of the bundled profiles in CHECKED_ON_THEIR_GPU."""
    return [read_profile(name)["gpu"] for name in CHECKED_ON_THEIR_GPU]
