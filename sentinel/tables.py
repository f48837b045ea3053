"""Aligned text tables for people: the ``sentinel`` command's and the demo's (scripts get JSON
instead)."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(rows: Sequence[Sequence[object]], headers: Sequence[str] | None = None) -> str:
    """Align ``rows`` in columns separated by two spaces; ``None`` prints as ``-``."""
    cells = [[("-" if value is None else str(value)) for value in row] for row in rows]
    if headers is not None:
        cells.insert(0, list(headers))
    if not cells:
        return ""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )
