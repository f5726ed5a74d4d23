"""The plan file schema: every bad plan is a PlanError naming the key, the value and what is
expected, one line per problem; unknown and duplicate keys are rejected; good plans round-trip."""

import json
import re

import pytest
from smplan.planner import Plan, PlanError, Stage, parse_inline, parse_model_args
from smplan.planner.model_file import ModelFileError

GOOD = {"model": "examples/gpt.py:tiny", "hw": "a100x8", "nodes": 1, "dp": 2, "tp": 2, "pp": 2,
        "micro_batch": 1, "global_batch": 8}


FIGURES = {"step_time_s": 1.0, "tokens_per_s": 2.0, "samples_per_s": 3.0, "model_tflops_per_gpu": 4.0,
           "hardware_tflops_per_gpu": 5.0, "mfu": 0.5, "peak_memory_gib": 6.0, "bubble_fraction": 0.1}


def _plan(**changes):
    data = {**GOOD, **changes}
    return {k: v for k, v in data.items() if v is not _DROP}


_DROP = object()

# (changes to GOOD, text every message must hold)
BAD = [
    ({"model": None}, "model: got null, expected non-empty text"),
    ({"model": ""}, "model: got \"\""),
    ({"hw": 123}, "hw: got 123, expected non-empty text"),
    ({"hw": ["a100x8"]}, "hw: got [\"a100x8\"] (a list)"),
    ({"dp": "2"}, "dp: got \"2\" (text), expected a whole number >= 1"),
    ({"dp": 2.0}, "dp: got 2.0, expected a whole number"),
    ({"dp": True}, "dp: got true (a boolean)"),
    ({"dp": 0}, "dp: got 0, expected a whole number >= 1"),
    ({"tp": -1}, "tp: got -1"),
    # a typo guard: a hint would otherwise suggest gbs=4722366482869645213696
    ({"dp": 2**72}, f"dp: got {2**72}, expected a whole number >= 1 and <= 1048576"),
    ({"global_batch": 2**25}, "global_batch: got 33554432, expected a whole number >= 1 and <= 16777216"),
    ({"nodes": {}}, "nodes: got {} (an object)"),
    ({"global_batch": "8"}, "global_batch: got \"8\""),
    ({"micro_batch": None}, "micro_batch: got null"),
    ({"overlap_dp": {}}, "overlap_dp: got {} (an object), expected true or false"),
    ({"overlap_dp": "no"}, "overlap_dp: got \"no\" (text), expected true or false"),
    ({"overlap_dp": 2}, "overlap_dp: got 2, expected true or false (or 0 / 1)"),
    ({"sequence_parallel": "yes"}, "sequence_parallel: got \"yes\""),
    ({"schedule": "zb"}, "schedule: got \"zb\" (text), expected one of \"gpipe\", \"1f1b\", \"interleaved\""),
    ({"schedule": 1}, "schedule: got 1"),
    ({"zero": "1"}, "zero: got \"1\" (text), expected one of 0, 1, 2, 3"),
    ({"zero": 4}, "zero: got 4"),
    ({"zero": 1.0}, "zero: got 1.0"),
    ({"dtype": "fp4"}, "dtype: got \"fp4\""),
    ({"virtual_stages": "2"}, "virtual_stages: got \"2\""),
    ({"seq_len": 0}, "seq_len: got 0"),
    ({"seq_len": "16"}, "seq_len: got \"16\""),
    ({"model_args": []}, "model_args: got [] (a list), expected an object"),
    ({"model_args": {"layers": [4]}}, "model_args.layers: got [4] (a list)"),
    ({"hw_overrides": "x=1"}, "hw_overrides: got \"x=1\" (text), expected an object"),
    ({"hw_overrides": {"inter_node.bandwidth_gbps": None}}, "hw_overrides.inter_node.bandwidth_gbps: got null"),
    ({"stages": {}}, "stages: got {} (an object), expected a list"),
    ({"stages": [1]}, "stages[0]: got 1, expected an object"),
    ({"stages": [{"first_block": 0}]}, "stages[0].last_block: missing"),
    ({"stages": [{"first_block": "0", "last_block": 4}]}, "stages[0].first_block: got \"0\" (text)"),
    ({"stages": [{"first_block": 0, "last_block": 4, "recompute": "most"}]}, "stages[0].recompute: got \"most\""),
    ({"stages": [{"first_block": 0, "last_block": 4, "recomput": "full"}]},
     "stages[0].recomput: unknown key; did you mean 'recompute'?"),
    ({"predicted": {k: v for k, v in FIGURES.items() if k != "tokens_per_s"}}, "predicted.tokens_per_s: missing, expected a number"),
    ({"predicted": {**FIGURES, "breakdown": {"compute": "1"}}}, "predicted.breakdown: got"),
    ({"predicted": []}, "predicted: got [] (a list), expected an object of predicted figures, or null"),
    ({"predicted": {**FIGURES, "step_time_s": "1"}}, "predicted.step_time_s: got \"1\" (text), expected a number"),
    ({"version": 3}, "version: got 3, expected 2"),
    ({"version": "1"}, "version: got \"1\" (text)"),
    ({"zeroo": 1}, "zeroo: unknown key; did you mean 'zero'?"),
    ({"overlap": True}, "overlap: unknown key; did you mean 'overlap_dp'?"),
    ({"qqq": 1}, "qqq: unknown key; known keys: model, hw"),
    ({"dp": _DROP}, "dp: missing; a plan file must give it"),
    ({"model": _DROP}, "model: missing"),
    ({"global_batch": _DROP}, "global_batch: missing"),
    ({"num_microbatches": 3}, "num_microbatches: got 3, expected 4 (global_batch / (dp x micro_batch) = "),
    ({"recompute": "full"}, "recompute: got \"full\" (text), expected \"none\" (the strongest of the stages"),
    ({"stages": [{"first_block": 0, "last_block": 2}, {"first_block": 2, "last_block": 4}], "stage_blocks": [[0, 3]]},
     "stage_blocks: got [[0, 3]] (a list), expected [[0, 2], [2, 4]], what stages give (each chunk's first_block and "
     "last_block); fix whichever of the two was edited by mistake, or drop stage_blocks to keep stages"),
    ({"global_batch": 7}, "global batch 7 is not divisible by dp*mbs=2; use gbs=6 or 8 (global_batch in a plan file)"),
    # the stages dropped and their summary kept: the missing key is named, not the summary
    ({"stage_blocks": [[0, 4]]}, "stages: missing, expected the stages that stage_blocks lists"),
    ({"stages": [], "stage_blocks": [[0, 4]]}, "stages: got [] (a list), expected the stages that stage_blocks"),
]


