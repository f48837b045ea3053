"""What ``sentinel doctor`` found: one :class:`Finding` per result, and the table people read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

from sentinel.cli.common import (
    colour_enabled,
    paint,
)
from sentinel.tables import format_table


@dataclass(frozen=True)
class Finding:
    """One result of one check: ``ok``, ``warn`` or ``error``, and how to fix it; ``region``
    names the region it was found in (None: no regions configured, or across regions)."""

    severity: str
    check: str
    detail: str
    fix: str = ""
    region: str | None = None


_COLOURS = {"error": "31", "warn": "33"}  # red, yellow


def print_findings(findings: list[Finding], stream: TextIO, *, regions: bool = False) -> None:
    """The findings as a table (with a REGION column when ``regions``) and a count of problems
    and warnings; ERROR lines red and WARN lines yellow when ``stream`` is a terminal and
    ``NO_COLOR`` is not set."""
    rows: list[tuple[str, ...]] = [
        (f.severity.upper(), f.check, f.detail, f.fix or "-") for f in findings
    ]
    headers: tuple[str, ...] = ("STATUS", "CHECK", "FINDING", "FIX")
    if regions:
        rows = [(f.region or "(all)", *row) for f, row in zip(findings, rows, strict=True)]
        headers = ("REGION", *headers)
    table = format_table(rows, headers).splitlines()
    if colour_enabled(stream):  # painted after aligning: escape codes have no width
        table[1:] = [
            paint(line, _COLOURS.get(f.severity))
            for line, f in zip(table[1:], findings, strict=True)
        ]
    problems = sum(f.severity == "error" for f in findings)
    warnings = sum(f.severity == "warn" for f in findings)
    print(*table, f"{problems} problem(s), {warnings} warning(s)", sep="\n", file=stream)
