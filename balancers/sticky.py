"""Sticky balancing: the same key goes to the same instance (rendezvous hashing)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from balancers import Balancer
from sentinel.memo import IdentityMemo

if TYPE_CHECKING:
    from sentinel.endpoint import Endpoint


def rendezvous_score(key: str, endpoint_name: str) -> int:
    """The highest-random-weight score of ``endpoint_name`` for ``key`` (64 bits)."""
    digest = hashlib.blake2b(f"{key}\0{endpoint_name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


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
