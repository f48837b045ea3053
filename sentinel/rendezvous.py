"""Rendezvous (highest-random-weight) hashing: which of several names a key belongs to.

Every party computes the same owner without talking to the others, and when a name leaves only
the keys it owned move. The metric collector splits instances among its members with it and the
``Sticky`` balancer sends a key to an instance with it. It imports nothing from Sentinel, so
plug-ins can use it freely.
"""

from __future__ import annotations

import hashlib


def rendezvous_score(key: str, name: str) -> int:
    """The highest-random-weight score of ``name`` for ``key`` (64 bits)."""
    digest = hashlib.blake2b(f"{key}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
