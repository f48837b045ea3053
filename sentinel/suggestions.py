"""The names closest to a mistyped one, and how an error says them.

Every "did you mean" of the library and the CLI comes from here, so that a suggestion points
at a name that exists (a service, a region, a namespace) and never at one to create: a fix
hint that creates the name as typed would turn the typo into data.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


def close_matches(name: str, known: Iterable[str], n: int = 3) -> tuple[str, ...]:
    """Up to ``n`` of ``known`` (``name`` itself left out) close enough to ``name`` to be what
    was meant: those :func:`difflib.get_close_matches` finds (ratio 0.6 or more), and of them
    only the fewest typing mistakes away (:func:`typos`), so that ``esat`` suggests ``east``
    (two letters swapped) and not ``west`` as well."""
    names = sorted(set(known) - {name})
    similar = difflib.get_close_matches(name, names, n=len(names) or 1)
    if not similar:
        return ()
    fewest = min(typos(name, other) for other in similar)
    return tuple(other for other in similar if typos(name, other) == fewest)[:n]


def likely_typos(name: str, known: Iterable[str]) -> tuple[str, ...]:
    """Those of :func:`close_matches` so near ``name`` that it is more likely a typo of one of
    them than a name of its own: a typing mistake per four characters at most (``/sentinal``
    for ``/sentinel``, not ``/orders-new`` for ``/orders``). Before a hint that would create
    ``name``, these are what to suggest instead."""
    return tuple(m for m in close_matches(name, known) if typos(name, m) <= len(name) // 4)


def typos(a: str, b: str) -> int:
    """The typing mistakes between ``a`` and ``b``: letters left out, added, replaced, or two
    neighbours swapped, each one mistake (the optimal string alignment distance)."""
    before: list[int] = []
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        earlier, before, row = before, row, [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(
                before[j] + 1,
                row[j - 1] + 1,
                before[j - 1] + (a[i - 1] != b[j - 1]),
            )
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], earlier[j - 2] + 1)
    return row[len(b)]


def did_you_mean(matches: Sequence[str]) -> str:
    """``did you mean 'a' or 'b'?`` for ``matches``; empty when there is none."""
    return f"did you mean {' or '.join(map(repr, matches))}?" if matches else ""
