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
