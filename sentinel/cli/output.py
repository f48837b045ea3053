"""Text output for people: the notes the listings add under their tables (scripts get JSON
instead; the tables themselves are :func:`sentinel.tables.format_table`)."""

from __future__ import annotations

from typing import Any


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
