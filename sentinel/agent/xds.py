"""``sentinel agent --xds``: the agent's cache served as xDS to every gRPC client of the host.

:class:`XdsServer` serves the Aggregated Discovery Service, State of the World
(``envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources``, from
``xds-protos``, on ``grpcio``'s asyncio server), so that a gRPC client in any language with
a bootstrap naming the agent (:func:`~sentinel.agent.xds_bootstrap.bootstrap`) resolves
``xds:///<service>`` from the agent's one ZooKeeper session, with no Sentinel code in it.
What a service is in xDS terms is :mod:`sentinel.agent.xds_resources`.

A service is followed when a client first asks for one of its resources: loaded on a worker
(:meth:`Sentinel.prefetch <sentinel.Sentinel.prefetch>`, which may wait on ZooKeeper), never
on the server's event loop, and served only when everyone may read its node (an xDS client
has no identity to read as). Its changes come from the agent's cache as listener events, on
the cache's worker, which only hands the service's name to the event loop
(:meth:`asyncio.loop.call_soon_threadsafe`): nothing there waits, and no stream is written
from any thread but the loop's. The loop rebuilds the service's resources once per change
and marks each stream following it; a stream sends the latest state of what it follows when
it may write (State of the World needs no backlog: a stream that reads slowly is sent the
newest state, never a queue of old ones), and one that leaves a response unread for
``send_timeout`` seconds is ended (its client reconnects and is sent the current state).

What a client keeps when something fails: a resource is only ever sent from a loaded
snapshot, so the agent's session lost or the agent restarting never sends an empty or
missing resource: the cache keeps serving the last state while its session is down, a
service the agent cannot load yet (ZooKeeper unreachable) is not answered at all (retried
every :data:`RETRY_SECONDS`), and gRPC's xDS client keeps its last resources while its
stream is down or unanswered. Only a service that no longer exists in ZooKeeper is told as
such.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from kazoo.exceptions import KazooException, NoAuthError, NoNodeError
from kazoo.security import Permissions

from sentinel import telemetry
from sentinel.agent import xds_resources as resources
from sentinel.agent.server import prepare_socket_path
from sentinel.agent.xds_bootstrap import check_free, parse_address
from sentinel.agent.xds_resources import CLUSTER, ENDPOINTS, LISTENER, Resources
from sentinel.errors import AccessDenied, SentinelError, ServiceNotFound
from sentinel.events import ChangeEvent, InstancesChanged, ServiceSpecChanged
from sentinel.registry.layout import service_path

if TYPE_CHECKING:
    from sentinel.client import Sentinel

log = logging.getLogger(__name__)

#: Names a stream may follow of one resource type: a process's services (and partitions).
MAX_NAMES = 64
#: Services being loaded at once for xDS clients; more names wait for the next retry.
MAX_LOADING = 64
#: Seconds between retries of services that could not be loaded (ZooKeeper unreachable).
RETRY_SECONDS = 2.0
_LOAD_WORKERS = 4
_MAX_REQUEST_BYTES = 64 * 1024  # MAX_NAMES names of 2 * 129 characters, and the node
_SHORT = {LISTENER: "listener", CLUSTER: "cluster", ENDPOINTS: "endpoints"}


@dataclass(eq=False)
class _Service:
    """One service as the xDS clients see it (the loop's alone)."""

    resources: Resources | None = None  # its latest resources; None: not loaded yet
    absent: bool = False  # it does not exist, or not everyone may read it
    loading: bool = False
    streams: set[_Stream] = field(default_factory=set)  # the streams following it


@dataclass(eq=False)
class _Stream:
    """One client's ADS stream: what it follows, and what it was last sent (the loop's)."""

    subscribed: dict[str, frozenset[str]] = field(default_factory=dict)  # type -> names
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)  # type -> name -> resource
    dirty: set[str] = field(default_factory=set)  # types whose state may have changed
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    nonce: int = 0


