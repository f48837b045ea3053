"""The watch-driven cache behind ``get_service``: per-service snapshots and shard maps.

One concern per module:

* :mod:`~sentinel.cache.views`: the immutable snapshots and their splicing (no I/O);
* :mod:`~sentinel.cache.worker`: the worker thread, its tasks, their merging, the re-sync;
* :mod:`~sentinel.cache.listeners`: the application's listeners;
* :mod:`~sentinel.cache.source`: the contract between the cache and what feeds it;
* :mod:`~sentinel.cache.followers`: one ZooKeeper follower per watch mode;
* :mod:`~sentinel.cache.curator`: the follower of Curator registries outside the namespace;
* :mod:`~sentinel.cache.reads`: the reads of a service, written once for both modes;
* :mod:`~sentinel.cache.read_through`: Procedure 1, keys the cached map does not hold;
* :mod:`~sentinel.cache.registry_cache`: the cache itself, which ties them together.
"""

from sentinel.cache.listeners import Listener
from sentinel.cache.registry_cache import RegistryCache
from sentinel.cache.stats import CacheStats
from sentinel.cache.views import ServiceSnapshot

__all__ = ["CacheStats", "Listener", "RegistryCache", "ServiceSnapshot"]
