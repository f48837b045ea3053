"""The host agent's sessions to other regions: one per region, opened when a process first
needs it, whatever the number of processes that do.

A process in agent mode whose lookups fail over to another region connects to the agent's
one socket, and its hello names the region (:mod:`sentinel.agentlink.protocol`). The agent's own
server (:class:`~sentinel.agent.server.AgentServer`) has admitted the connection (the peer
checks and caps of every connection) and hands it to the region's server, made here on the
first hello that names the region: a server like the agent's own, on a session to that
region, listening on no socket of its own. The region is the agent's configuration's
(``--regions``, ``$SENTINEL_REGIONS``): a process names a region, never where it is, so it
cannot make the agent connect anywhere its operator did not configure; a name the
configuration does not hold is answered :class:`~sentinel.errors.RegionNotServed`, and opens
nothing.

A region's session starts without waiting (:meth:`~sentinel.session.Session.start_connecting`):
a region whose ensemble does not answer holds up neither the agent's loop nor its other
regions (each region's server has its own loop and workers); its processes are told its
session is not connected, and they skip it, until it connects. See
docs/decisions/agent-sessions-to-other-regions.md.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sentinel import telemetry
from sentinel.client import Sentinel
from sentinel.errors import ZooKeeperUnavailable
from sentinel.events import ChangeEvent, ConnectionChanged
from sentinel.regions.config import Region, Regions

log = logging.getLogger(__name__)


class RegionServer(Protocol):
    """What this module uses of a region's server (an
    :class:`~sentinel.agent.server.AgentServer`, which imports this module)."""

    sentinel: Sentinel

    @property
    def processes(self) -> int: ...
    def adopt(self, handed: Any, hello: dict[str, Any]) -> None: ...
    def stop(self) -> None: ...


#: What makes a client one of the agent's sessions, its own region's or another's: it
#: announces nothing (each process is announced under its own id, for as long as it is), is
#: never an agent's client itself, and fails over to no region (the agent serves each apart).
AGENT_SESSION: Mapping[str, Any] = {"announce": False, "agent": False, "regions": False}

#: ``serve(sentinel, region)``: a started server of ``sentinel``'s session to ``region``.
Serve = Callable[[Sentinel, str], RegionServer]

# The other regions of each agent, by its own session's client (the one its AgentServer
# serves): what the agent's xDS server, given that client only, fails over to. Weak both
# ways: the regions hold their agent server, which holds the client (a strong value would
# keep its own key alive).
_BOUND: weakref.WeakKeyDictionary[Sentinel, weakref.ref[RegionServers]] = (
    weakref.WeakKeyDictionary()
)


def regions_of(home: Sentinel) -> RegionServers | None:
    """The other regions of the agent whose own session's client is ``home``
    (:meth:`RegionServers.bind`), None when it has none."""
    bound = _BOUND.get(home)
    return None if bound is None else bound()


class RegionServers:
    """The agent's other regions (:attr:`Regions.others <sentinel.regions.config.Regions>`)
    and their servers, each made on first need, its client as the region's entry says
    (hosts, namespace, TLS, identity), announcing nothing, with ``settings`` (the client id,
    timeouts, cache: what the agent's own client has). A hello naming the agent's own region
    (``regions.local``) is served by the agent's own session."""

    def __init__(self, regions: Regions, **settings: Any) -> None:
        self.local = regions.local
        self._configured = regions
        self._regions = {r.name: r for r in regions.others}
        self._settings = settings
        self._servers: dict[str, RegionServer] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._serve: Serve | None = None

    @property
    def configured(self) -> Regions:
        """The agent's regions configuration, its own region's name included."""
        return self._configured

    @property
    def connect_timeout(self) -> float:
        """Seconds a region's session is first waited for (its client's ``connect_timeout``)."""
        return float(self._settings.get("connect_timeout", 10.0))

    def bind(self, home: Sentinel, serve: Serve) -> None:
        """These are the other regions of the agent serving ``home`` (its own session's
        client), whose servers ``serve`` makes: a region another of the agent's servers needs
        first (xDS, :meth:`client`) is opened as a process's hello would open it."""
        self._serve = serve
        _BOUND[home] = weakref.ref(self)

    def client(self, region: Region) -> RegionClient:
        """The agent's session to ``region`` as a failover client of the agent's own
        (:class:`RegionClient`), its server made when nothing needed the region before;
        raises ZooKeeperUnavailable when the agent has no such region (or is stopping) or
        none is bound (:meth:`bind`)."""
        server = None if self._serve is None else self.server(region.name, self._serve)
        if server is None:
            raise ZooKeeperUnavailable(f"the agent does not serve region {region.name!r}")
        return RegionClient(server.sentinel)

    @property
    def names(self) -> list[str]:
        """The other regions configured, by name."""
        return sorted(self._regions)

    def server(self, name: str, serve: Serve) -> RegionServer | None:
        """The server of region ``name``, made (its session started, not waited for) when
        this is the first process that needs it; None when the agent has no such region (or
        is stopping)."""
        region = self._regions.get(name)
        if region is None:
            return None
        with self._lock:  # one session per region, however many hellos name it at once
            if self._closed:
                return None
            server = self._servers.get(name)
            if server is None:
                sentinel = Sentinel(
                    region.hosts,
                    namespace=region.namespace,
                    tls=region.tls,
                    identity=self._configured.identity_of(region),
                    prometheus_registry=None,  # the agent's own gauges say each region's state
                    **AGENT_SESSION,
                    **self._settings,
                )
                try:
                    sentinel.session.start_connecting()
                    server = self._servers[name] = serve(sentinel, name)
                except BaseException:
                    sentinel.close()
                    raise
                telemetry.AGENT_REGION_STALENESS.labels(name).set_function(
                    lambda: sentinel.staleness
                )
                log.info("agent: opening region %r (%s) for its first process", name, region.hosts)
        return server

    def status(self, everything: bool) -> list[dict[str, Any]]:
        """Each configured region's state (``unopened`` until a process needs it), its
        staleness and (``everything``: for root and the agent's user) its processes."""
        with self._lock:
            servers = dict(self._servers)
        states: list[dict[str, Any]] = []
        for name in self.names:
            server = servers.get(name)
            if server is None:
                states.append(
                    {"region": name, "state": "unopened", "staleness": None, "processes": 0}
                )
                continue
            states.append(
                {
                    "region": name,
                    "state": server.sentinel.connection_state,
                    "staleness": server.sentinel.staleness,
                    "processes": server.processes,
                }
            )
        if not everything:
            for state in states:
                state["processes"] = None
        return states

    def close(self) -> None:
        """Stop every region's server (its processes keep serving what they had, marked
        stale, and reconnect) and end its session; nothing opens after this."""
        with self._lock:
            self._closed = True
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            try:
                server.stop()
            finally:
                server.sentinel.close()


class RegionClient:
    """The agent's one session to another region, as a client of that region for the
    agent's own failover lookups (the xDS server's :class:`~sentinel.regions.router.Router`:
    a :class:`~sentinel.regions.remotes.RemoteClient`). The session is the region's server's,
    shared with that region's processes: :meth:`start` waits for it to connect (up to its
    ``connect_timeout``), :meth:`close` leaves it open and removes only the listeners added
    here; lookups read the region's cache as they are."""

    def __init__(self, sentinel: Sentinel) -> None:
        self._sentinel = sentinel
        self.session = sentinel.session
        self._removers: list[Callable[[], None]] = []

    def start(self) -> RegionClient:
        """Return once the region's session is connected; ZooKeeperUnavailable when it is
        not within its ``connect_timeout`` (the router tries again later, as for a session of
        its own that does not answer)."""
        connected = threading.Event()

        def heard(event: ChangeEvent) -> None:
            if isinstance(event, ConnectionChanged) and event.state == "connected":
                connected.set()

        remove = self._sentinel.listen(None, heard)
        try:
            if self.connection_state != "connected" and not connected.wait(
                self.session.connect_timeout
            ):
                raise ZooKeeperUnavailable(f"the agent's session to it is {self.connection_state}")
        finally:
            remove()
        return self

    def close(self) -> None:
        """Remove the listeners added through this client; the session stays the region's."""
        removers, self._removers = self._removers, []
        for remove in removers:
            remove()

    def listen(self, service: str | None, callback: Any) -> Callable[[], None]:
        remove: Callable[[], None] = self._sentinel.listen(service, callback)
        self._removers.append(remove)
        return remove

    def eligible_instances(
        self, service: str, key: object = None, policy: Any = None, failover: Any = None
    ) -> Any:
        return self._sentinel.eligible_instances(service, key, policy, failover)

    def explain(self, service: str, key: object = None, policy: Any = None) -> Any:
        return self._sentinel.explain(service, key, policy)

    def prefetch(self, service: str) -> None:
        self._sentinel.prefetch(service)

    def cached_instances(self, service: str) -> Any:
        return self._sentinel.cached_instances(service)

    @property
    def connection_state(self) -> str:
        return self._sentinel.connection_state

    @property
    def staleness(self) -> float:
        return self._sentinel.staleness
