"""``sentinel agent --xds``: the agent's cache served as xDS to every gRPC client of the host.

:class:`XdsServer` serves the Aggregated Discovery Service, State of the World
(``envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources``, from
``xds-protos``, on ``grpcio``'s asyncio server), so that a gRPC client in any language with
a bootstrap naming the agent (:func:`~sentinel.agent.xds_bootstrap.bootstrap`) resolves
``xds:///<service>`` from the agent's one ZooKeeper session, with no Sentinel code in it.
What a service is in xDS terms is :mod:`sentinel.agent.xds_resources`.

A service is followed while some stream asks for one of its resources (State of the World: a
request replaces what its stream asked for of that type; a service no stream asks for is
forgotten, never retried): loaded through :class:`~sentinel.agent.loads.Loads` (on a worker,
a few at a time in the order asked, never on the server's event loop), and served only when
everyone may read its node (an xDS client has no identity to read as). What a change of a
stream's names costs is those names, whatever the others follow; each peer (a uid, on
loopback TCP) holds a share of the streams and of the services followed
(:mod:`sentinel.agent.peers`), a message that is not a request ends its stream as
malformed, and what clients send reaches the log quoted and throttled.

A followed service's changes come from the agent's cache as listener events, on the cache's
worker, which only hands the service's name to the event loop
(:meth:`asyncio.loop.call_soon_threadsafe`): nothing there waits, and no stream is written
from any thread but the loop's. The loop rebuilds and serializes the service's resources
once per change (encoding only the localities that changed) and marks each stream following
it; each stream's response is its own few fields' bytes before those shared ones. A stream
sends the latest state of what it follows when it may write (State of the World needs no
backlog: a stream that reads slowly is sent the newest state, never a queue of old ones), and
one that leaves a response unread for ``send_timeout`` seconds is ended (its client
reconnects and is sent the current state).

Which region serves a cluster is what the library's lookups would say: the agent's region
while it has an eligible instance there, else, under the service's failover rule, the first
region of the rule with one, through the agent's own sessions to other regions (those of the
agent server of the same session), home again after the rule's ``return_after``
(:mod:`sentinel.agent.xds_failover`; deciding may wait for a region, and runs on a load
worker).

What a client keeps when something fails: a resource is only ever sent from a loaded
snapshot, so the agent's session lost or the agent restarting never sends an empty or
missing resource: the cache keeps serving the last state while its session is down, a
service the agent cannot load yet (ZooKeeper unreachable) is not answered at all (retried
every :data:`~sentinel.agent.loads.RETRY_SECONDS`), and gRPC's xDS client keeps its last
resources while its stream is down or unanswered. Only a service that no longer exists in
ZooKeeper is told as such.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf.message import DecodeError

from sentinel import telemetry
from sentinel.agent import xds_resources as resources
from sentinel.agent.admission import prepare_socket_path
from sentinel.agent.loads import Loads
from sentinel.agent.peers import Shares, Throttled, loopback_tcp_uid, quoted
from sentinel.agent.xds_bootstrap import check_free, parse_address
from sentinel.agent.xds_failover import Elsewhere, Served
from sentinel.agent.xds_resources import CLUSTER, ENDPOINTS, LISTENER, Resources
from sentinel.errors import SentinelError
from sentinel.events import ChangeEvent, InstancesChanged, ServiceSpecChanged

if TYPE_CHECKING:
    from sentinel.client import Sentinel

log = logging.getLogger(__name__)

#: Names a stream may follow of one resource type: a process's services (and partitions).
MAX_NAMES = 64
#: Services the streams of one peer (a uid; on a Unix socket, every client: gRPC does not
#: name them) follow at once: a host's processes of one user, with room to spare.
MAX_SERVICES_PER_PEER = 1024
_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
_MAX_REQUEST_BYTES = 64 * 1024  # MAX_NAMES names of 2 * 129 characters, and the node
_SHORT = {LISTENER: "listener", CLUSTER: "cluster", ENDPOINTS: "endpoints"}


@dataclass(eq=False)
class _Service:
    """One service as the xDS clients see it (the loop's alone)."""

    resources: Resources | None = None  # its latest resources; None: not loaded yet
    absent: bool = False  # it does not exist, or not everyone may read it
    resolving: bool = False  # which region serves it is being decided on a worker
    stale: bool = False  # it changed meanwhile: decided again once that ends
    streams: set[_Stream] = field(default_factory=set)  # the streams following it
    # peer -> how many of the streams following it are that peer's
    peers: collections.Counter[int | None] = field(default_factory=collections.Counter)


@dataclass(eq=False)
class _Stream:
    """One client's ADS stream: what it follows, and what it was last sent (the loop's)."""

    peer: int | None = None  # its client's uid; None: not told (a Unix socket's client)
    subscribed: dict[str, frozenset[str]] = field(default_factory=dict)  # type -> names
    # service -> how many of the names it follows (of every type) are that service's
    services: collections.Counter[str] = field(default_factory=collections.Counter)
    # type -> name -> the resource last sent, as on the wire (xds_resources.encoded)
    sent: dict[str, dict[str, bytes]] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)  # types whose state may have changed
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    nonce: int = 0


