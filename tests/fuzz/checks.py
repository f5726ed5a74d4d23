"""What every fuzzed CLI run must end in: exit 0, or exit 2 with one `error: ` line (and,
for several problems, `  - ` lines under it), after any one-line `warning: `s; never a
traceback or another exit code."""

from __future__ import annotations


def assert_clean_exit(result) -> None:
    shown = f"exit {result.exit_code}, {result.exception!r}\n{result.output}"
    assert "Traceback" not in result.output, shown
    assert result.exception is None or isinstance(result.exception, SystemExit), shown
    assert result.exit_code in (0, 2), shown
    if result.exit_code == 2:
        lines = result.output.strip("\n").splitlines()
        while lines and lines[0].startswith("warning: "):
            lines.pop(0)
        header, *rest = lines
        assert header.startswith("error: ") and header.strip() != "error:", shown
        assert all(line.startswith("  - ") and line[4:].strip() for line in rest), shown
