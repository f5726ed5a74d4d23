"""A refusal's hint is one the user can follow: one line, exit 2, naming a value that works."""

import pytest

from smplan.cli.main import cli

TINY = "examples/gpt.py:tiny"


@pytest.mark.parametrize("args, says", [
    # the model file without its .py
    (["plan", "examples/gpt:tiny", "--hw", "a100x8"], "does not exist; did you mean examples/gpt.py:tiny?"),
    # what the model cannot split comes before the size of the node ("use tp=2" would lead into it)
    (["plan", "examples/cnn.py", "--hw", "a100x8", "--fix", "tp=3"], "defines no tp_plan(block)"),
    # an inline shape that does not divide the GPUs names a tp that does
    (["simulate", TINY, "--hw", "a100x8", "--plan", "tp=3"], "use tp=2 or change pp/cp, or give dp="),
])
def test_the_hint_names_what_works(cli_runner, tmp_path, args, says):
    result = cli_runner.invoke(cli, args)
    # (profiling says it is at work once a second has passed, on stderr, before the refusal)
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith("profiling ")]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert says in lines[0], result.output


def test_a_plan_file_of_another_model_says_so(cli_runner, tmp_path):
    """A review: a plan file whose model was changed said only "fix the stage list"."""
    import json

    path = tmp_path / "plan.json"
    made = cli_runner.invoke(cli, ["plan", TINY, "--hw", "a100x8", "--arg", "layers=8", "--fix", "pp=2", "-o", str(path)])
    assert made.exit_code == 0, made.output
    plan = json.loads(path.read_text())
    plan["model_args"]["layers"] = 4
    path.write_text(json.dumps(plan))
    result = cli_runner.invoke(cli, ["simulate", str(path)])
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith("profiling ")]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "stages cover 8 blocks but examples/gpt.py:tiny has 4 (a plan made for another model" in lines[0]
    assert "make one for it with `smplan plan`" in lines[0]
