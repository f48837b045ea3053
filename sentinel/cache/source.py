"""The contract between the cache and what feeds it.

A :class:`Follower` keeps one :class:`~sentinel.cache.RegistryCache` current: ZooKeeper's
watches in one of two modes (:mod:`sentinel.cache.followers`), Curator registries outside the
namespace (:mod:`sentinel.cache.curator`), the host agent (:mod:`sentinel.cache.agent`).
It reads or receives a service's state and hands changes to the cache through
:class:`FollowedCache`, on the cache's worker; the cache serves them (immutable snapshots, one
dict store per change) and tells the listeners. Nothing on the lookup path knows which
follower fed it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Protocol

from sentinel.cache.stats import CacheStats
from sentinel.cache.views import ServiceSnapshot
from sentinel.cache.worker import CacheWorker
from sentinel.shards.maps import ShardMap


class Follower(Protocol):
    """What keeps a cache current. The namespace's follower is chosen once per session; a
    follower of other registries (:mod:`sentinel.cache.curator`) feeds the services the
    namespace does not hold. Every method runs on the cache's worker."""

    #: Whether changes arrive on persistent watches kept across reconnections (for telemetry
    #: and ``Sentinel.persistent_watches``; nothing branches on it).
    persistent: bool
    #: Whether a snapshot it hands in is whole: with a spec naming a Curator registry, that
    #: registry's instances too (the host agent's are; the namespace's followers leave them
    #: to :mod:`sentinel.cache.curator`).
    complete: bool

    def load_service(self, service: str) -> ServiceSnapshot:
        """Start following ``service`` and return its first snapshot (raises
        :class:`~sentinel.errors.ServiceNotFound`); its changes reach the cache from now on."""
        ...

    def load_services(self, services: Sequence[str]) -> Iterator[ServiceSnapshot | Exception]:
        """:meth:`load_service` of each of ``services`` (a prefetch of many), as many requests
        in flight at once as the follower can keep correct: the first snapshot of each, or
        what its load raised, in their order, each as soon as it is made."""
        ...

    def forget(self, service: str) -> None:
        """Stop following ``service`` (the cache drops it next): no change of it is reported
        any more, and none is paid for where that can be avoided."""
        ...

    def resync(self) -> None:
        """After a reconnection: bring every followed service and shard policy up to date,
        handing only real changes to the cache."""
        ...


class FollowedCache(Protocol):
    """The cache as its follower sees it: the state it holds and how a change is handed in."""

    snapshots: Mapping[str, ServiceSnapshot]
    shard_maps: Mapping[str, ShardMap | None]
    stats: CacheStats
    worker: CacheWorker

    def swap(
        self,
        service: str,
        snapshot: ServiceSnapshot,
        names: Collection[str] | None = None,
        lost: Collection[str] = (),
    ) -> None:
        """Serve ``snapshot`` for a followed service; ``names``: the only instances that may
        have changed (None: any); ``lost``: instances that vanished without their owner's
        departure mark (:mod:`sentinel.cache.protection`)."""
        ...

    def update(
        self,
        service: str,
        current: ServiceSnapshot,
        field: str,
        changes: Mapping[str, Any],
        invalid: frozenset[str],
        lost: Collection[str] = (),
    ) -> None:
        """Serve ``current`` with a few children of one section replaced (None: removed);
        ``lost``: as :meth:`swap`'s."""
        ...

    def serves_at_once(self, service: str, lost: bool) -> bool:
        """Whether a change of ``service``'s instances or metrics may be handed in off the
        worker (:meth:`~sentinel.cache.worker.CacheWorker.run_now`): serving it builds the
        snapshot and nothing more. ``lost``: an instance gone unmarked."""
        ...

    def native_services(self) -> list[str]:
        """The services the namespace's follower feeds (another source feeds the rest)."""
        ...

    def drop(self, service: str) -> None:
        """Stop serving ``service`` (its node is gone)."""
        ...

    def add_policy_user(self, policy: str, service: str) -> None:
        """``service`` is sharded by ``policy``: its listeners hear of the policy's keys."""
        ...

    def set_shard_map(
        self, policy: str, shard_map: ShardMap | None, changes: dict[str, tuple[Any, Any]]
    ) -> None:
        """Serve ``shard_map`` (None: the policy does not exist) and tell of ``changes``."""
        ...

    def emit_keys(self, policy: str, changes: dict[str, tuple[Any, Any]]) -> None:
        """Tell the policy's users of keys that moved in a map changed in place."""
        ...


def load_each(
    load: Callable[[str], ServiceSnapshot], services: Sequence[str]
) -> Iterator[ServiceSnapshot | Exception]:
    """:meth:`Follower.load_services` one service at a time, with ``load`` (a follower's
    :meth:`~Follower.load_service`): what each load returned or raised."""
    for service in services:
        try:
            yield load(service)
        except Exception as exc:  # the cache serves each outcome as a load of its own would
            yield exc
