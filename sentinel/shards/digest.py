"""A directory policy's digest: what its keys add up to, written beside them by every writer.

The digest node (``/shard_info/<policy>/digest``) holds the number of keys and the sum, modulo
2**256, of ``sha256(key NUL partition)`` over every assignment. A sum can be moved by a change
without reading the rest of the map (take the old pair's hash off, put the new one's on), so
each writer (:func:`sentinel.shards.store.update_keys`, placement) updates it in the very
transaction that changes the buckets, compare-and-set on its version: whatever a transaction
commits, the digest and the buckets agree.

So two things can be told from what a region holds (see
docs/decisions/shard-maps-replicated-per-region.md):

- a region **written behind the writers' back** (a bucket set with zkCli, a restore of an old
  backup) holds buckets whose sum is not its digest;
- a region that **lags** (it was unreachable while the shard manager wrote the others) holds a
  map consistent with its own digest, but another one than the other regions'.

The sum is a check against accidents and stale replicas, not against an adversary: whoever
may write the buckets may write the digest too, and an additive hash can be forged. The node
name has five characters, so the cache (which follows four-character bucket names) never
reads it. Everything here is pure: no ZooKeeper.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sentinel.errors import DecodeError
from sentinel.registry.records import decode, encode, fields_of, finite_number
from sentinel.shards.spec import policy_path

DIGEST = "digest"
_MODULUS = 2**256


def digest_path(policy: str) -> str:
    """The node holding a directory policy's digest."""
    return f"{policy_path(policy)}/{DIGEST}"


def _pair(key: str, partition: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{key}\0{partition}".encode()).digest(), "big")


@dataclass(frozen=True)
class MapDigest:
    """The number of keys of a directory map and the sum of their pairs' hashes."""

    keys: int = 0
    total: int = 0

    @classmethod
    def of(cls, assignments: Iterable[tuple[str, str]]) -> MapDigest:
        """The digest of a whole map, ``(key, partition)`` pairs."""
        keys, total = 0, 0
        for key, partition in assignments:
            keys += 1
            total += _pair(key, partition)
        return cls(keys, total % _MODULUS)

    def changed(self, before: Mapping[str, str], after: Mapping[str, str]) -> MapDigest:
        """This digest once the keys of ``before`` (some buckets as they were) are replaced by
        those of ``after`` (the same buckets as written)."""
        keys, total = self.keys, self.total
        for key, partition in before.items():
            if after.get(key) != partition:
                keys -= 1
                total -= _pair(key, partition)
        for key, partition in after.items():
            if before.get(key) != partition:
                keys += 1
                total += _pair(key, partition)
        return MapDigest(keys, total % _MODULUS)

    @property
    def hex(self) -> str:
        """The sum as 64 hex digits (what doctor shows and compares)."""
        return f"{self.total:064x}"

    def to_bytes(self, path: str) -> bytes:
        """The digest node's value; ``at`` is when it was written (which replica is newer)."""
        return encode(path, {"keys": self.keys, "sum": self.hex, "at": time.time()})

    @staticmethod
    def from_bytes(path: str, data: bytes | None) -> tuple[MapDigest, float]:
        """Decode a digest node: the digest and when it was written. DecodeError if it is not
        one."""
        document = decode(path, data)
        with fields_of(path):
            keys, text = document["keys"], document["sum"]
            at = finite_number("at", document["at"], minimum=0)
        if isinstance(keys, bool) or not isinstance(keys, int) or keys < 0:
            raise DecodeError(path, f"'keys' must be a count, not {keys!r}")
        if not isinstance(text, str) or len(text) != 64:
            raise DecodeError(path, "'sum' must be 64 hex digits")
        try:
            total = int(text, 16)
        except ValueError:
            raise DecodeError(path, "'sum' must be 64 hex digits") from None
        return MapDigest(keys, total), float(at)