@pytest.mark.parametrize(("changes", "needle"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_plan_is_one_line_naming_key_value_and_expected(changes, needle):
    with pytest.raises(PlanError) as info:
        Plan.from_dict(_plan(**changes), source="plan file 'p.json'")
    message = str(info.value)
    assert needle in message
    assert "\n" not in message and message.startswith("plan file 'p.json': ")


def test_every_problem_is_listed_one_line_each():
    data = _plan(dp=_DROP, hw=123, overlap_dp="no", zeroo=1, tp="2")
    with pytest.raises(PlanError) as info:
        Plan.from_dict(data, source="plan file 'p.json'")
    head, *problems = str(info.value).splitlines()
    assert head.startswith("plan file 'p.json' has 5 problems") and "smplan plan -o" in head
    assert len(problems) == 5 and all(line.startswith("  - ") for line in problems)
    for key in ("dp:", "hw:", "overlap_dp:", "zeroo:", "tp:"):
        assert sum(line[4:].startswith(key) for line in problems) == 1, key


def test_not_an_object():
    for data in ([], "plan", None, 3):
        with pytest.raises(PlanError, match="expected one JSON object"):
            Plan.from_dict(data)


def test_a_structurally_wrong_plan_names_the_file():
    with pytest.raises(PlanError, match=r"^plan file 'p.json': global batch 7 is not divisible"):
        Plan.from_dict(_plan(global_batch=7), source="plan file 'p.json'")


def test_booleans_take_json_booleans_or_0_1():
    assert Plan.from_dict(_plan(overlap_dp=0)).overlap_dp is False
    assert Plan.from_dict(_plan(overlap_dp=True, sequence_parallel=1)).sequence_parallel is True


def test_plan_round_trips_through_json(tmp_path):
    from smplan.planner import Figures

    plan = Plan(model="examples/gpt.py:tiny", hw="a100x8", nodes=1, dp=1, tp=2, pp=2, micro_batch=1, global_batch=8,
                schedule="interleaved", virtual_stages=2, zero=1, sequence_parallel=True, overlap_dp=False,
                dtype="fp16", stages=(Stage(0, 1, "full", 1), Stage(1, 2), Stage(2, 3), Stage(3, 4, "selective")),
                model_args={"layers": 4, "dropout": 0.0, "attention": "sdpa", "learned_positions": True},
                seq_len=16, hw_overrides={"inter_node.bandwidth_gbps": 50, "gpu.name": "x"},
                predicted=Figures(1.0, 2.0, 3.0, 4.0, 5.0, 0.5, 6.0, 0.1, {"compute": 0.5}, 0.01, {"weights": 1.0}))
    path = tmp_path / "p.json"
    plan.save(path)
    assert Plan.load(path) == plan


def test_load_rejects_a_duplicate_key(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"model": "m", "hw": "a100x8", "nodes": 1, "dp": 1, "dp": 2}')
    with pytest.raises(PlanError, match=r"p.json'?: key 'dp' is given twice; keep one"):
        Plan.load(path)


@pytest.mark.parametrize(("content", "needle"), [
    (None, "does not exist"),
    ("{", "is not valid JSON"),
    ("[" * 100000 + "]" * 100000, "nests too deeply"),
    (b"\xff\xfe", "cannot read plan file"),
])
def test_load_unreadable(tmp_path, content, needle):
    path = tmp_path / "p.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(PlanError, match=needle):
        Plan.load(path)


def test_load_a_folder(tmp_path):
    with pytest.raises(PlanError, match="is a folder"):
        Plan.load(tmp_path)


@pytest.mark.parametrize(("text", "needle"), [
    ("tp=2,tp=4", "plan key tp is given twice"),
    ("mbs=1,micro_batch=2", "plan key mbs (as micro_batch) is given twice"),
    ("gbs=8,dp=2,global_batch=8", "plan key gbs (as global_batch) is given twice"),
    ("v=2,virtual_stages=2", "given twice"),
    ("tpp=2", "did you mean tp?"),
])
def test_inline_duplicates_and_typos(text, needle):
    with pytest.raises(PlanError) as info:
        parse_inline(text)
    assert needle in str(info.value)


def test_inline_keeps_its_defaults():
    from smplan.planner import plan_from_inline

    plan = plan_from_inline("tp=2", model="m", hw="a100x8", nodes=1, gpus_per_node=8, num_blocks=4)
    assert (plan.dp, plan.pp, plan.micro_batch, plan.global_batch) == (4, 1, 1, 4)
    # v > 1 implies the interleaved schedule, as `plan --fix v=2` does; a stated other one is refused
    plan = plan_from_inline("pp=2,v=2", model="m", hw="a100x8", nodes=1, gpus_per_node=8, num_blocks=4)
    assert (plan.schedule, plan.virtual_stages) == ("interleaved", 2)
    with pytest.raises(PlanError, match="v=2 needs schedule=interleaved"):
        plan_from_inline("pp=2,v=2,schedule=1f1b", model="m", hw="a100x8", nodes=1, gpus_per_node=8, num_blocks=4)


def test_duplicate_model_arg():
    with pytest.raises(ModelFileError, match="--arg layers is given twice"):
        parse_model_args(["layers=2", "hidden=32", "layers=3"])
    assert parse_model_args(["layers=2", "hidden=32"]) == {"layers": 2, "hidden": 32}


def test_saved_plan_is_plain_json(tmp_path):
    plan = Plan.from_dict(_plan(hw_overrides={"inter_node.bandwidth_gbps": 50}))
    plan.save(tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["hw_overrides"] == {"inter_node.bandwidth_gbps": 50}


# Regressions found by tests/fuzz/test_plan_json_fuzz.py: each crashed (a traceback, exit 1)
# or broke the one-line-per-problem format before its fix.
def test_load_a_number_over_4300_digits(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(GOOD).replace('"dp": 2', '"dp": ' + "1" * 5000))
    with pytest.raises(PlanError, match=r"has a number over 4300 digits long") as info:
        Plan.load(path)
    assert "\n" not in str(info.value)


def test_a_huge_int_predicted_figure_is_a_problem_not_an_overflow():
    with pytest.raises(PlanError, match=r"predicted.step_time_s: got 1000000000.*, expected a number"):
        Plan.from_dict(_plan(predicted={**FIGURES, "step_time_s": 10**400}))


@pytest.mark.parametrize("key", ["a\nb", "", " dp", "\x00", "tab\there"])
def test_an_odd_unknown_key_is_quoted_on_its_line(key):
    with pytest.raises(PlanError) as info:
        Plan.from_dict(_plan(**{key: 1, "model_args": {key: [1]}}), source="plan file 'p.json'")
    head, *problems = str(info.value).splitlines()
    assert len(problems) == 2 and all(line.startswith("  - ") for line in problems), str(info.value)
    assert problems[0].startswith(f"  - {json.dumps(key)}: unknown key")
    assert problems[1].startswith(f"  - model_args.{json.dumps(key)}: got [1]")


def test_seq_len_has_an_upper_bound():
    assert Plan.from_dict(_plan(seq_len=2**24)).seq_len == 2**24
    with pytest.raises(PlanError, match=r"seq_len: got 16777217, expected a whole number >= 1 and <= 16777216"):
        Plan.from_dict(_plan(seq_len=2**24 + 1))


def test_a_plan_file_finds_its_model_beside_it(tmp_path, monkeypatch):
    """`smplan plan model.py -o p.json` in one folder, `smplan simulate folder/p.json` from another:
    the relative model path is looked up beside the plan file when the working directory lacks it."""
    import shutil
    from pathlib import Path

    from smplan.planner import Plan

    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "examples" / "gpt.py", work / "mymodel.py")
    Plan(model="mymodel.py:tiny", hw="a100x8", nodes=1, dp=8, micro_batch=1, global_batch=8).save(work / "p.json")
    monkeypatch.chdir(tmp_path)
    assert Plan.load(work / "p.json").model == "work/mymodel.py:tiny"  # named from here, below it
    monkeypatch.chdir(work)  # where it was made: the path stays as written
    assert Plan.load("p.json").model == "mymodel.py:tiny"
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not below the model's folder: named absolutely
    assert Plan.load(work / "p.json").model == f"{work.resolve() / 'mymodel.py'}:tiny"


def test_a_plan_written_to_another_folder_works_from_anywhere(tmp_path, monkeypatch):
    """`smplan plan mymodel.py -o /elsewhere/p.json`: the file records the model relative to
    itself, so simulate and execute find it from any directory."""
    import json
    import shutil
    from pathlib import Path

    from smplan.planner import Plan

    work, plans, other = tmp_path / "work", tmp_path / "plans", tmp_path / "other"
    for d in (work, plans, other):
        d.mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "examples" / "gpt.py", work / "mymodel.py")
    monkeypatch.chdir(work)
    Plan(model="mymodel.py:tiny", hw="a100x8", nodes=1, dp=8, micro_batch=1, global_batch=8).save(plans / "p.json")
    assert json.loads((plans / "p.json").read_text())["model"] == "../work/mymodel.py:tiny"
    assert Plan.load(plans / "p.json").model == "mymodel.py:tiny"  # where it was made: as given
    monkeypatch.chdir(other)
    assert Plan.load(plans / "p.json").model == f"{work.resolve() / 'mymodel.py'}:tiny"


def test_a_model_in_a_folder_with_a_colon_keeps_its_builder(tmp_path, monkeypatch):
    import shutil
    from pathlib import Path

    from smplan.planner import Plan
    from smplan.planner.model_file import split_ref

    work = tmp_path / "a:b"
    work.mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "examples" / "gpt.py", work / "m.py")
    assert split_ref(f"{work / 'm.py'}:tiny") == (work / "m.py", "tiny")
    Plan(model="m.py:tiny", hw="a100x8", nodes=1, dp=8, micro_batch=1, global_batch=8).save(work / "p.json")
    monkeypatch.chdir(tmp_path)
    assert split_ref(Plan.load(work / "p.json").model) == (Path("a:b/m.py"), "tiny")
    # written from here to another folder: recorded as ../a:b/m.py:tiny, read back from anywhere
    plans, other = tmp_path / "plans", tmp_path / "other"
    plans.mkdir()
    other.mkdir()
    for ref, builder in (("a:b/m.py:tiny", "tiny"), ("a:b/m.py", "model")):
        Plan(model=ref, hw="a100x8", nodes=1, dp=8, micro_batch=1, global_batch=8).save(plans / "q.json")
        for where in (tmp_path, other, Path("/")):
            monkeypatch.chdir(where)
            loaded = split_ref(Plan.load(plans / "q.json").model)
            assert (loaded[0] if loaded[0].is_absolute() else where / loaded[0]).resolve() == (work / "m.py").resolve()
            assert loaded[1] == builder
        monkeypatch.chdir(tmp_path)


