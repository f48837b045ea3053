"""The metric collector's writes: an instance's run-time metrics, published beside it.

A role of the client, as its shard-map and credential writers are
(docs/decisions/facade-by-role.md): ``Sentinel.update_metrics`` hands its call here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from sentinel.errors import DecodeError, InstanceNotRegistered
from sentinel.publisher import Registration
from sentinel.registry.curator import holds_instance
from sentinel.registry.layout import instance_path, metrics_path, service_path
from sentinel.registry.records import MetricsRecord, ServiceSpec
from sentinel.zk.watches import PersistentWatches


class MetricsWriter:
    """Publishes instances' metrics through one client's session.

    ``session`` and ``watches`` return the client's current kazoo client and watches (a
    forked child gets its own); ``writable`` runs before every write (the client started, the
    namespace's sections made).
    """

    def __init__(
        self,
        session: Callable[[], KazooClient],
        watches: Callable[[], PersistentWatches],
        writable: Callable[[], None],
    ) -> None:
        self._session = session
        self._watches = watches
        self._writable = writable

    def update(
        self,
        instance: Registration | str,
        *args: Any,
        measured_at: float | None = None,
    ) -> MetricsRecord:
        """:meth:`Sentinel.update_metrics <sentinel.Sentinel.update_metrics>`: the metrics
        ``args`` ends with, of ``instance`` (a registration, or a service followed in
        ``args`` by the partition and label)."""
        self._writable()
        identity = (
            (instance.service, instance.partition, instance.label)
            if isinstance(instance, Registration)
            else (instance,)
        )
        if len(identity) + len(args) != 4:
            raise TypeError(
                "update_metrics() takes (registration, metrics) or "
                "(service, partition, label, metrics)"
            )
        service, partition, label, metrics = *identity, *args
        record = MetricsRecord(
            service=service,
            partition=partition,
            label=label,
            values=metrics,
            measured_at=time.time() if measured_at is None else measured_at,
        )
        path = metrics_path(service, partition, label)
        data = record.to_bytes(path)
        # One request, as before: the write is conditional on the instance's node existing
        # (a check of any version), so metrics for an instance nobody registered (a typo in a
        # collector's configuration) are refused rather than left in an orphan node.
        instance_node = instance_path(service, partition, label)
        failure = self._write_if_registered(instance_node, path, data, create=False)
        if isinstance(failure, NoNodeError):  # the instance's first metrics: create the node
            self._session().ensure_path(path.rsplit("/", 1)[0])
            failure = self._write_if_registered(instance_node, path, data, create=True)
            if isinstance(failure, NodeExistsError):  # another writer created it meanwhile
                failure = self._write_if_registered(instance_node, path, data, create=False)
        if isinstance(failure, InstanceNotRegistered) and self._curator_holds(
            service, partition, label
        ):
            self._put_metrics(path, data)
            failure = None
        if failure is not None:
            raise failure
        return record

    def _curator_holds(self, service: str, partition: str, label: str) -> bool:
        """Whether ``service``'s spec names a Curator registry holding that instance (its node
        is outside the namespace: no transaction of this session can check it)."""
        spec_path = service_path(service)
        try:
            data, _ = self._session().get(spec_path)
            spec = ServiceSpec.from_bytes(service, spec_path, data)
        except (NoNodeError, DecodeError):
            return False
        return spec.curator is not None and holds_instance(self._watches(), spec, partition, label)

    def _put_metrics(self, path: str, data: bytes) -> None:
        """Write the metrics node of a Curator instance, checked just before (not in the same
        transaction: an instance gone meanwhile leaves a node no lookup reads, until the
        instance is back or ``sentinel doctor`` names it)."""
        self._session().ensure_path(path.rsplit("/", 1)[0])
        try:
            self._session().set(path, data)
        except NoNodeError:
            try:
                self._session().create(path, data)
            except NodeExistsError:  # another writer created it meanwhile
                self._session().set(path, data)

    def _write_if_registered(
        self, instance_node: str, path: str, data: bytes, *, create: bool
    ) -> Exception | None:
        """Write (or create) the metrics node at ``path`` if ``instance_node`` exists, in one
        transaction; the write's failure (kazoo returns it), or InstanceNotRegistered."""
        transaction = self._session().transaction()
        transaction.check(instance_node, -1)
        if create:
            transaction.create(path, data)
        else:
            transaction.set_data(path, data)
        checked, written = transaction.commit()
        if isinstance(checked, NoNodeError):
            service, name = instance_node.rsplit("/", 2)[1:]
            return InstanceNotRegistered(
                f"no instance {name!r} of service {service!r} is registered: metrics are "
                "published only for live instances (register it first, or check the "
                "partition and label)"
            )
        return written if isinstance(written, Exception) else None
