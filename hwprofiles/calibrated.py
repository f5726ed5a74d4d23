"""Whether a hardware profile's efficiency factors were ever fitted to this hardware.

Bundled profiles carry factors fitted on published runs (DESIGN.md, "Accuracy"). A
profile from `smplan hw probe`, or one written by hand, has no `[efficiency]` table until
`smplan calibrate` writes one, so it runs on the defaults fitted on A100 clusters: a probed
CPU profile predicted 5.9x too fast that way (issue 14). Such a profile gets a warning.
"""

from __future__ import annotations

from pathlib import Path

from .loader import PROFILE_DIR, read_profile
from .paths import is_path


def uncalibrated_warning(name_or_path: str) -> str | None:
    """A one-line warning for a profile that was never calibrated, else None."""
    data = read_profile(name_or_path)
    path = Path(name_or_path)
    bundled = not is_path(name_or_path) or path.resolve().parent == PROFILE_DIR.resolve()
    if bundled or "efficiency" in data or _copy_of_bundled(path):
        return None
    return (f"warning: {name_or_path} has never been calibrated (no [efficiency] table), so predictions use "
            f"factors fitted on A100 clusters and may be far off; run `smplan calibrate MODEL --hw {name_or_path} "
            "-o calibrated.toml` first")


def _copy_of_bundled(path: Path) -> bool:
    """Whether `path` holds a bundled profile byte for byte (a user's copy predicts as it does)."""
    try:
        text = path.read_bytes()
    except OSError:
        return False
    return any(text == bundled.read_bytes() for bundled in PROFILE_DIR.glob("*.toml"))
