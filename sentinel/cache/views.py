"""The cache's immutable views: one :class:`ServiceSnapshot` per service, and the events
between two of them. No I/O, no locks, no threads: what is here can be tested on values alone.

A change to one instance or its metrics derives the new snapshot from the old one
(:meth:`ServiceSnapshot.updated`): only its partition's tuples are spliced and only it is diffed
for the listeners (the rest is copied by reference, at C speed).
"""

from __future__ import annotations

import bisect
import itertools
import operator
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from sentinel.auth.envelope import Credential
from sentinel.events import ChangeEvent, InstancesChanged, MetricsChanged
from sentinel.registry.endpoint import NO_METRICS, Endpoint
from sentinel.registry.records import MetricsRecord, ServiceSpec
from sentinel.shards.maps import DirectoryMap, ShardMap
from sentinel.strategies import Balancer, RoundRobin
from sentinel.telemetry import LookupCounts

_NO_CHANGES: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ServiceSnapshot:
    """Everything a lookup needs about one service, immutable.

    ``partitions`` holds every instance per partition and ``up`` the ones with status ``up``
    (sorted by label); the key ``None`` holds all of them, for services that are not sharded.
    ``metrics`` holds every metrics node by instance name (an instance's endpoint carries its
    own); ``invalid`` names the nodes that could not be decoded and are skipped.
    ``balancer`` is the service's default balancer and ``lookups`` its lookup counter, both
    carried from snapshot to snapshot; ``built_at`` is when this snapshot was built.
    ``auth`` is this client's decrypted credential, attached to every endpoint.
    ``protected`` holds, by name, the instances the registry no longer lists that the cache
    still serves after a mass loss (:mod:`sentinel.cache.protection`), each marked with
    ``unlisted_since``: in ``partitions`` and ``up`` beside the listed ones (so a lookup pays
    nothing for them), never in ``endpoints``, which is the registry's list.
    ``held`` names the partitions whose ``up`` tuple is empty though instances there are up:
    a client that failed over to another region holds them back until they have been up for
    the service's ``return_after`` (:mod:`sentinel.cache.return_home`), so a lookup pays
    nothing for the hold either.
    """

    spec: ServiceSpec
    endpoints: Mapping[str, Endpoint]
    metrics: Mapping[str, MetricsRecord]
    partitions: Mapping[str | None, tuple[Endpoint, ...]]
    up: Mapping[str | None, tuple[Endpoint, ...]]
    invalid: frozenset[str]
    balancer: Balancer
    lookups: LookupCounts
    built_at: float
    auth: Credential | None = None
    protected: Mapping[str, Endpoint] = field(default_factory=lambda: _NO_CHANGES)
    held: frozenset[str | None] = frozenset()

    @classmethod
    def build(
        cls,
        spec: ServiceSpec,
        endpoints: Mapping[str, Endpoint],
        metrics: Mapping[str, MetricsRecord],
        invalid: frozenset[str],
        balancer: Balancer,
        lookups: LookupCounts,
        auth: Credential | None = None,
        protected: Mapping[str, Endpoint] = _NO_CHANGES,
        held: frozenset[str | None] = frozenset(),
    ) -> ServiceSnapshot:
        """Attach metrics and auth and index by partition, once per change, not per lookup;
        a protected instance the registry lists again is the listed one from then on; a
        ``held`` partition's ``up`` tuple is empty."""
        endpoints = {name: _attach(e, metrics.get(name), auth) for name, e in endpoints.items()}
        if protected:
            protected = {
                n: _attach(e, metrics.get(n), auth)
                for n, e in protected.items()
                if n not in endpoints
            }
        groups: dict[str, list[Endpoint]] = {}
        for endpoint in itertools.chain(endpoints.values(), protected.values()):
            groups.setdefault(endpoint.partition, []).append(endpoint)
        partitions = {p: tuple(sorted(g, key=_LABEL)) for p, g in groups.items()}
        return cls(
            spec=spec,
            endpoints=endpoints,
            metrics=dict(metrics),
            partitions=_with_all(partitions),
            up=_held(
                _with_all(
                    {p: tuple(e for e in g if e.status == "up") for p, g in partitions.items()}
                ),
                held,
            ),
            invalid=invalid,
            balancer=balancer,
            auth=auth,
            lookups=lookups,
            built_at=time.time(),
            protected=protected or _NO_CHANGES,
            held=held,
        )

    @classmethod
    def first(
        cls,
        spec: ServiceSpec,
        endpoints: Mapping[str, Endpoint],
        metrics: Mapping[str, MetricsRecord],
        invalid: frozenset[str],
        auth: Credential | None = None,
    ) -> ServiceSnapshot:
        """A service's first snapshot: its default balancer (round robin) and its lookup
        counter start here and are carried to every later snapshot."""
        return cls.build(spec, endpoints, metrics, invalid, RoundRobin(), LookupCounts(), auth)

    def rebuilt(self, **changes: Any) -> ServiceSnapshot:
        """A new snapshot with some of spec, endpoints, metrics, invalid or auth replaced."""
        fields = {
            "spec": self.spec,
            "endpoints": self.endpoints,
            "metrics": self.metrics,
            "invalid": self.invalid,
            "balancer": self.balancer,
            "auth": self.auth,
            "lookups": self.lookups,
            "protected": self.protected,
            "held": self.held,
        }
        return ServiceSnapshot.build(**(fields | changes))

    def updated(
        self,
        invalid: frozenset[str],
        endpoints: Mapping[str, Endpoint | None] = _NO_CHANGES,
        metrics: Mapping[str, MetricsRecord | None] = _NO_CHANGES,
    ) -> ServiceSnapshot:
        """This snapshot with a few instances or metrics replaced (None: removed), or itself
        when that changes nothing.

        A change costs what it touches: untouched endpoints stay the same objects, and so do
        the tuples of untouched partitions (a policy's or balancer's memo of them stays valid);
        a touched partition's tuples are spliced at the changed labels. Only the copies of the
        name maps and of the key None's tuple (every instance) grow with the service, at C
        speed. While instances are protected (a mass loss, seconds at most) or partitions held
        (a return home, ``return_after`` at most) a change rebuilds the whole snapshot instead.
        """
        all_metrics = self.metrics
        metrics = {n: r for n, r in metrics.items() if r != all_metrics.get(n)}
        if metrics:
            all_metrics = dict(all_metrics)
            for name, record in metrics.items():
                if record is None:
                    del all_metrics[name]
                else:
                    all_metrics[name] = record
        touched: dict[str, tuple[Endpoint | None, Endpoint | None]] = {}
        for name in endpoints.keys() | metrics.keys():
            old = self.endpoints.get(name)
            bare = endpoints.get(name, old)  # None: the instance is gone
            new = None if bare is None else _attach(bare, all_metrics.get(name), self.auth)
            if not (new is old or new == old):
                touched[name] = (old, new)
        if not touched:
            if not metrics and invalid == self.invalid:
                return self
            return replace(self, metrics=all_metrics, invalid=invalid, built_at=time.time())
        all_endpoints = dict(self.endpoints)
        if self.protected or self.held:
            for name, (_, new) in touched.items():
                if new is None:
                    del all_endpoints[name]
                else:
                    all_endpoints[name] = new
            return self.rebuilt(endpoints=all_endpoints, metrics=all_metrics, invalid=invalid)
        gone: dict[str, list[Endpoint]] = {}
        came: dict[str, list[Endpoint]] = {}
        for name, (old, new) in touched.items():
            if new is None:
                del all_endpoints[name]
            else:  # replaced in place: a dict without deleted slots copies at memcpy speed
                all_endpoints[name] = new
                came.setdefault(new.partition, []).append(new)
            if old is not None:
                gone.setdefault(old.partition, []).append(old)
        partitions = _spliced_index(self.partitions, gone, came)
        return replace(
            self,
            endpoints=all_endpoints,
            metrics=all_metrics,
            partitions=partitions,
            up=_spliced_index(self.up, _up(gone), _up(came), partitions),
            invalid=invalid,
            built_at=time.time(),
        )


