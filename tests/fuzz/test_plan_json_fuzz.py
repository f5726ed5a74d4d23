"""Fuzz `smplan simulate PLAN.json`: valid plans with keys dropped, unknown keys added,
values of the wrong type (null, text, NaN, infinities, huge or negative numbers, lists,
objects, booleans), broken stages, duplicate keys, truncated or non-JSON text. Every
file must end in exit 0 or exit 2 with an `error: ` message (a header plus `  - ` lines
when there are several problems), never a traceback."""

from __future__ import annotations

import copy
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from smplan.hwprofiles import settable_keys
from smplan.planner import Figures, Plan, Stage

from smplan.cli.main import cli
from tests.conftest import EXAMPLES
from tests.fuzz.checks import assert_clean_exit, mutate

TINY = f"{EXAMPLES / 'gpt.py'}:tiny"
FIGURES = Figures(0.015, 8500.0, 530.0, 3.5e-4, 3.5e-4, 1.1e-6, 2.0, 0.0, {"compute": 0.015}, 6e-5,
                  {"weights": 1e-4, "total": 2.0})
# Plans as `smplan plan -o` writes them (Plan.to_dict, then JSON): one flat, one interleaved, one minimal.
BASES = [
    json.loads(Plan(model=TINY, hw="a100x8", nodes=1, dp=8, micro_batch=1, global_batch=8, zero=1,
                    stages=(Stage(0, 4, "selective", 0),), seq_len=16, predicted=FIGURES).to_json()),
    json.loads(Plan(model=TINY, hw="a100x8", nodes=1, dp=2, tp=2, pp=2, micro_batch=1, global_batch=8,
                    schedule="interleaved", virtual_stages=2, sequence_parallel=True, dtype="fp16",
                    stages=(Stage(0, 1, "full", 1), Stage(1, 2), Stage(2, 3), Stage(3, 4, "selective")),
                    model_args={"layers": 4}, hw_overrides={"inter_node.bandwidth_gbps": 50}).to_json()),
    {"model": TINY, "hw": "a100x8", "nodes": 1, "dp": 2, "tp": 1, "pp": 1, "micro_batch": 1, "global_batch": 4},
]
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 66),
    st.integers(min_value=2**21) | st.integers(max_value=-3),  # huge: past the simulator's micro-batch bound
    st.sampled_from([0, -1, 2**31, 2**63, 10**30, -(10**30), 10**300]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.5, 2.0, -0.0, 1e308, float("nan"), float("inf"), float("-inf")]),
    st.text(max_size=12),
    st.sampled_from(["", "a100x8", "h100x8", "a100x8.toml", "/", ".", "\x00", "x" * 300, TINY, TINY + "x",
                     str(EXAMPLES / "gpt.py"), "interleaved", "gpipe", "full", "selective", "fp16", "fp32", "1"]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
KEYS = st.one_of(st.text(max_size=10), st.sampled_from(
    ["dp", "tp", "pp", "zero", "zeroo", "first_block", "last_block", "recompute", "recompute_blocks", "layers",
     "hidden", "heads", "seq_len", "inter_node.bandwidth_gbps", "gpu.memory_gib", "nodes", "step_time_s", ""]))


def _mutate(doc, data):
    return mutate(doc, data, KEYS, VALUES)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("plans")


def _simulate(folder, content: str | bytes):
    path = folder / "plan.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8", errors="surrogatepass")
    from click.testing import CliRunner

    return CliRunner().invoke(cli, ["simulate", str(path)])


@SETTINGS
@given(data=st.data())
def test_mutated_plan_exits_cleanly(folder, data):
    doc = _mutate(copy.deepcopy(data.draw(st.sampled_from(BASES), label="base")), data)
    assert_clean_exit(_simulate(folder, json.dumps(doc, allow_nan=True, indent=1)))


RAW_EDITS = st.sampled_from(["truncate", "duplicate", "splice", "prefix", "number", "nest", "bytes", "empty"])


