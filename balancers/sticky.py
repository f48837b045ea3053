"""Sticky balancing: the same key goes to the same instance (rendezvous hashing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sentinel.memo import IdentityMemo
from sentinel.rendezvous import rendezvous_score
from sentinel.strategies import Balancer

if TYPE_CHECKING:
    from sentinel.registry.endpoint import Endpoint


class Sticky(Balancer):
    """The endpoint with the highest rendezvous score for ``key``.

    Every client computes the same choice without talking to the others, and when an instance
    leaves only the keys it held move (each to its next-highest instance); a new instance takes
    only the keys for which it scores highest.
    """

    def __init__(self, key: object) -> None:
        self.key = str(key)
        self._choice: IdentityMemo[Sequence[Endpoint], Endpoint] = IdentityMemo()

    def pick(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        """The endpoint ``key`` hashes to among these (hashed once per set of endpoints)."""
        return self._choice.get(
            endpoints, lambda e: max(e, key=lambda x: rendezvous_score(self.key, x.name))
        )
