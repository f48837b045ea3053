"""Client-side lookups: which partition holds a key, for each kind of shard policy.

* ``directory``: explicit key → partition, one flat dict the cache fills bucket by bucket;
* ``range``: sorted lower bounds, each starting a partition; a key maps to the partition of
  the greatest bound not above it (bisect);
* ``hash``: jump consistent hash of the key over a list of partitions; growing the list moves
  only the keys the new partitions take.

The watch-driven cache (:mod:`sentinel.cache`) keeps these structures current; lookups on them
are the hot path, so they take no lock and do no I/O.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Mapping
from typing import Any

from sentinel.errors import PartitionNotFound, ValidationError
from sentinel.shards.spec import Key, ShardPolicySpec


def shard_key(service: str, policy: str, key: object) -> Key:
    """The one key rule of every map kind (directory, range, hash), checked before any map is
    consulted: a ``str`` or an ``int`` (not ``bool``). No key is :class:`PartitionNotFound`;
    a key of another type (``True``, ``3.5``, bytes, ...) is :class:`ValidationError`.
    """
    if isinstance(key, str) or (isinstance(key, int) and not isinstance(key, bool)):
        return key  # type: ignore[return-value]
    if key is None:
        raise PartitionNotFound(
            service, key, policy, f"sharded by policy {policy!r}: a key is required"
        )
    raise ValidationError(
        f"service {service!r}: shard key {key!r} must be a str or an int, not {type(key).__name__}"
    )


def jump_hash(key: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash of a 64-bit key into ``buckets``."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


def _key_hash64(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


class DirectoryMap:
    """Client-side lookup for a directory policy: one flat dict, updated a bucket at a time.

    The dict is changed in place (each key's assignment is one atomic store) rather than copied
    on every change: copying a map of a million keys costs tens of milliseconds per update, and
    no reader needs two keys to agree with each other.
    """

    def __init__(self, spec: ShardPolicySpec) -> None:
        self.spec = spec
        self.keys: dict[str, str] = {}
        self._bucket_keys: list[tuple[str, ...]] = [()] * spec.buckets
        # The lookup is the dict's own C method: no Python frame on the hot path. A key of
        # another type (an int) misses here and is normalised on the read-through path.
        self.lookup = self.keys.get

    def apply_bucket(self, index: int, mapping: Mapping[str, str]) -> dict[str, tuple[Any, Any]]:
        """Replace bucket ``index`` with ``mapping``; return ``{key: (old, new)}`` of changes."""
        changes: dict[str, tuple[Any, Any]] = {}
        keys = self.keys
        for key in self._bucket_keys[index]:
            if key not in mapping:
                changes[key] = (keys.pop(key, None), None)
        for key, partition in mapping.items():
            old = keys.get(key)
            if old != partition:
                keys[key] = partition
                changes[key] = (old, partition)
        self._bucket_keys[index] = tuple(mapping)
        return changes

    def bucket(self, index: int) -> dict[str, str]:
        """The keys of bucket ``index`` and their partitions, as applied last (a key removed
        by an update meanwhile is left out)."""
        keys = self.keys
        found = ((key, keys.get(key)) for key in self._bucket_keys[index])
        return {key: partition for key, partition in found if partition is not None}


class RangeMap:
    """Client-side lookup for a range policy (immutable)."""

    def __init__(self, spec: ShardPolicySpec) -> None:
        self.spec = spec
        self._bounds = [bound for bound, _ in spec.boundaries]
        self._partitions = [partition for _, partition in spec.boundaries]

    def lookup(self, key: Key) -> str | None:
        """The partition of the greatest lower bound not above ``key``; None below the first."""
        try:
            typed = self.spec.typed_key(key)
        except ValidationError:
            return None
        index = bisect.bisect_right(self._bounds, typed) - 1
        return self._partitions[index] if index >= 0 else None


class HashMap:
    """Client-side lookup for a hash policy (immutable but for a bounded memo of answers)."""

    MEMO_SIZE = 100_000

    def __init__(self, spec: ShardPolicySpec) -> None:
        self.spec = spec
        self._partitions = spec.partitions or ()
        self._memo: dict[Key, str] = {}

    def lookup(self, key: Key) -> str:
        """The partition ``key`` hashes to."""
        partition = self._memo.get(key)
        if partition is None:
            text = key if type(key) is str else str(key)
            partition = self._partitions[jump_hash(_key_hash64(text), len(self._partitions))]
            if len(self._memo) < self.MEMO_SIZE:  # stop memoising rather than evict
                self._memo[key] = partition
        return partition


ShardMap = DirectoryMap | RangeMap | HashMap


def new_map(spec: ShardPolicySpec) -> ShardMap:
    """The lookup structure for ``spec`` (empty for a directory; the cache fills it)."""
    return {"directory": DirectoryMap, "range": RangeMap, "hash": HashMap}[spec.kind](spec)