class _Refused(Exception):
    """A request the agent does not serve: the stream ends with ``code``."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class _Malformed:
    """What a stream sent that is not a DiscoveryRequest (its bytes do not parse)."""


_MALFORMED = _Malformed()


def _parse_request(data: bytes) -> discovery_pb2.DiscoveryRequest | _Malformed:
    """A request as its client sent it: the stream's to refuse when it does not parse
    (gRPC's own parse would log a traceback for each such message, as the agent's error)."""
    try:
        return discovery_pb2.DiscoveryRequest.FromString(data)
    except DecodeError:
        return _MALFORMED


class XdsServer:
    """Serves the agent's cache (``sentinel``'s) as xDS on ``address`` (``--xds``'s forms,
    :func:`~sentinel.agent.xds_bootstrap.parse_address`).

    ``shared``: users other than root and the agent's may connect (a Unix socket is then made
    0666, else 0600; gRPC does not name a Unix socket's peers, see ``docs/grpc.md``).
    ``send_timeout``: seconds a client may leave a response unread before its stream is
    ended. ``max_streams``/``max_streams_per_uid``: streams served at once, in all and from
    one peer uid (on loopback TCP, its socket's owner; gRPC does not name a Unix socket's
    peers, which have the total only); more are refused with ``RESOURCE_EXHAUSTED``.
    ``handshake_timeout``: seconds a connection has to start HTTP/2.
    ``max_connection_age``: seconds after which a client's connection is closed (it
    reconnects and is sent the current state; ``send_timeout`` seconds of grace): what ends
    a connection whose client stopped reading.

    The other regions a cluster fails over to are those of the
    :class:`~sentinel.agent.server.AgentServer` serving ``sentinel`` (its ``regions``), the
    same sessions its processes fail over through; without one, every cluster is served from
    ``sentinel``'s region only.
    """

    def __init__(
        self,
        sentinel: Sentinel,
        address: str,
        *,
        shared: bool = False,
        send_timeout: float = 30.0,
        max_streams: int = 4096,
        max_streams_per_uid: int = 1024,
        handshake_timeout: float = 10.0,
        max_connection_age: float = 600.0,
    ) -> None:
        self.sentinel = sentinel
        self._bind, self._path = parse_address(address)
        self._shared = shared
        self._send_timeout = send_timeout
        self._max_streams = max_streams
        self._handshake_timeout = handshake_timeout
        self._max_connection_age = max_connection_age
        self._services: dict[str, _Service] = {}  # the services some stream follows
        self._streams: set[_Stream] = set()
        self._shares = Shares(max_streams, max_streams_per_uid, "xDS streams")
        self._peer_services: collections.Counter[int | None] = collections.Counter()
        self._changed: set[str] = set()
        self._version = 0
        self._port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._remove_listener: Any = None
        self._loads = Loads(sentinel, "xDS", self._publish, log)
        self._closing = False
        # What clients do is logged at most once in a while (their text quoted), never as
        # much as they please: their refusals, and the streams dropped (by reason).
        self._nacks = Throttled(log)
        self._drops: collections.defaultdict[str, Throttled] = collections.defaultdict(
            lambda: Throttled(log)
        )
        # The clusters another region serves, under each service's failover rule, and when
        # they return home: the library's decisions (sentinel.agent.xds_failover).
        self._elsewhere = Elsewhere(sentinel, self._changed_elsewhere, self._wake)

    @property
    def address(self) -> str:
        """Where it listens: ``unix:PATH``, or ``HOST:PORT`` with the port bound."""
        if self._path is not None:
            return self._bind
        return f"{self._bind.rpartition(':')[0]}:{self._port}"

    @property
    def streams(self) -> int:
        """The xDS streams served now."""
        return len(self._streams)

    @property
    def services(self) -> int:
        """The services the xDS streams follow now (each held in the server's tables)."""
        return len(self._services)

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> XdsServer:
        """Listen (a dead agent's socket is replaced, a live one's never) and follow the
        cache's changes; raises what stopped it from listening."""
        if self._path is not None:
            prepare_socket_path(self._path)
        check_free(self._bind)
        self._thread = threading.Thread(target=self._run, name="sentinel-xds", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise SentinelError(f"xDS: cannot serve {self._bind}: {self._failure}")
        self._remove_listener = self.sentinel.listen(None, self._on_change)
        log.info("agent serving xDS on %s", self.address)
        return self

    def stop(self) -> None:
        """End every stream (gRPC clients keep their last resources and reconnect) and stop
        listening."""
        self._closing = True  # no load starts from here
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        # Loads under way end first: their results go to the loop, which must still run.
        self._loads.close()
        self._elsewhere.close()
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # its loop has ended already
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join()
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)

    def __enter__(self) -> XdsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        # The loop is this thread's current one (grpc.aio looks it up), and the tasks left
        # when it ends are cancelled (asyncio.Runner).
        with asyncio.Runner() as runner:
            self._loop = runner.get_loop()
            try:
                runner.run(self._serve())
            except BaseException as exc:  # reported by start(), or logged once it has returned
                if self._ready.is_set():
                    log.exception("xDS: the server's loop failed")
                self._failure = exc
            finally:
                self._ready.set()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", _MAX_REQUEST_BYTES),
                ("grpc.server_handshake_timeout_ms", int(self._handshake_timeout * 1000)),
                ("grpc.max_concurrent_streams", 8),  # a gRPC client opens one ADS stream
                ("grpc.max_connection_age_ms", int(self._max_connection_age * 1000)),
                ("grpc.max_connection_age_grace_ms", int(self._send_timeout * 1000)),
                ("grpc.so_reuseport", 0),  # a second agent on the same port fails to start
            ],
            maximum_concurrent_rpcs=self._max_streams,
        )
        server.add_generic_rpc_handlers((_handlers(self),))
        old_umask = os.umask(0o177)  # the socket file: 0600 until opened below
        try:
            self._port = server.add_insecure_port(self._bind)
        finally:
            os.umask(old_umask)
        if self._path is not None and self._shared:
            os.chmod(self._path, 0o666)
        await server.start()
        retry = asyncio.ensure_future(self._loads.retry_forever())
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            retry.cancel()
            # Each stream ends itself (UNAVAILABLE: its client reconnects), rather than be
            # cancelled under it by the server's stop.
            for stream in self._streams:
                stream.wake.set()
            await server.stop(1.0)

    # --- services: followed on demand, rebuilt on change (the loop's) --------------------------

    def _on_change(self, event: ChangeEvent) -> None:
        """The cache's worker: hand the changed service to the loop. Never waits."""
        if isinstance(event, InstancesChanged | ServiceSpecChanged):
            self._changed_elsewhere(event.service)

    def _changed_elsewhere(self, service: str) -> None:
        """Any thread: ``service`` changed (here, or in a region it fails over to). Never
        waits."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended: the server stopped
                self._loop.call_soon_threadsafe(self._note_change, service)

    def _wake(self, service: str, delay: float) -> None:
        """On the loop: look at ``service`` again in ``delay`` seconds (a hold-down ends)."""
        asyncio.get_running_loop().call_later(delay, self._note_change, service)

    def _note_change(self, service: str) -> None:
        state = self._services.get(service)
        if state is None or (state.resources is None and not state.resolving):
            return
        if not self._changed:  # one rebuild per turn of the loop, however many changes came
            asyncio.get_running_loop().call_soon(self._rebuild_changed)
        self._changed.add(service)

    def _rebuild_changed(self) -> None:
        changed, self._changed = self._changed, set()
        for service in changed:
            self._publish(service, self.sentinel.session.cache.snapshots.get(service))

    def _publish(self, service: str, snapshot: Any) -> None:
        """Make ``snapshot`` (None: the service is gone) the state of a service some stream
        follows, and mark every stream following it; a cluster with nothing eligible here
        is served by another region under the service's rule, once that is decided."""
        state = self._services.get(service)
        if state is None:
            return  # no stream follows it any more
        if snapshot is None:
            self._loads.retry(service)  # created since? asked again at the retry
            if state.absent:
                return  # as it was: nothing to send
            state.absent = True
            state.resources = None  # never served again, even while it is looked for anew
            self._mark(state)
            return
        snapshot = self._elsewhere.apply(service, snapshot)
        if self._elsewhere.failing_over(service, snapshot):
            self._resolve(service, state, snapshot)
        else:
            self._build(service, state, snapshot, {})

    def _resolve(self, service: str, state: _Service, snapshot: Any) -> None:
        """Decide on a load worker which region serves the clusters ``snapshot`` has nothing
        eligible for (a region's first opening, or the service's first load there, waits),
        then serve; a change meanwhile is decided again once that ends."""
        if state.resolving:
            state.stale = True
            return
        if self._closing:
            return
        state.resolving = True
        future = asyncio.get_running_loop().run_in_executor(
            self._loads.executor, self._elsewhere.served, service, snapshot
        )
        future.add_done_callback(functools.partial(self._resolved, service, state, snapshot))

    def _resolved(
        self, service: str, state: _Service, snapshot: Any, done: asyncio.Future[Served]
    ) -> None:
        state.resolving = False
        if self._services.get(service) is not state or done.cancelled():
            return
        if state.stale:
            state.stale = False
            self._publish(service, self.sentinel.session.cache.snapshots.get(service))
            return
        failure = done.exception()
        if failure is not None:  # the agent's own bug: the clients keep what they were sent
            telemetry.AGENT_XDS_DROPPED.labels("error").inc()
            log.error("xDS: which region serves %s failed", service, exc_info=failure)
            return
        self._build(service, state, snapshot, done.result())

    def _build(self, service: str, state: _Service, snapshot: Any, elsewhere: Served) -> None:
        """Serve ``snapshot``'s resources (``elsewhere``: the clusters other regions serve)."""
        try:
            state.resources = resources.build(service, snapshot, elsewhere, state.resources)
        except Exception:  # the agent's own bug: the clients keep what they were sent
            telemetry.AGENT_XDS_DROPPED.labels("error").inc()
            log.exception("xDS: the resources of %s could not be built", service)
            return
        state.absent = False
        self._mark(state)

    def _mark(self, state: _Service) -> None:
        """A new version of ``state``'s resources: every stream following it sends it."""
        self._version += 1
        for stream in state.streams:
            stream.dirty.update(resources.TYPES)
            stream.wake.set()

    def _subscribe(self, stream: _Stream, type_url: str, names: frozenset[str]) -> None:
        """State of the World: ``names`` REPLACE what ``stream`` followed of ``type_url``.
        The names it no longer asks for are unfollowed (a service no stream follows is
        forgotten), then the new ones followed, within its peer's share of services (else
        :class:`_Refused`, the stream's services counted so far freed as it ends). The work
        is the names that changed, whatever the other streams follow."""
        old = stream.subscribed.get(type_url, frozenset())
        stream.subscribed[type_url] = names
        for name in old - names:
            service = resources.service_of(name)
            if service is not None:
                self._unfollow(stream, service)
        added = {s for name in names - old if (s := resources.service_of(name)) is not None}
        new_to_peer = len(
            [
                service
                for service in added
                if (state := self._services.get(service)) is None or not state.peers[stream.peer]
            ]
        )
        if self._peer_services[stream.peer] + new_to_peer > MAX_SERVICES_PER_PEER:
            raise _Refused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "names",
                f"the streams of {_who(stream.peer)} follow at most {MAX_SERVICES_PER_PEER} "
                "services at once",
            )
        for name in names - old:
            service = resources.service_of(name)
            if service is not None:
                self._follow(stream, service)

    def _follow(self, stream: _Stream, service: str) -> None:
        stream.services[service] += 1
        if stream.services[service] > 1:
            return  # followed already, through another of its names
        state = self._services.get(service)
        if state is None:
            state = self._services[service] = _Service()
            self._loads.want(service)
        state.streams.add(stream)
        state.peers[stream.peer] += 1
        if state.peers[stream.peer] == 1:
            self._peer_services[stream.peer] += 1

    def _unfollow(self, stream: _Stream, service: str) -> None:
        stream.services[service] -= 1
        if stream.services[service]:
            return  # still followed through another of its names
        del stream.services[service]
        state = self._services[service]
        state.streams.discard(stream)
        state.peers[stream.peer] -= 1
        if not state.peers[stream.peer]:
            del state.peers[stream.peer]
            self._peer_services[stream.peer] -= 1
            if not self._peer_services[stream.peer]:
                del self._peer_services[stream.peer]
        if not state.streams:  # forgotten: a load under way is ignored when it ends
            del self._services[service]
            self._loads.forget(service)
            self._elsewhere.forget(service)

    # --- streams ------------------------------------------------------------------------------

    async def serve_stream(
        self,
        requests: AsyncIterator[discovery_pb2.DiscoveryRequest | _Malformed],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """One ADS stream, within its peer's share of the streams: read its requests on a
        task, and write the latest state of what it follows whenever that changed and the
        client has read the last response."""
        stream = _Stream(peer=self._peer_of(context))
        refusal = self._shares.take(stream.peer)
        if refusal is not None:
            telemetry.AGENT_XDS_DROPPED.labels("cap").inc()
            self._drops["cap"].warning(
                "xDS: refused a stream of %s: %s", _who(stream.peer), refusal
            )
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"the agent refused this stream: {refusal}"
            )
        self._streams.add(stream)
        telemetry.AGENT_XDS_STREAMS.inc()
        reader = asyncio.ensure_future(self._read_requests(stream, requests))
        try:
            while True:
                woken = asyncio.ensure_future(stream.wake.wait())
                try:
                    await asyncio.wait({reader, woken}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
                if reader.done():
                    reader.result()  # _Refused, or the client's end of the stream
                    return
                if self._stopping is not None and self._stopping.is_set():
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "the agent is stopping")
                stream.wake.clear()
                for type_url, response in self._responses(stream):
                    try:
                        await asyncio.wait_for(context.write(response), self._send_timeout)
                    except TimeoutError:
                        telemetry.AGENT_XDS_DROPPED.labels("slow").inc()
                        self._drops["slow"].warning(
                            "xDS: a client (%s) left a response unread: its stream ends",
                            _who(stream.peer),
                        )
                        # No status can follow a message still unsent: the stream is given
                        # up as cancelled (its state here freed, its slot among the streams
                        # too), and its connection closed at its age (max_connection_age).
                        raise asyncio.CancelledError from None
                    telemetry.AGENT_XDS_RESPONSES.labels(_SHORT[type_url]).inc()
        except _Refused as refused:
            telemetry.AGENT_XDS_DROPPED.labels(refused.reason).inc()
            self._drops[refused.reason].warning(
                "xDS: a stream of %s ended: %s", _who(stream.peer), refused
            )
            await context.abort(refused.code, str(refused))
        except grpc.aio.AbortError:
            raise  # the stream ended above, on purpose
        except Exception:  # the agent's own failure: this stream ends, the others go on
            telemetry.AGENT_XDS_DROPPED.labels("error").inc()
            log.exception("xDS: a stream failed")
            await context.abort(grpc.StatusCode.INTERNAL, "the agent failed serving this stream")
        finally:
            reader.cancel()
            self._streams.discard(stream)
            self._shares.release(stream.peer)
            for service in list(stream.services):
                stream.services[service] = 1  # however many of its names: unfollowed once
                self._unfollow(stream, service)
            telemetry.AGENT_XDS_STREAMS.dec()

    def _peer_of(self, context: grpc.aio.ServicerContext) -> int | None:
        """The uid of the stream's client on loopback TCP (one lookup in the kernel, never
        waiting); None on a Unix socket, whose peer gRPC does not name."""
        return None if self._path is not None else loopback_tcp_uid(context.peer(), self.address)

    async def _read_requests(
        self, stream: _Stream, requests: AsyncIterator[discovery_pb2.DiscoveryRequest | _Malformed]
    ) -> None:
        async for request in requests:
            if isinstance(request, _Malformed):
                raise _Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "malformed",
                    "a message on this stream is not a DiscoveryRequest",
                )
            type_url = request.type_url
            if type_url not in _SHORT:
                continue  # routes come inline in the listener; anything else is not served
            if request.HasField("error_detail"):
                telemetry.AGENT_XDS_NACKS.inc()
                self._nacks.warning(
                    "xDS: a client (%s) refused the %s response %s: %s",
                    _who(stream.peer),
                    _SHORT[type_url],
                    quoted(request.response_nonce),
                    quoted(request.error_detail.message),
                )
            names = frozenset(request.resource_names)
            if len(names) > MAX_NAMES:
                raise _Refused(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "names",
                    f"a stream follows at most {MAX_NAMES} resources of a type",
                )
            if names == stream.subscribed.get(type_url):
                continue  # an acknowledgement, or a refusal: nothing new to send
            self._subscribe(stream, type_url, names)
            sent = stream.sent.pop(type_url, {})
            if type_url == ENDPOINTS:  # a change of other names is answered in full
                stream.sent[type_url] = {n: r for n, r in sent.items() if n in names}
            stream.dirty.add(type_url)
            stream.wake.set()

    def _responses(self, stream: _Stream) -> Iterable[tuple[str, bytes]]:
        """What ``stream`` has not been sent of the latest state, by type, serialized.
        Listeners and clusters: all the names it follows in one response (State of the World:
        a name left out is a resource that does not exist), and only once every one of them
        is known (loaded, or known not to exist); endpoints: each changed assignment in a
        response of its own."""
        for type_url in resources.TYPES:
            if type_url not in stream.dirty or type_url not in stream.subscribed:
                continue
            stream.dirty.discard(type_url)
            current = self._current(stream, type_url)
            if current is None:
                continue
            if type_url == ENDPOINTS:
                sent = stream.sent.setdefault(type_url, {})
                for name, resource in current.items():
                    if sent.get(name) != resource:
                        sent[name] = resource
                        yield type_url, self._response(stream, type_url, [resource])
            elif stream.sent.get(type_url) != current:
                stream.sent[type_url] = current
                # A name left out does not exist: said outright, a client need not wait out
                # its resource timer to believe it (docs/grpc.md, "A name with no service").
                missing = sorted(stream.subscribed[type_url] - current.keys())
                yield type_url, self._response(stream, type_url, list(current.values()), missing)

    def _current(self, stream: _Stream, type_url: str) -> dict[str, bytes] | None:
        """The latest resources of ``type_url`` that ``stream`` follows, by name; None while
        a listener or cluster it follows is not known yet (its service not loaded). One over
        its bound is the one last sent, if any: a client never loses a resource for it."""
        current: dict[str, bytes] = {}
        for name in sorted(stream.subscribed.get(type_url, ())):
            service = resources.service_of(name)
            state = None if service is None else self._services.get(service)
            if state is None or state.absent:
                continue  # no such service: left out
            if state.resources is None:
                if type_url == ENDPOINTS:
                    continue
                return None
            resource = state.resources.wire(type_url, name)
            if resource is None and name in state.resources.oversized:
                resource = stream.sent.get(type_url, {}).get(name)
            if resource is not None:
                current[name] = resource
        return current

    def _response(
        self, stream: _Stream, type_url: str, items: list[bytes], missing: Iterable[str] = ()
    ) -> bytes:
        """A serialized DiscoveryResponse of ``items`` (resources as on the wire, shared by
        every stream sent them: only this response's own fields are encoded here) and a
        not-found error per name ``missing``."""
        stream.nonce += 1
        own = discovery_pb2.DiscoveryResponse(
            version_info=str(self._version),
            type_url=type_url,
            nonce=str(stream.nonce),
            resource_errors=map(resources.not_found, missing),
        )
        return own.SerializeToString() + b"".join(items)


def _who(peer: int | None) -> str:
    return "a client of unknown uid" if peer is None else f"uid {peer}"


def _handlers(server: XdsServer) -> grpc.GenericRpcHandler:
    """The ADS service, State of the World only (Delta is refused as unimplemented), whose
    requests are parsed here (:func:`_parse_request`), not by gRPC."""

    async def delta(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the agent serves State of the World")

    return grpc.method_handlers_generic_handler(
        _SERVICE,
        {
            "StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
                server.serve_stream,
                _parse_request,
                bytes,  # serialized by _response
            ),
            "DeltaAggregatedResources": grpc.stream_stream_rpc_method_handler(delta),
        },
    )