_LABEL = operator.attrgetter("label")
_PLACE = operator.attrgetter("partition", "label")


def _with_all(
    by_partition: Mapping[str, tuple[Endpoint, ...]],
) -> dict[str | None, tuple[Endpoint, ...]]:
    """``by_partition`` in partition order, under the key None every endpoint by partition
    and label (the one partition's own tuple when there is one)."""
    order = sorted(by_partition)
    everything = by_partition[order[0]] if len(order) == 1 else ()
    if len(order) > 1:
        everything = tuple(itertools.chain.from_iterable(by_partition[p] for p in order))
    return {None: everything} | {p: by_partition[p] for p in order}


def _held(
    up: dict[str | None, tuple[Endpoint, ...]], held: frozenset[str | None]
) -> dict[str | None, tuple[Endpoint, ...]]:
    """``up`` with the ``held`` partitions' tuples empty (the key None is the whole service's:
    held when an unsharded service is)."""
    return up if not held else {p: () if p in held else t for p, t in up.items()}


def _up(by_partition: Mapping[str, list[Endpoint]]) -> dict[str, list[Endpoint]]:
    """The endpoints with status ``up``, by partition (every partition kept)."""
    return {p: [e for e in group if e.status == "up"] for p, group in by_partition.items()}


def _spliced_index(
    index: Mapping[str | None, tuple[Endpoint, ...]],
    gone: Mapping[str, list[Endpoint]],
    came: Mapping[str, list[Endpoint]],
    partitions: Mapping[str | None, object] | None = None,
) -> dict[str | None, tuple[Endpoint, ...]]:
    """A partition index (``partitions``, or ``up`` given the new ``partitions``) with
    endpoints removed and added; untouched partitions keep their tuples. A partition with no
    instance left goes; one whose instances are all down keeps an empty ``up`` tuple."""
    by_partition = dict(index)
    everything = by_partition.pop(None)
    appeared = False
    for partition in gone.keys() | came.keys():
        appeared |= partition not in by_partition
        members = _spliced(
            by_partition.get(partition, ()),
            gone.get(partition, ()),
            came.get(partition, ()),
            _LABEL,
        )
        if members if partitions is None else partition in partitions:
            by_partition[partition] = members
        else:
            by_partition.pop(partition, None)
    if appeared:
        by_partition = dict(sorted(by_partition.items()))
    if len(by_partition) <= 1:
        everything = next(iter(by_partition.values()), ())
    else:  # spliced too: slicing copies references, where a concatenation iterates
        flat = itertools.chain.from_iterable
        everything = _spliced(everything, flat(gone.values()), flat(came.values()), _PLACE)
    return {None: everything} | by_partition


