"""Context parallelism is offered only to a model file with a `context_parallel` hook: the
profile says why not, the search leaves cp out, `plan --explain` prints the reason, a fixed
cp is refused with it, and `execute` refuses with the same line."""

from __future__ import annotations

from smplan.hwprofiles import load_cluster
from smplan.planner import profile_model
from smplan.planner.search_space import enumerate_candidates, validate_constraints

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

WHY = "defines no context_parallel(model, sequence) hook"


def _hookless(tmp_path) -> str:
    """examples/gpt.py's model, batches and loss, without its context_parallel hook."""
    path = tmp_path / "nocp.py"
    path.write_text(f"import sys\nsys.path.insert(0, {str(EXAMPLES)!r})\nfrom gpt import batch, loss, tiny as model  # noqa\n")
    return str(path)


def test_the_profile_says_why_and_the_search_leaves_cp_out(tmp_path):
    cluster = load_cluster("h100x8", nodes=1)
    bare = profile_model(_hookless(tmp_path), seq_len=8192, cache=False)
    assert WHY in bare.unsupported["cp"] and bare.unsupported["cp"].startswith("nocp.py ")
    fixed = validate_constraints(bare, cluster, None, 8, None, None, "bf16")
    assert {c.cp for c in enumerate_candidates(bare, cluster, fixed, None)} == {1}
    hooked = profile_model(str(EXAMPLES / "gpt.py") + ":tiny", seq_len=8192, cache=False)
    assert "cp" not in hooked.unsupported
    fixed = validate_constraints(hooked, cluster, None, 8, None, None, "bf16")
    assert {c.cp for c in enumerate_candidates(hooked, cluster, fixed, None)} >= {1, 2}


def test_plan_explains_refuses_a_fixed_cp_and_execute_agrees(cli_runner, tmp_path):
    model = _hookless(tmp_path)
    base = ["plan", model, "--hw", "h100x8", "--nodes", "1", "--global-batch", "16"]
    explained = cli_runner.invoke(cli, [*base, "--explain"])
    assert explained.exit_code == 0, explained.output
    assert f"cp not offered: nocp.py {WHY}" in explained.output
    fixed = cli_runner.invoke(cli, [*base, "--fix", "cp=2"])
    assert fixed.exit_code == 2 and f"cp=2: nocp.py {WHY}" in fixed.output and fixed.output.strip().endswith("; use cp=1")
    assert len(fixed.output.strip().splitlines()) == 1
    run = cli_runner.invoke(cli, ["execute", "cp=2,mbs=1,gbs=2", "--model", model, "-o", str(tmp_path / "r")])
    assert run.exit_code == 2 and f"cp=2: nocp.py {WHY}" in run.output and run.output.strip().endswith("; use cp=1")
    assert not (tmp_path / "r").exists()
