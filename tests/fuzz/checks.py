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


def _paths(doc, here=()):
    """Every path (tuple of keys / indices) into a nested dict/list document."""
    yield here
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, here + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _paths(value, here + (i,))


def mutate(doc, data, keys, values):
    """Apply 1-4 random edits (drop, set, add a key / item) at random places of `doc`;
    new keys come from the strategy `keys`, new values from `values`."""
    from hypothesis import strategies as st

    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        path = data.draw(st.sampled_from(list(_paths(doc))), label="path")
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        target = parent[path[-1]] if path else doc
        op = data.draw(st.sampled_from(["drop", "set", "set", "add"]), label="op")
        if op == "add" and isinstance(target, dict):
            target[data.draw(keys, label="key")] = data.draw(values, label="value")
        elif op == "add" and isinstance(target, list):
            target.append(data.draw(values, label="item"))
        elif op == "drop" and path:
            del parent[path[-1]]
        elif path:
            parent[path[-1]] = data.draw(values, label="value")
    return doc