def test_inline_stages_carry_the_split_and_recompute_counts():
    """`stages=BLOCKS:RECOMPUTED/...` rebuilds a plan's uneven split and partial recompute, so
    the --plan form whatif prints replays the plan `smplan plan` chose."""
    from smplan.planner import plan_from_inline

    from smplan.whatif.point import plan_inline

    common = dict(model="m", hw="a100x8", nodes=1, gpus_per_node=8, num_blocks=8)
    plan = plan_from_inline("pp=2,dp=4,recompute=selective,stages=5:2/3:0", **common)
    assert [(s.first_block, s.last_block, s.num_recomputed) for s in plan.stages] == [(0, 5, 2), (5, 8, 0)]
    assert plan_inline(plan).endswith(",stages=5:2/3:0")
    again = plan_from_inline(plan_inline(plan), **common)
    assert again.stages == plan.stages
    # the even split with every block recomputed is the default: no stages= then
    even = plan_from_inline("pp=2,dp=4,recompute=full", **common)
    assert "stages=" not in plan_inline(even)


@pytest.mark.parametrize(("text", "needle"), [
    ("pp=2,dp=4,stages=8:0", "lists 1 model chunks but pp*v = 2"),
    ("pp=2,dp=4,stages=4:0/3:0", "places 7 blocks but the model has 8"),
    ("pp=2,dp=4,stages=4:1/4:0", "recomputes blocks but recompute=none"),
    ("pp=2,dp=4,stages=4:5/4:0", "0 <= RECOMPUTED <= BLOCKS"),
    ("pp=2,dp=4,stages=4:x/4", "BLOCKS:RECOMPUTED per model chunk"),
    ("pp=2,dp=4,stages=0:0/8:0", "1 <= BLOCKS"),
])
def test_inline_stages_errors_name_the_fix(text, needle):
    from smplan.planner import plan_from_inline

    with pytest.raises(PlanError, match=re.escape(needle)):
        plan_from_inline(text, model="m", hw="a100x8", nodes=1, gpus_per_node=8, num_blocks=8)


def test_a_version_2_file_gives_every_layout_key():
    """`plan -o` writes them all; one deleted by hand would run another plan (review: a cp=2 plan
    without its "cp" failed on the node count; without "zero" it was priced at ZeRO-0). A file
    without "version" is hand-written: the defaults apply."""
    full = Plan.from_dict(_plan()).to_dict()
    assert full["version"] == 2 and Plan.from_dict(full).cp == 1
    for key in ("cp", "ep", "zero", "schedule", "virtual_stages", "sequence_parallel", "dtype"):
        with pytest.raises(PlanError, match=rf"{key}: missing; a version-2 plan file gives every layout key"):
            Plan.from_dict({k: v for k, v in full.items() if k != key}, source="plan file 'p.json'")
    assert Plan.from_dict(_plan()).zero == 0  # no "version": hand-written, defaults
