"""What the host agent answers the requests a process sends on its connection: its hello,
``follow``, ``partition``, ``status``, ``ping``, and ``announce`` (its ``/clients`` record).

A connection's requests are served one at a time, in order, on a few request workers (they
may wait on ZooKeeper), never on the loop; a request worker serves one and queues the rest
behind the other connections'. A request that breaks the protocol drops its connection only,
logged and counted; one the agent cannot answer (the service unknown or unreadable to the
process's identity, the session down) is answered with an error saying why.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Protocol

from kazoo.exceptions import KazooException

from sentinel.agent.connection import LOGGER, MAX_QUEUED_REQUESTS, Connection, Server, Workers
from sentinel.agentlink import protocol
from sentinel.agentlink.link import error_answer
from sentinel.agentlink.protocol import ProtocolError
from sentinel.agentlink.protocol import field as checked
from sentinel.errors import (
    AccessDenied,
    NamespaceNotFound,
    ResolutionError,
    SentinelError,
    ZooKeeperUnavailable,
)
from sentinel.registry.layout import client_path, validate_name
from sentinel.registry.records import ClientRecord
from sentinel.zk.errors import translate

if TYPE_CHECKING:
    from sentinel.agent.admission import Admission
    from sentinel.agent.credentials import Credentials
    from sentinel.agent.fanout import Fanout
    from sentinel.agent.identities import Identities
    from sentinel.agent.regions import RegionServers
    from sentinel.client import Sentinel

log = logging.getLogger(LOGGER)

# A ping waits this long at most for its request on the session (a process's measurement
# waits as long: sentinel.regions.remotes.RTT_TIMEOUT).
PING_TIMEOUT = 2.0


class Host(Server, Protocol):
    """What answering a hello asks of the server besides a connection's loop."""

    def served_region(self, connection: Connection, hello: dict[str, Any]) -> str | bool | None:
        """The region ``hello`` names when this server serves it (None: it names none);
        False when the connection was handed to another region's server, or refused."""

    @property
    def listeners(self) -> dict[str, str]:
        """The agent's other surfaces and where each listens (``{"dns": "127.0.0.1:53"}``)."""


