"""Find, read and override hardware profiles (bundled names or a user's TOML path)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .cluster import AttentionKernels, Cluster, HardwareProfileError, from_dict
from .paths import did_you_mean, looks_like_folder, read_toml, same_toml, toml_path
from .stack import STACK_KEYS, STACK_ONLY_KEYS, apply_stack

PROFILE_DIR = Path(__file__).parent / "profiles"


def bundled_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def same_profile(a: str, b: str) -> bool:
    """Whether two --hw values name one hardware file (a bundled name, a path to it)."""
    return same_toml(a, b, PROFILE_DIR)


def read_profile(name_or_path: str) -> dict:
    """Parsed TOML of a bundled profile name (`a100x8`) or of a path to a .toml file."""
    path = toml_path(name_or_path, PROFILE_DIR)
    if path is None and looks_like_folder(name_or_path):
        raise HardwareProfileError(f"hardware file {name_or_path!r} is a folder; give the .toml file in it")
    if path is None:
        missing = " (no such file here either)" if Path(name_or_path).suffix else ""  # `cpu.tml`: a path meant
        raise HardwareProfileError(
            f"unknown hardware profile {name_or_path!r}{missing}{did_you_mean(name_or_path, bundled_profiles())}; use one of "
            f"{', '.join(bundled_profiles())} or a path to a .toml file (smplan hw list)"
        )
    if path.is_dir():
        raise HardwareProfileError(f"hardware file {str(path)!r} is a folder; give the .toml file")
    if not path.is_file():
        raise HardwareProfileError(f"hardware file {str(path)!r} does not exist; check the path or give another "
                                   "--hw NAME|PATH")
    data = read_toml(path, "hardware file", HardwareProfileError)
    if "gpu" not in data and set(data) & STACK_ONLY_KEYS:
        raise HardwareProfileError(f"{str(path)!r} looks like a stack file (it has {sorted(set(data) & STACK_ONLY_KEYS)[0]!r} "
                                   "and no [gpu]); pass it with --stack, and a hardware profile with --hw")
    return data


# Keys a profile may leave out and then takes A100's measured figures for (every field of
# cluster.AttentionKernels, and MatmulCeiling.bf16): `hw show` says so, since they are no
# measurement of that GPU.
A100_FIGURE_KEYS = tuple(f"attention.{f.name}" for f in dataclasses.fields(AttentionKernels)) + ("matmul_ceiling.bf16",)


def a100_figures_taken(name_or_path: str) -> list[str]:
    """The gpu.* keys of A100_FIGURE_KEYS that the profile file does not state (A100's are used)."""
    gpu = read_profile(name_or_path).get("gpu") or {}
    missing = []
    for key in A100_FIGURE_KEYS:
        table, leaf = key.split(".")
        if leaf not in (gpu.get(table) or {}):
            missing.append(f"gpu.{key}")
    return missing


def override_rule(err: HardwareProfileError) -> str:
    """The rule an override broke, without the loader's framing ("--hw-set:", "hardware profile:",
    its "fix the profile or --hw-set"), for a caller that names where the override came from."""
    text = str(err).removeprefix("--hw-set: ").split("hardware profile: ")[-1]
    return text.replace(" in --hw-set", "").split("; fix the profile or --hw-set")[0]


def parse_override(text: str) -> tuple[str, object]:
    """`key=value` -> (key, value), the value as int, float or str."""
    if "=" not in text:
        raise HardwareProfileError(f"--hw-set {text!r} needs the form key=value, e.g. inter_node.bandwidth_gbps=50")
    key, raw = (part.strip() for part in text.split("=", 1))
    return key, parse_scalar(raw)


def parse_scalar(raw: str) -> object:
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def load_cluster(
    name_or_path: str,
    nodes: int | None = None,
    overrides: dict[str, object] | list[str] | tuple[str, ...] | None = None,
    stack: str | None = None,
) -> Cluster:
    """The Cluster for a profile under a software stack, with `nodes` and dotted overrides applied.

    `overrides` is a dict, or a list of `key=value` strings as given to `--hw-set`; they win
    over the stack (`stack` None: the default, megatron-core; precedence in hwprofiles/stack.py).
    """
    data = read_profile(name_or_path)
    cluster = from_dict(data, source=f"hardware profile {name_or_path!r}")
    stated = data.get("efficiency", {})  # a table, or from_dict would have refused it
    cluster = apply_stack(cluster, stack, [k for k in STACK_KEYS if k in stated])
    changes: dict[str, object] = {}
    if overrides:
        items = overrides.items() if isinstance(overrides, dict) else map(parse_override, overrides)
        for key, value in items:
            cluster.get(key)  # raises a clear error for an unknown key
            changes[key] = value
    if nodes is not None:
        changes["nodes"] = nodes
    if changes:
        try:
            cluster = cluster.with_overrides(changes)
        except HardwareProfileError as err:
            raise HardwareProfileError(f"--hw-set: {err}") from None
    return cluster
