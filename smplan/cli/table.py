"""Plain-text tables for terminal output (no dependency, aligned columns)."""

from __future__ import annotations


def format_table(headers: list[str], rows: list[list[object]], align: str | None = None) -> str:
    """Columns left-aligned for text and right-aligned for numbers unless `align` says (l/r)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if align is None:
        align = "".join(
            "r" if rows and all(isinstance(r[i], int | float) for r in rows) else "l" for i in range(len(headers))
        )

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if a == "r" else v.ljust(w) for v, w, a in zip(values, widths, align, strict=True)]
        return "  ".join(parts).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _cell(value: object) -> str:
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)