def _spliced(
    members: tuple[Endpoint, ...],
    removed: Iterable[Endpoint],
    added: Iterable[Endpoint],
    key: Callable[[Endpoint], Any],
) -> tuple[Endpoint, ...]:
    """``members`` (in ``key`` order) without ``removed``, with ``added``.

    The key is unique: a label within its partition (it names the node), or
    ``(partition, label)`` within the service.
    """
    spliced = list(members)
    for endpoint in removed:
        del spliced[bisect.bisect_left(spliced, key(endpoint), key=key)]
    for endpoint in added:
        bisect.insort(spliced, endpoint, key=key)
    return tuple(spliced)


def _attach(endpoint: Endpoint, record: MetricsRecord | None, auth: Credential | None) -> Endpoint:
    values, at = (NO_METRICS, None) if record is None else (record.values, record.measured_at)
    if endpoint.metrics == values and endpoint.metrics_at == at and endpoint.auth is auth:
        return endpoint
    return replace(endpoint, metrics=values, metrics_at=at, auth=auth)


def endpoint_events(
    service: str, old: Mapping[str, Endpoint], new: Mapping[str, Endpoint]
) -> list[ChangeEvent]:
    """The events between two endpoint maps: membership and state, then metrics alone.

    Auth is the same on every endpoint and has an event of its own (:class:`AuthChanged`).
    """
    added = tuple(new[n] for n in sorted(new.keys() - old.keys()))
    removed = tuple(old[n] for n in sorted(old.keys() - new.keys()))
    updated, metrics = [], []
    for name in sorted(old.keys() & new.keys()):
        before, after = old[name], new[name]
        # The same credential object on both sides unless the auth changed: copy only then.
        same_auth = before if before.auth is after.auth else replace(before, auth=after.auth)
        if same_auth == after:
            continue
        if replace(same_auth, metrics=after.metrics, metrics_at=after.metrics_at) == after:
            metrics.append((before, after))
        else:
            updated.append((before, after))
    events: list[ChangeEvent] = []
    if added or removed or updated:
        events.append(InstancesChanged(service, added, removed, tuple(updated)))
    if metrics:
        events.append(MetricsChanged(service, tuple(metrics)))
    return events


def directory_keys(shard_map: ShardMap | None) -> Mapping[str, str]:
    """A directory map's keys (other maps have none to diff)."""
    return shard_map.keys if isinstance(shard_map, DirectoryMap) else {}


def key_changes(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, tuple[Any, Any]]:
    """``key: (old partition, new partition)`` for every key whose partition differs."""
    changes: dict[str, tuple[Any, Any]] = {k: (p, None) for k, p in old.items() if k not in new}
    changes.update((k, (old.get(k), p)) for k, p in new.items() if old.get(k) != p)
    return changes