class Answers:
    """The requests of ``admission``'s connections, served on ``workers`` from
    ``sentinel``'s session: what a process may read as ``identities`` check it, its
    credentials as ``credentials`` read them, its frames queued for ``fanout`` to build.
    ``heartbeat``: the seconds told in the welcome; ``regions``: the agent's other regions
    (their state in ``status``)."""

    def __init__(
        self,
        sentinel: Sentinel,
        host: Host,
        workers: Workers,
        *,
        admission: Admission,
        identities: Identities,
        credentials: Credentials,
        fanout: Fanout,
        heartbeat: float,
        regions: RegionServers | None,
    ) -> None:
        self._sentinel = sentinel
        self._host = host
        self._workers = workers
        self._admission = admission
        self._identities = identities
        self._credentials = credentials
        self._fanout = fanout
        self._heartbeat = heartbeat
        self._regions = regions

    def serve_next(self, connection: Connection) -> None:
        """A request worker's: serve the connection's next request, then queue the rest
        behind the other connections' (no connection holds a worker for long)."""
        with connection.due:
            if connection.closed or not connection.requests:
                connection.serving = False
                return
            message = connection.requests.popleft()
            resume = len(connection.requests) == MAX_QUEUED_REQUESTS - 1
        try:
            if not connection.welcomed:
                if message["op"] != "hello":
                    raise ProtocolError(f"{message['op']!r} before the hello")
                self._welcome(connection, message)
                connection.welcomed = True
            elif message["op"] == "hello":
                raise ProtocolError("a second hello")
            else:
                self._serve(connection, message)
        except (ProtocolError, SentinelError, ValueError) as exc:
            log.warning("agent: dropping pid %d: %s", connection.pid, exc)
            return self._host.drop(connection, "protocol")
        except Exception:  # a bug of the agent's own: logged, and the process reconnects
            log.exception("agent: dropping pid %d", connection.pid)
            return self._host.drop(connection, "error")
        if resume:
            self._host.call_loop(connection)
        with connection.due:
            more = bool(connection.requests) and not connection.closed
            connection.serving = more
        if more:
            self._workers.submit(self.serve_next, connection)

    def _welcome(self, connection: Connection, hello: dict[str, Any]) -> None:
        connection.version = checked(hello, "version", int)
        if connection.version not in protocol.VERSIONS:
            raise ProtocolError(f"protocol version {hello['version']}, not {protocol.VERSION}")
        region = self._host.served_region(connection, hello)
        if region is False:
            return  # handed to its region's server, or refused
        if checked(hello, "namespace", str) != self._sentinel.namespace:
            raise ProtocolError(
                f"namespace {hello['namespace']!r}: this agent serves {self._sentinel.namespace!r}"
            )
        self._admission.claim(connection, validate_name("client id", checked(hello, "client", str)))
        connection.identity = checked(hello, "identity", (str, type(None)))
        connection.deltas = hello.get("deltas") is True  # else whole states, as it expects
        auth_client = checked(hello, "auth_client", (str, type(None)))
        welcome = self._fanout.connection_message("welcome")
        welcome["heartbeat"] = self._heartbeat
        if region is not None:  # said back: an agent before regions would not
            welcome["region"] = region
        if auth_client is not None:
            connection.auth_client = validate_name("auth client", auth_client)
            welcome.update(self._credentials.welcome(connection.auth_client))
        connection.reply(welcome)

    def _serve(self, connection: Connection, message: dict[str, Any]) -> None:
        """One request. Every request names a service, and every one answered is answered
        only when the process's identity may read that service: checked here, once for every
        kind of request (:meth:`~sentinel.agent.identities.Identities.require_readable`)."""
        op = message["op"]
        if op == "status":  # the requests that name no service
            connection.reply(self._status(checked(message, "id", int), connection))
            return
        if op == "ping":
            connection.reply(self._ping(checked(message, "id", int)))
            return
        service = validate_name("service", checked(message, "service", str))
        if op == "announce":  # no answer, nothing read: the process's own /clients entry
            self._announce(connection, service, message)
            return
        request = checked(message, "id", int)
        try:
            self._identities.require_readable(connection, service)
            answer = self._answer(connection, op, service, request, message)
        except (ResolutionError, NamespaceNotFound, AccessDenied) as exc:
            answer = error_answer(request, exc)
        except (ZooKeeperUnavailable, KazooException) as exc:  # its session is down
            answer = error_answer(request, translate(exc, "the agent's session"))
        connection.reply(answer)

    def _answer(
        self,
        connection: Connection,
        op: str,
        service: str,
        request: int,
        message: dict[str, Any],
    ) -> dict[str, Any]:
        """The answer to a request whose service the process may read."""
        if op == "follow":
            if connection.auth_client is not None:
                self._credentials.follow(service, connection.auth_client)
            return {"op": "service", "id": request, "service": service}
        key = checked(message, "key", (str, int))  # "partition": a key its map does not hold
        partition = self._sentinel.partition_of(service, key)
        return {"op": "partition", "id": request, "partition": partition}

    def _status(self, request: int, asking: Connection) -> dict[str, Any]:
        """``status``: the session's state and staleness, and every other process connected
        with the services it follows (the asker, ``sentinel agent status``, is not one). Root
        and the agent's own user see every process and service. Another peer sees only the
        services the identity of its hello may read (the read check of its own requests), and
        only the processes following one of them: a process's pid and client id would say
        that something follows what the asker may not read."""
        everything = asking.uid in (0, os.geteuid())
        others = sorted(
            (c for c in self._admission.connected() if c is not asking), key=lambda c: c.pid
        )
        processes = []
        for c in others:
            services = sorted(
                s for s in set(c.followed) if everything or self._identities.may_read(asking, s)
            )
            if services or everything:
                processes.append({"pid": c.pid, "client": c.client, "services": services})
        return {
            "op": "status",
            "id": request,
            "state": self._sentinel.connection_state,
            "staleness": self._sentinel.staleness,
            "processes": processes,
            "regions": [] if self._regions is None else self._regions.status(everything),
            "listeners": dict(self._host.listeners),
        }

    def _ping(self, request: int) -> dict[str, Any]:
        """``ping``: answered once one request on the session has come back (what a process
        times as its round trip to this server's region), else an error saying why."""
        state = self._sentinel.connection_state
        try:
            if state != "connected":  # a request would wait for the connection
                raise ZooKeeperUnavailable(f"the agent's session is {state}")
            self._sentinel.session.zk.exists_async("/").get(timeout=PING_TIMEOUT)
        except ZooKeeperUnavailable as exc:
            return error_answer(request, exc)
        except Exception as exc:  # lost meanwhile, or no answer in time
            return error_answer(
                request, ZooKeeperUnavailable(f"no answer to a ping ({type(exc).__name__})")
            )
        return {"op": "ping", "id": request}

    def _announce(self, connection: Connection, service: str, message: dict[str, Any]) -> None:
        """Keep the process's ``/clients`` record while it is connected: only its own (its
        client id, its pid as the kernel tells it, its auth client, and no credential version
        above what the manager issued), on a session of the identity it proved, so that a
        rotation counts it as it would the process's own."""
        assert connection.client is not None
        if service in self._sentinel.session.cache.unlisted():
            return  # a Curator base path's alone: no credential to rotate, no entry (as direct)
        path = client_path(service, connection.client)
        data = checked(message, "record", str).encode()
        record = ClientRecord.from_bytes(service, connection.client, path, data)
        if record.pid != connection.pid:
            raise ProtocolError(f"a /clients record for pid {record.pid}, sent by {connection.pid}")
        if record.auth_client != connection.auth_client or record.left is not None:
            raise ProtocolError(
                f"a /clients record for auth client {record.auth_client!r}, sent by a process "
                f"of {connection.auth_client!r}"
            )
        if record.auth_version is not None:
            newest = self._credentials.newest_version(service, connection.auth_client)
            if record.auth_version > newest:
                raise ProtocolError(
                    f"a /clients record of credential v{record.auth_version}, above the newest "
                    f"issued for {connection.auth_client!r} (v{newest})"
                )
        self._identities.keep(connection, service, path, data)
