"""Each service as a cluster view, after Apache Sling's discovery API.

A :class:`ClusterView` holds the live instances of a service in a stable order: the order in
which their nodes were created (their ``joined`` zxid), so a newcomer goes to the end and the
others keep their places until they leave. The leader is the first member: it changes only when
it leaves, and a newcomer never becomes leader while it lives. An instance whose session
expired re-registers as a new node, so it rejoins at the end (as Sling treats a restart).

Built on the registry's ephemeral nodes through the client's watch-driven cache, not on a
second mechanism. :class:`Topology` turns the cache's events into Sling's: ``TOPOLOGY_INIT``
when a listener is added, ``TOPOLOGY_CHANGING`` then ``TOPOLOGY_CHANGED`` (old and new view)
when membership changes, ``PROPERTIES_CHANGED`` when only members' properties change.
An instance publishes properties by registering again with new ones (same identity: the node
is updated in place and keeps its place in the order)::

    topology = Topology(sentinel, "shard-manager")
    topology.add_listener(lambda event: print(event.type, event.new_view.leader))
    if topology.view.leader_is(registration): ...
"""

from __future__ import annotations

import enum
import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sentinel.events import ChangeEvent, InstancesChanged, ServiceSpecChanged
from sentinel.registry.endpoint import Endpoint

if TYPE_CHECKING:
    from sentinel.client import Sentinel
    from sentinel.publisher import Registration

log = logging.getLogger(__name__)


class TopologyEventType(enum.Enum):
    """What happened to a cluster view (Sling's ``TopologyEvent.Type``)."""

    TOPOLOGY_INIT = "TOPOLOGY_INIT"
    TOPOLOGY_CHANGING = "TOPOLOGY_CHANGING"
    TOPOLOGY_CHANGED = "TOPOLOGY_CHANGED"
    PROPERTIES_CHANGED = "PROPERTIES_CHANGED"


@dataclass(frozen=True)
class ClusterView:
    """The live instances of a service in stable order, with a leader and an id.

    The id changes exactly when membership does (who is in the view, or a member rejoining
    under a new node); properties can change under the same id.
    """

    service: str
    members: tuple[Endpoint, ...]

    @property
    def id(self) -> str:
        """An identifier of this membership (members and the nodes they joined with)."""
        text = "\n".join(f"{m.name}@{m.joined}" for m in self.members)
        return hashlib.sha1(text.encode("utf-8"), usedforsecurity=False).hexdigest()[:16]

    @property
    def leader(self) -> Endpoint | None:
        """The member that joined first (None for an empty view)."""
        return self.members[0] if self.members else None

    def leader_is(self, registration: Registration) -> bool:
        """Whether this process's ``registration`` is the leader of the view."""
        return self.leader is not None and self.leader.name == registration.path.rsplit("/")[-1]

    def position(self, name: str) -> int | None:
        """A member's place in the order (0 is the leader), None if not a member."""
        for index, member in enumerate(self.members):
            if member.name == name:
                return index
        return None


@dataclass(frozen=True)
class TopologyEvent:
    """One event: its type, and the views before and after (either may be None)."""

    type: TopologyEventType
    old_view: ClusterView | None
    new_view: ClusterView | None


TopologyEventListener = Callable[[TopologyEvent], None]


def _membership(view: ClusterView) -> tuple[tuple[str, int], ...]:
    return tuple((m.name, m.joined) for m in view.members)


def _described(view: ClusterView) -> tuple[tuple[object, ...], ...]:
    """What members say about themselves (metrics are not properties: they change often)."""
    return tuple(
        (m.name, m.status, m.weight, m.zone, m.host, m.port, m.scheme, dict(m.properties))
        for m in view.members
    )


class Topology:
    """The cluster view of one service, kept current by the client's cache.

    Listeners run on the cache's worker thread, in order, each receiving ``TOPOLOGY_INIT``
    before anything else; an exception in one is logged and does not stop the others.
    """

    def __init__(self, sentinel: Sentinel, service: str) -> None:
        self.service = service
        self._sentinel = sentinel
        self._listeners: list[TopologyEventListener] = []
        # Held while listeners are called, so a new listener's INIT cannot cross a change.
        self._deliver = threading.Lock()
        sentinel.prefetch(service)
        self._view = self._read_view()
        self._remove = sentinel.listen(service, self._on_change)

    @property
    def view(self) -> ClusterView:
        """The current view."""
        return self._view

    def add_listener(self, listener: TopologyEventListener) -> None:
        """Add a listener; it first receives ``TOPOLOGY_INIT`` with the current view."""
        with self._deliver:
            self._listeners.append(listener)
            self._call(listener, TopologyEvent(TopologyEventType.TOPOLOGY_INIT, None, self._view))

    def close(self) -> None:
        """Stop following the service."""
        self._remove()

    def _read_view(self) -> ClusterView:
        members = sorted(self._sentinel.cached_instances(self.service), key=lambda e: e.joined)
        return ClusterView(self.service, tuple(members))

    def _on_change(self, event: ChangeEvent) -> None:
        if not isinstance(event, InstancesChanged | ServiceSpecChanged):
            return
        with self._deliver:
            old, new = self._view, self._read_view()
            self._view = new
            if _membership(old) != _membership(new):
                events = [
                    TopologyEvent(TopologyEventType.TOPOLOGY_CHANGING, old, None),
                    TopologyEvent(TopologyEventType.TOPOLOGY_CHANGED, old, new),
                ]
            elif _described(old) != _described(new):
                events = [TopologyEvent(TopologyEventType.PROPERTIES_CHANGED, old, new)]
            else:
                return
            for listener in self._listeners:
                for topology_event in events:
                    self._call(listener, topology_event)

    def _call(self, listener: TopologyEventListener, event: TopologyEvent) -> None:
        try:
            listener(event)
        except Exception:
            log.exception("topology listener %r failed on %s", listener, event.type.value)


__all__ = ["ClusterView", "Topology", "TopologyEventType"]
