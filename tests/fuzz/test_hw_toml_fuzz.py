"""Fuzz `smplan hw show PATH`: the bundled a100x8 profile with keys dropped, unknown keys and
tables added, values of the wrong type (text, booleans, NaN, infinities, huge or negative
numbers, arrays, tables, dates), and raw-text damage (truncation, duplicate keys, junk,
bad bytes); and near-valid numbers run through `smplan simulate` and `reliability`. Every
file must end in exit 0 or exit 2 with one `error: ` line, never a traceback."""

from __future__ import annotations

import copy
import datetime
import json
import math
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from smplan.hwprofiles import settable_keys
from smplan.hwprofiles.loader import PROFILE_DIR

from smplan.cli.main import cli
from tests.conftest import EXAMPLES
from tests.fuzz.checks import assert_clean_exit, mutate

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TINY = f"{EXAMPLES / 'gpt.py'}:tiny"
TEXT = (PROFILE_DIR / "a100x8.toml").read_text()
BASE = tomllib.loads(TEXT)
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

SCALARS = st.one_of(
    st.none(),  # TOML has no null: the writer drops the key
    st.booleans(),
    st.integers(-2, 66),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),  # TOML integers are 64-bit
    st.sampled_from([0, -1, 2**63 - 1, -(2**63), 10**15, 10**15 + 1, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.5, 1e308, 1e-320, float("nan"), float("inf"), float("-inf")]),
    st.text(max_size=12),
    st.sampled_from(["", "a100x8", "\x00", "x" * 300, "line\nbreak"]),
    st.dates(), st.times(), st.datetimes(),
)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
KEYS = st.one_of(st.text(max_size=10), st.sampled_from(
    ["nodes", "gpus_per_node", "gpu", "name", "bf16", "fp8", "latency_us", "bandwidth_gbps", "efficiency",
     "matmul_max", "storage", "checkpoint_write_gbps", "cost", "source", ""]))


def _key(key: str) -> str:
    return key if key and all(c.isalnum() and c.isascii() or c in "_-" for c in key) else json.dumps(key)


def _value(value) -> str:
    """One TOML value (inline form); `None` is never passed (the writer drops those keys)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string takes JSON's escapes (\n, \", \uXXXX)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value if v is not None) + "]"
    return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items() if v is not None) + "}"


def to_toml(data: dict, table: str = "") -> str:
    """A small TOML writer: scalars and arrays as `key = value`, nested dicts as [tables]."""
    lines = [f"[{table}]"] if table else []
    tables = []
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    out = "\n".join(lines) + "\n"
    for key, value in tables:
        out += "\n" + to_toml(value, f"{table}.{_key(key)}" if table else _key(key))
    return out


def _mutate(doc, data):
    return mutate(doc, data, KEYS, VALUES)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("profiles")


def _show(folder, content: str | bytes, *extra: str):
    path = folder / "hw.toml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8", errors="surrogatepass")
    from click.testing import CliRunner

    return CliRunner().invoke(cli, ["hw", "show", str(path), *extra])


def test_writer_round_trips_the_bundled_profile(folder):
    assert tomllib.loads(to_toml(BASE)) == BASE
    result = _show(folder, to_toml(BASE), "--json")
    assert result.exit_code == 0, result.output


@SETTINGS
@given(data=st.data())
def test_mutated_profile_exits_cleanly(folder, data):
    doc = _mutate(copy.deepcopy(BASE), data)
    text = to_toml(doc)
    extra = ["--json"] if data.draw(st.booleans(), label="json") else []
    assert_clean_exit(_show(folder, text, *extra))


RAW_EDITS = st.sampled_from(["truncate", "duplicate", "splice", "number", "bytes", "empty", "table"])


@SETTINGS
@given(data=st.data())
def test_broken_profile_text_exits_cleanly(folder, data):
    edit = data.draw(RAW_EDITS, label="edit")
    at = data.draw(st.integers(0, len(TEXT)), label="at")
    if edit == "truncate":
        content = TEXT[:at]
    elif edit == "duplicate":  # a key or a table given twice
        line = data.draw(st.sampled_from([ln for ln in TEXT.splitlines() if ln.strip()]), label="line")
        content = TEXT.replace(line, line + "\n" + line, 1)
    elif edit == "splice":
        junk = data.draw(st.text(max_size=20), label="junk")
        end = data.draw(st.integers(at, min(len(TEXT), at + 20)), label="end")
        content = TEXT[:at] + junk + TEXT[end:]
    elif edit == "number":  # literals TOML takes (or nearly takes) that no profile can use
        literal = data.draw(st.sampled_from(["1" * 5000, "9" * 30, "1e999", "-1e999", "nan", "+inf", "-0", "0x7f",
                                             "1_000", "1979-05-27", "[1, 2]", "{a = 1}", '"12"', "true"]),
                            label="literal")
        key = data.draw(st.sampled_from(["nodes", "gpus_per_node", "memory_gib", "bf16", "fp8", "latency_us",
                                         "gpu_mtbf_hours", "usd_per_gpu_hour", "checkpoint_write_gbps"]), label="key")
        start = TEXT.index(f"\n{key} = ") + len(f"\n{key} = ")
        end = TEXT.index(" ", start) if " " in TEXT[start:TEXT.index("\n", start)] else TEXT.index("\n", start)
        content = TEXT[:start] + literal + TEXT[end:]
    elif edit == "bytes":
        content = data.draw(st.binary(max_size=40), label="bytes")
    elif edit == "table":  # a table header where a value was, or an array of tables
        header = data.draw(st.sampled_from(["[[gpu]]", "[gpu.peak_tflops.bf16]", "[nodes]", "[efficiency]",
                                            "[[storage]]", "[gpu.name]"]), label="header")
        content = TEXT + "\n" + header + "\nx = 1\n"
    else:
        content = data.draw(st.sampled_from(["", " ", "\n", "#", "a = 1", "[gpu]"]), label="toml")
    assert_clean_exit(_show(folder, content))


NEAR_VALID = st.sampled_from([0, 1, 2, 3, 7, 1e-300, 1e-9, 1e-3, 0.5, 0.999, 1.0, 1e15, 10**15, 1e16])
NUMERIC_KEYS = [k for k in settable_keys() if k not in ("name", "description", "gpu.name", "cost.source")]
PLANS = ["dp=2,tp=2,pp=2,mbs=1,gbs=8", "pp=4,mbs=1,gbs=8,schedule=interleaved", "dp=8", "dp=2,zero=3",
         "pp=2,recompute=full"]


@SETTINGS
@given(data=st.data())
def test_near_valid_profile_simulates_cleanly(folder, data):
    """Numbers of the right kind, often valid, so the profile reaches the performance model,
    the step simulation and the failure simulation."""
    doc = copy.deepcopy(BASE)
    for key in data.draw(st.lists(st.sampled_from(NUMERIC_KEYS), min_size=1, max_size=3, unique=True), label="keys"):
        *tables, name = key.split(".")
        node = doc
        for table in tables:
            node = node.setdefault(table, {})
        node[name] = data.draw(NEAR_VALID, label=key)
    path = folder / "near.toml"
    path.write_text(to_toml(doc))
    command = data.draw(st.sampled_from(["simulate", "reliability"]), label="command")
    args = [command, TINY, "--hw", str(path), "--plan", data.draw(st.sampled_from(PLANS), label="plan")]
    from click.testing import CliRunner

    assert_clean_exit(CliRunner().invoke(cli, args + (["--days", "1"] if command == "reliability" else [])))
