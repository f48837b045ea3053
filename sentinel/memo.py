"""Reusing work done on one immutable input while the same object keeps coming back.

The cache hands a policy or balancer the same tuple of endpoints on every lookup until that
partition changes (a change in another partition of the service keeps the tuple), so whatever
is derived from that tuple alone (the endpoints a policy keeps, a balancer's cumulative
weights) can be computed once per change of the partition rather than once per lookup. This
module imports nothing from Sentinel, so plug-ins can use it freely.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class IdentityMemo(Generic[K, V]):
    """Values computed from input objects, found again by the object's identity.

    Each entry keeps its input alive, so an id is never mistaken for a recycled one. At most
    ``size`` entries are kept; when full it starts over. Safe to share between threads: a
    race only computes a value twice.
    """

    def __init__(self, size: int = 64) -> None:
        self._entries: dict[int, tuple[K, V]] = {}
        self._size = size

    def get(self, key: K, compute: Callable[[K], V]) -> V:
        """The value for ``key``, computing it the first time it is seen."""
        hit = self._entries.get(id(key))
        if hit is not None and hit[0] is key:
            return hit[1]
        value = compute(key)
        if len(self._entries) >= self._size:
            self._entries.clear()
        self._entries[id(key)] = (key, value)
        return value
