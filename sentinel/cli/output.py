"""Text output for people: aligned tables (scripts get JSON instead)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sentinel.registry.records import ClientRecord


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


def protecting_clients(clients: Mapping[str, ClientRecord]) -> list[dict[str, Any]]:
    """The clients that serve instances of a service the registry no longer lists
    (protection from mass loss), as their ``/clients`` entries say."""
    return [
        {"client": name, "instances": r.protecting, "since": r.protecting_since}
        for name, r in sorted(clients.items())
        if r.protecting and r.left is None
    ]


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
