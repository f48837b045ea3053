"""Text output for people: aligned tables (scripts get JSON instead)."""

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


def protection_note(service: str, protecting: list[dict[str, Any]], now: float) -> str:
    """One line for operators: who serves instances of ``service`` no longer listed."""
    since = min(p["since"] or now for p in protecting)
    most = max(p["instances"] for p in protecting)
    names = ", ".join(p["client"] for p in protecting[:5])
    more = f" and {len(protecting) - 5} more" if len(protecting) > 5 else ""
    return (
        f"(protection from mass loss: {len(protecting)} client(s) ({names}{more}) serve up to "
        f"{most} instance(s) of {service} this listing no longer shows, lost to session "
        f"expiries {now - since:.0f}s ago; each is held until it registers again or its "
        "hold ends)"
    )