class _Refused(Exception):
    """A request the agent does not serve: the stream ends with ``code``."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class XdsServer:
    """Serves the agent's cache (``sentinel``'s) as xDS on ``address`` (``--xds``'s forms,
    :func:`~sentinel.agent.xds_bootstrap.parse_address`).

    ``shared``: users other than root and the agent's may connect (a Unix socket is then made
    0666, else 0600; gRPC's server cannot tell its peers apart, see ``docs/grpc.md``).
    ``send_timeout``: seconds a client may leave a response unread before its stream is
    ended. ``max_streams``: streams served at once (more are refused with
    ``RESOURCE_EXHAUSTED``). ``handshake_timeout``: seconds a connection has to start HTTP/2.
    ``max_connection_age``: seconds after which a client's connection is closed (it
    reconnects and is sent the current state; ``send_timeout`` seconds of grace): what ends
    a connection whose client stopped reading.
    """

    def __init__(
        self,
        sentinel: Sentinel,
        address: str,
        *,
        shared: bool = False,
        send_timeout: float = 30.0,
        max_streams: int = 4096,
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
        self._services: dict[str, _Service] = {}
        self._streams: set[_Stream] = set()
        self._changed: set[str] = set()
        self._version = 0
        self._port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._remove_listener: Any = None
        self._loads = ThreadPoolExecutor(_LOAD_WORKERS, "sentinel-xds-load")
        self._closing = False

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
        # Loads under way end first (each bounded by the cache's load timeout): their results
        # go to the loop, which must still run.
        self._loads.shutdown(wait=True, cancel_futures=True)
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
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(_Servicer(self), server)
        old_umask = os.umask(0o177)  # the socket file: 0600 until opened below
        try:
            self._port = server.add_insecure_port(self._bind)
        finally:
            os.umask(old_umask)
        if self._path is not None and self._shared:
            os.chmod(self._path, 0o666)
        await server.start()
        retry = asyncio.ensure_future(self._retry())
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
        if isinstance(event, InstancesChanged | ServiceSpecChanged) and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended: the server stopped
                self._loop.call_soon_threadsafe(self._note_change, event.service)

    def _note_change(self, service: str) -> None:
        state = self._services.get(service)
        if state is None or state.resources is None:
            return
        if not self._changed:  # one rebuild per turn of the loop, however many changes came
            asyncio.get_running_loop().call_soon(self._rebuild_changed)
        self._changed.add(service)

    def _rebuild_changed(self) -> None:
        changed, self._changed = self._changed, set()
        for service in changed:
            self._publish(service, self.sentinel.session.cache.snapshots.get(service))

    def _publish(self, service: str, snapshot: Any) -> None:
        """Make ``snapshot`` (None: the service is gone) the service's state and mark every
        stream following it."""
        state = self._services.setdefault(service, _Service())
        state.loading = False
        state.absent = snapshot is None
        if snapshot is None:
            state.resources = None  # never served again, even while it is looked for anew
        else:
            try:
                state.resources = resources.build(service, snapshot)
            except Exception:  # the agent's own bug: the clients keep what they were sent
                telemetry.AGENT_XDS_DROPPED.labels("error").inc()
                log.exception("xDS: the resources of %s could not be built", service)
                return
        self._version += 1
        for stream in state.streams:
            stream.dirty.update(resources.TYPES)
            stream.wake.set()

    def _follow(self, stream: _Stream, name: str) -> None:
        service = resources.service_of(name)
        if service is None:
            return
        state = self._services.setdefault(service, _Service())
        state.streams.add(stream)
        if state.resources is None and not state.absent:
            self._load(service, state)

    def _load(self, service: str, state: _Service) -> None:
        if self._closing or state.loading:
            return
        if sum(s.loading for s in self._services.values()) >= MAX_LOADING:
            return
        state.loading = True
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._loads, self._read, service)
        future.add_done_callback(lambda done: self._loaded(service, done))

    def _read(self, service: str) -> Any:
        """On a load worker: the service's snapshot, loaded into the agent's cache; None when
        it does not exist or not everyone may read it. Raises when ZooKeeper cannot say."""
        try:
            self.sentinel.prefetch(service)
            entries, _ = self.sentinel.session.zk.get_acls(service_path(service))
        except (ServiceNotFound, NoNodeError):
            return None
        except (AccessDenied, NoAuthError):  # not even the agent may read it
            entries = []
        if not any(e.perms & Permissions.READ and e.id.scheme == "world" for e in entries):
            log.warning("xDS: %s is not served: not everyone may read it", service)
            return None
        return self.sentinel.session.cache.snapshots.get(service)

    def _loaded(self, service: str, done: asyncio.Future[Any]) -> None:
        state = self._services.get(service)
        if state is None:
            return
        state.loading = False
        if done.cancelled():
            return
        failure = done.exception()
        if failure is not None:  # retried; meanwhile nothing is answered for it
            if not isinstance(failure, SentinelError | KazooException):
                log.error("xDS: loading %s failed", service, exc_info=failure)
            return
        self._publish(service, done.result())

    async def _retry(self) -> None:
        """Load again what could not be loaded; forget what no stream follows any more."""
        while True:
            await asyncio.sleep(RETRY_SECONDS)
            for service, state in list(self._services.items()):
                if not state.streams and state.resources is None:
                    del self._services[service]
                elif state.resources is None and not state.absent:
                    self._load(service, state)
                elif state.absent and state.streams:  # created since? asked again
                    state.absent = False
                    self._load(service, state)

    # --- streams ------------------------------------------------------------------------------

    async def serve_stream(
        self,
        requests: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """One ADS stream: read its requests on a task, and write the latest state of what
        it follows whenever that changed and the client has read the last response."""
        stream = _Stream()
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
                for response in self._responses(stream):
                    try:
                        await asyncio.wait_for(context.write(response), self._send_timeout)
                    except TimeoutError:
                        telemetry.AGENT_XDS_DROPPED.labels("slow").inc()
                        log.info("xDS: a client left a response unread: its stream ends")
                        # No status can follow a message still unsent: the stream is given
                        # up as cancelled (its state here freed, its slot among the streams
                        # too), and its connection closed at its age (max_connection_age).
                        raise asyncio.CancelledError from None
                    type_url = response.type_url
                    telemetry.AGENT_XDS_RESPONSES.labels(_SHORT[type_url]).inc()
        except _Refused as refused:
            telemetry.AGENT_XDS_DROPPED.labels(refused.reason).inc()
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
            for state in self._services.values():
                state.streams.discard(stream)
            telemetry.AGENT_XDS_STREAMS.dec()

    async def _read_requests(
        self, stream: _Stream, requests: AsyncIterator[discovery_pb2.DiscoveryRequest]
    ) -> None:
        async for request in requests:
            type_url = request.type_url
            if type_url not in _SHORT:
                continue  # routes come inline in the listener; anything else is not served
            if request.HasField("error_detail"):
                telemetry.AGENT_XDS_NACKS.inc()
                log.warning(
                    "xDS: a client refused the %s response %s: %s",
                    _SHORT[type_url],
                    request.response_nonce,
                    request.error_detail.message[:500],
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
            stream.subscribed[type_url] = names
            sent = stream.sent.pop(type_url, {})
            if type_url == ENDPOINTS:  # a change of other names is answered in full
                stream.sent[type_url] = {n: r for n, r in sent.items() if n in names}
            for name in names:
                self._follow(stream, name)
            stream.dirty.add(type_url)
            stream.wake.set()

    def _responses(self, stream: _Stream) -> Iterable[discovery_pb2.DiscoveryResponse]:
        """What ``stream`` has not been sent of the latest state. Listeners and clusters: all
        the names it follows in one response (State of the World: a name left out is a
        resource that does not exist), and only once every one of them is known (loaded, or
        known not to exist); endpoints: each changed assignment in a response of its own."""
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
                        yield self._response(stream, type_url, [resource])
            elif stream.sent.get(type_url) != current:
                stream.sent[type_url] = current
                response = self._response(stream, type_url, list(current.values()))
                # A name left out does not exist: said outright, a client need not wait out
                # its resource timer to believe it (docs/grpc.md, "A name with no service").
                missing = sorted(stream.subscribed[type_url] - current.keys())
                response.resource_errors.extend(map(resources.not_found, missing))
                yield response

    def _current(self, stream: _Stream, type_url: str) -> dict[str, Any] | None:
        """The latest resources of ``type_url`` that ``stream`` follows, by name; None while
        a listener or cluster it follows is not known yet (its service not loaded). One over
        its bound is the one last sent, if any: a client never loses a resource for it."""
        current: dict[str, Any] = {}
        for name in sorted(stream.subscribed.get(type_url, ())):
            service = resources.service_of(name)
            state = None if service is None else self._services.get(service)
            if state is None or state.absent:
                continue  # no such service: left out
            if state.resources is None:
                if type_url == ENDPOINTS:
                    continue
                return None
            resource = state.resources.get(type_url, name)
            if resource is None and name in state.resources.oversized:
                resource = stream.sent.get(type_url, {}).get(name)
            if resource is not None:
                current[name] = resource
        return current

    def _response(
        self, stream: _Stream, type_url: str, items: list[Any]
    ) -> discovery_pb2.DiscoveryResponse:
        stream.nonce += 1
        return discovery_pb2.DiscoveryResponse(
            version_info=str(self._version),
            resources=items,
            type_url=type_url,
            nonce=str(stream.nonce),
        )


class _Servicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """The ADS service, State of the World only (Delta is answered UNIMPLEMENTED)."""

    def __init__(self, server: XdsServer) -> None:
        self._server = server

    async def StreamAggregatedResources(  # the protocol's name
        self,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """One client's stream (:meth:`XdsServer.serve_stream`)."""
        await self._server.serve_stream(request_iterator, context)

    async def DeltaAggregatedResources(  # the protocol's name
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> None:
        """Not served: refused at once (gRPC's base class would log an error per call)."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the agent serves State of the World")
