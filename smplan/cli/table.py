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


def human_count(n: float) -> str:
    """55488 -> "55.5 thousand", 1.75e11 -> "175 billion": a count, never read as bytes."""
    for scale, word in ((1e12, "trillion"), (1e9, "billion"), (1e6, "million"), (1e3, "thousand")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {word}"
    return f"{n:g}"


def _cell(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def sequence_phrase(seq_len: int, global_batch: int) -> str:
    """", 4,096-token sequences (32,768 tokens per step)" for a header; "" for a model whose samples
    are not token sequences (seq_len 0)."""
    if not seq_len:
        return ""
    return f", {seq_len:,}-token sequences ({seq_len * global_batch:,} tokens per step)"