@SETTINGS
@given(data=st.data())
def test_broken_plan_text_exits_cleanly(folder, data):
    text = json.dumps(data.draw(st.sampled_from(BASES), label="base"), indent=2)
    edit = data.draw(RAW_EDITS, label="edit")
    at = data.draw(st.integers(0, len(text)), label="at")
    if edit == "truncate":
        content = text[:at]
    elif edit == "duplicate":  # a key given twice, at the top level or in a nested object
        key = data.draw(st.sampled_from(["dp", "model", "stages", "first_block", "step_time_s", "x"]), label="key")
        where = [i for i, c in enumerate(text) if c == "{"]
        i = data.draw(st.sampled_from(where), label="brace") + 1
        value = json.dumps(data.draw(VALUES, label="value"), allow_nan=True)
        content = text[:i] + f'"{key}": {value}, "{key}": {value},' + text[i:]
    elif edit == "splice":
        junk = data.draw(st.text(max_size=20), label="junk")
        end = data.draw(st.integers(at, min(len(text), at + 20)), label="end")
        content = text[:at] + junk + text[end:]
    elif edit == "prefix":
        content = data.draw(st.sampled_from(["\ufeff", "//", "x", "plan = ", "\x00"]), label="prefix") + text
    elif edit == "number":  # a literal JSON parsers take but no plan can use
        literal = data.draw(st.sampled_from(["1" * 5000, "1e999", "-1e999", "NaN", "Infinity", "-0", "1.5e-400",
                                             "9" * 400]), label="literal")
        key = data.draw(st.sampled_from(["dp", "global_batch", "nodes", "seq_len", "step_time_s"]), label="key")
        content = re.sub(rf'"{key}": [^,\n]+', f'"{key}": {literal}', text, count=1)
    elif edit == "nest":
        depth = data.draw(st.sampled_from([10, 1000, 100000]), label="depth")
        content = text.replace('"model_args": {}', '"model_args": {"a": ' + "[" * depth + "]" * depth + "}", 1) \
            if '"model_args": {}' in text else "[" * depth + "]" * depth
    elif edit == "bytes":
        content = data.draw(st.binary(max_size=40), label="bytes")
    else:
        content = data.draw(st.sampled_from(["", " ", "null", "[]", "{}", "0", '"plan"', "true"]), label="json")
    assert_clean_exit(_simulate(folder, content))


SMALL = st.sampled_from([-1, 0, 1, 2, 3, 4, 8, 16, 64])
NUMBERS = st.one_of(SMALL, st.sampled_from([0.0, 1e-300, 1e-9, 0.5, 1.0, 1.5, 1e15, 1e16, float("nan"), float("inf")]))
# Values of the right kind, often valid: these get past the schema into the cost model and the simulator.
NEAR_VALID = {
    "nodes": SMALL, "dp": SMALL, "tp": SMALL, "pp": SMALL, "micro_batch": SMALL, "global_batch": SMALL,
    "virtual_stages": SMALL, "zero": SMALL, "seq_len": st.one_of(st.none(), SMALL),
    "schedule": st.sampled_from(["gpipe", "1f1b", "interleaved"]), "dtype": st.sampled_from(["bf16", "fp16", "fp32"]),
    "hw": st.sampled_from(["a100x8", "v100x8", "h100x8", "l40sx8", "mi300xx8"]),
    "sequence_parallel": st.booleans(), "overlap_dp": st.booleans(),
    "model_args": st.dictionaries(st.sampled_from(["layers", "hidden", "heads", "vocab", "ffn", "kv_heads", "dropout",
                                                   "seq_len", "learned_positions"]), SMALL, max_size=2),
    "hw_overrides": st.dictionaries(st.sampled_from(settable_keys()), NUMBERS, max_size=2),
    "stages": st.lists(st.fixed_dictionaries({"first_block": SMALL, "last_block": SMALL},
                                             optional={"recompute": st.sampled_from(["none", "selective", "sac", "full"]),
                                                       "recompute_blocks": SMALL}), max_size=4),
}


@SETTINGS
@given(data=st.data())
def test_near_valid_plan_exits_cleanly(folder, data):
    doc = copy.deepcopy(data.draw(st.sampled_from(BASES), label="base"))
    for key in data.draw(st.lists(st.sampled_from(sorted(NEAR_VALID)), min_size=1, max_size=3, unique=True),
                         label="keys"):
        doc[key] = data.draw(NEAR_VALID[key], label=key)
    for derived in ("recompute", "num_microbatches", "stage_blocks"):
        doc.pop(derived, None)
    assert_clean_exit(_simulate(folder, json.dumps(doc, allow_nan=True)))


def test_valid_bases_simulate(folder):
    """The fuzzing starts from plans the CLI accepts (else every example would fail early)."""
    for base in BASES:
        result = _simulate(folder, json.dumps(base))
        assert result.exit_code == 0, result.output


def test_several_problems_are_a_header_and_dashed_lines(folder):
    doc = dict(BASES[2], dp="2", tp=None, zeroo=1)
    result = _simulate(folder, json.dumps(doc))
    assert_clean_exit(result)
    header, *lines = result.output.strip().splitlines()
    assert header.startswith("error: plan file ") and "has 3 problems" in header
    assert lines == ["  - zeroo: unknown key; did you mean 'zero'?",
                     '  - dp: got "2" (text), expected a whole number >= 1 and <= 1048576',
                     "  - tp: got null, expected a whole number >= 1 and <= 1048576"]
