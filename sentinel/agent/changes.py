"""What the agent tells a process of a service's change: the nodes that changed, not the service.

No sockets, no threads: the agent's cache hands each change of a service to :func:`delta`
(the snapshot before, the one after, and the names the change touched), which says what
changed in the nodes' stored form, at a cost that grows with what changed, not with the
service. The agent encodes that once, numbered in the service's sequence, and every
connection following the service is handed the same bytes; :class:`Pending` keeps what a
connection has not been sent yet, bounded per service: past the bound the deltas collapse
into the service's whole state, built when the connection is written to next.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sentinel.cache.snapshot_file import instance_entry, metrics_entry
from sentinel.cache.views import ServiceSnapshot
from sentinel.registry.endpoint import Endpoint

# Deltas a connection may have unsent per service, and their bytes, before they collapse into
# the service's whole state: a process that reads slower than the service changes is sent the
# state once rather than a backlog, and costs the agent at most this much per service.
MAX_PENDING_DELTAS = 256
MAX_PENDING_DELTA_BYTES = 1 << 20


def delta(
    service: str,
    old: ServiceSnapshot,
    new: ServiceSnapshot,
    names: Collection[str] | None,
) -> dict[str, Any] | None:
    """What changed from ``old`` to ``new`` of ``service`` as a delta's fields; ``names``
    the only instances or metrics nodes that may have changed (None: any, which costs a
    diff of the whole service: a re-sync's rebuild).

    ``{}`` when nothing a process holds changed (the agent's own credential is not sent);
    None when a delta cannot say it: the spec changed (the process is sent the whole state,
    with a shard map it may not hold yet). Each field holds nodes in their stored form:
    ``instances`` and ``metrics`` (name: the node, None: removed), ``invalid`` and ``valid``
    (paths that became unreadable, and that are readable or gone again).
    """
    if old.spec != new.spec:
        return None
    if names is None:
        names = (
            old.endpoints.keys() | new.endpoints.keys() | old.metrics.keys() | new.metrics.keys()
        )
    instances: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    for name in names:
        before, after = old.endpoints.get(name), new.endpoints.get(name)
        if before is not after and (
            before is None or after is None or _node(before) != _node(after)
        ):
            instances[name] = None if after is None else instance_entry(name, after)
        record = new.metrics.get(name)
        if record != old.metrics.get(name):
            metrics[name] = None if record is None else metrics_entry(name, record)
    fields: dict[str, Any] = {}
    if instances:
        fields["instances"] = instances
    if metrics:
        fields["metrics"] = metrics
    if old.invalid is not new.invalid and old.invalid != new.invalid:
        fields["invalid"] = sorted(new.invalid - old.invalid)
        fields["valid"] = sorted(old.invalid - new.invalid)
    return fields


def _node(endpoint: Endpoint) -> tuple[Any, ...]:
    """What an endpoint's node holds (not the metrics or credential attached to it)."""
    return endpoint.record(), endpoint.joined, endpoint.uri


class Pending:
    """What one connection has not been sent yet: services due whole, each service's deltas
    in order (the same bytes every connection is handed), and each service's latest
    credential frame. Not thread-safe: its connection's lock guards it."""

    __slots__ = ("_sizes", "collapsed", "credentials", "deltas", "whole")

    def __init__(self) -> None:
        self.whole: set[str] = set()
        self.deltas: dict[str, list[tuple[int, bytes]]] = {}
        self._sizes: dict[str, int] = {}
        self.credentials: dict[str, bytes] = {}
        #: Times a service's deltas collapsed into its whole state (the bounds above).
        self.collapsed = 0

    def __bool__(self) -> bool:
        return bool(self.whole or self.deltas or self.credentials)

    def add_delta(self, service: str, seq: int, frame: bytes) -> None:
        """The change numbered ``seq`` of ``service``, as ``frame``; nothing when the whole
        state is due already (it is built when sent, holding this change)."""
        if service in self.whole:
            return
        queued = self.deltas.setdefault(service, [])
        queued.append((seq, frame))
        size = self._sizes[service] = self._sizes.get(service, 0) + len(frame)
        if len(queued) > MAX_PENDING_DELTAS or size > MAX_PENDING_DELTA_BYTES:
            self.collapsed += 1
            self.add_whole(service)

    def add_whole(self, service: str) -> None:
        """Send ``service``'s whole state (built when sent) in place of its deltas."""
        self.whole.add(service)
        self.deltas.pop(service, None)
        self._sizes.pop(service, None)

    def add_credential(self, service: str, frame: bytes) -> None:
        """The latest frame of the process's credential node of ``service`` (latest wins)."""
        self.credentials[service] = frame

    def take(self) -> tuple[dict[str, bytes], set[str], dict[str, list[tuple[int, bytes]]]]:
        """Everything due, emptied: credential frames (sent first: a whole state built after
        them holds a credential at least as new), services due whole, deltas."""
        due = self.credentials, self.whole, self.deltas
        self.credentials, self.whole, self.deltas, self._sizes = {}, set(), {}, {}
        return due
