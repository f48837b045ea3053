"""Aligned text tables for people: the ``sentinel`` command's and the demo's (scripts get JSON
instead)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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


def age(seconds: float | None) -> str:
    """``42s``, ``7m``, ``3h``, ``2d`` (``-`` when unknown)."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def metrics_text(values: Any) -> str:
    """``lag=2.5 queue=3`` for a table cell."""
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
