"""Procedure 1: a shard key the cached directory map does not hold, read from ZooKeeper."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from cachetools import TTLCache
from kazoo.client import KazooClient

from sentinel.cache.ratelimit import TokenBucket
from sentinel.cache.stats import CacheStats
from sentinel.errors import DecodeError, PartitionNotFound, ReadThroughThrottled
from sentinel.shards.maps import DirectoryMap, ShardMap
from sentinel.shards.spec import validate_key
from sentinel.shards.store import read_key
from sentinel.suggestions import did_you_mean, likely_typos
from sentinel.zk.errors import translate

log = logging.getLogger(__name__)


class ReadThrough:
    """Reads of keys missing from the cache, bounded per service and remembered when absent.

    The answer is not written to the cache: the bucket's watch brings it, so the cache sees
    writes in ZooKeeper's order. Misses are remembered for ``negative_ttl`` seconds (at most
    ``negative_size`` of them), so a flood of unknown keys does not become a flood of reads;
    reads beyond ``rate`` per second and service are refused with
    :class:`~sentinel.errors.ReadThroughThrottled`.
    """

    def __init__(
        self,
        zk: KazooClient,
        shard_maps: Mapping[str, ShardMap | None],
        stats: CacheStats,
        *,
        rate: float,
        negative_ttl: float,
        negative_size: int,
    ) -> None:
        self._zk = zk
        self._shard_maps = shard_maps
        self._stats = stats
        self._rate = rate
        self._budgets: dict[str, TokenBucket] = {}
        self._negative: TTLCache[tuple[str, str], bool] = TTLCache(negative_size, negative_ttl)
        self._negative_lock = threading.Lock()

    def partition(self, service: str, policy: str, key: object) -> str:
        """The partition of ``key`` under ``policy``, read from ZooKeeper when the cached
        map does not hold it; :class:`~sentinel.errors.PartitionNotFound` when it has none."""
        shard_map = self._shard_maps.get(policy)
        if isinstance(shard_map, DirectoryMap):
            text = validate_key(key)
            partition = shard_map.keys.get(text)  # an int key is cached under its string
            if partition is not None:
                return partition
            negative_key = (policy, text)
            with self._negative_lock:
                known_miss = negative_key in self._negative
            if known_miss:
                self._stats.negative_hits += 1
            elif not self._budget(service).take():
                self._stats.throttled_reads += 1
                raise ReadThroughThrottled(service, key, self._rate)
            else:
                self._stats.read_throughs += 1
                try:
                    partition = read_key(self._zk, shard_map.spec, text)
                except DecodeError as exc:  # the key's bucket is not valid: nothing in it is
                    self._stats.decode_errors += 1
                    log.warning("skipping %s", exc)
                    partition = None
                except Exception as exc:
                    raise translate(exc, "a shard key read") from exc
                if partition is not None:
                    return partition
                with self._negative_lock:
                    self._negative[negative_key] = True
        if shard_map is None:
            # A typo of a policy this client follows is pointed at, never offered to create.
            meant = likely_typos(policy, self._followed_policies())
            reason = f"shard policy {policy!r} does not exist; " + (
                did_you_mean(meant)
                if meant
                else f"`sentinel shard create-policy {policy} ...` creates it"
            )
        elif isinstance(shard_map, DirectoryMap):
            # The command that fixes it, with this key and policy filled in.
            reason = (
                f"shard policy {policy!r} has no such key; `sentinel shard assign {key} "
                f"PARTITION --policy {policy}` (or shard_maps.assign) assigns it"
            )
        else:
            reason = (
                f"it is below the first boundary of range policy {policy!r}, "
                f"or not a {shard_map.spec.key_type}"
            )
        raise PartitionNotFound(service, key, policy, reason)

    def _followed_policies(self) -> list[str]:
        """The shard policies this client holds a map of (no I/O: a lookup's error path)."""
        return [name for name, held in list(self._shard_maps.items()) if held is not None]

    def _budget(self, service: str) -> TokenBucket:
        budget = self._budgets.get(service)
        if budget is None:  # a race creates two buckets; one wins, which is harmless
            budget = self._budgets.setdefault(service, TokenBucket(self._rate))
        return budget
