"""Real ``grpcio`` servers on loopback, one per instance, for the gRPC integration's tests and
benchmarks and for the agent's xDS tests (install the ``test`` extra: ``grpcio`` and
``grpcio-health-checking``).

Each :class:`LoopbackGRPCServer` serves, with no generated code (bytes in, bytes out through
:func:`grpc.method_handlers_generic_handler`), the service :data:`SERVICE` with four methods,
one of each gRPC kind, all of which say which instance served the call:

=====================  ==========  =====================================================
method                 kind        answer
=====================  ==========  =====================================================
:data:`WHO`            unary       the server's ``name`` (UTF-8)
:data:`WHO_STREAM`     → stream    the name, ``n`` times (``n``: the request as a decimal,
                                   empty means 1)
:data:`WHO_COUNT`      stream →    ``name:<number of request messages>``
:data:`WHO_CHAT`       stream ↔    the name once per request message
=====================  ==========  =====================================================

and the standard health service (``grpc.health.v1.Health``, ``SERVING`` for ``""`` and
:data:`SERVICE` while the server runs; :meth:`LoopbackGRPCServer.set_serving` changes it).

Setting ``fail_with`` to a status code (``grpc.StatusCode.UNAVAILABLE``) makes every call end
with that status, the server still up (an instance whose dependency failed); ``delay`` seconds
pass before each answer, and a ``delay`` longer than the caller's deadline is a server that
never answers in time (:meth:`stop` ends such waits at once). ``calls`` counts the calls that
reached a method, and ``metadata`` holds the invocation metadata of the last one.

::

    with LoopbackGRPCServer("a") as a, grpc.insecure_channel(a.target) as channel:
        who = channel.unary_unary(WHO)
        assert who(b"") == b"a"
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from types import TracebackType

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

#: The full name of the test service.
SERVICE = "sentinel.testing.Who"
WHO = f"/{SERVICE}/Who"
"""The unary method: answers the server's name."""
#: The server-streaming method: answers the name ``n`` times.
WHO_STREAM = f"/{SERVICE}/WhoStream"
#: The client-streaming method: answers ``name:<count of request messages>``.
WHO_COUNT = f"/{SERVICE}/WhoCount"
#: The bidirectional method: answers the name once per request message.
WHO_CHAT = f"/{SERVICE}/WhoChat"


class LoopbackGRPCServer:
    """A ``grpcio`` server on ``127.0.0.1`` (a free port, :attr:`port`) that answers which
    instance it is (see the module's documentation for its methods).

    ``credentials`` (a :func:`grpc.ssl_server_credentials`) serves TLS instead of plain
    HTTP/2. ``delay`` and ``fail_with`` may be set while it serves. ``max_workers`` bounds the
    calls it handles at once. Use it as a context manager, or call :meth:`start` and
    :meth:`stop`.
    """

    def __init__(
        self,
        name: str,
        *,
        delay: float = 0.0,
        fail_with: grpc.StatusCode | None = None,
        credentials: grpc.ServerCredentials | None = None,
        max_workers: int = 8,
    ) -> None:
        self.name = name
        self.delay = delay
        self.fail_with = fail_with
        self.calls = 0
        self.metadata: dict[str, str | bytes] = {}
        self._answer = name.encode()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers, f"grpc-{name}"))
        self._server.add_generic_rpc_handlers((self._handlers(),))
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        address = "127.0.0.1:0"
        if credentials is None:
            self.port: int = self._server.add_insecure_port(address)
        else:
            self.port = self._server.add_secure_port(address, credentials)

    @property
    def target(self) -> str:
        """``127.0.0.1:<port>``, for :func:`grpc.insecure_channel`."""
        return f"127.0.0.1:{self.port}"

    def _handlers(self) -> grpc.GenericRpcHandler:
        def who(request: bytes, context: grpc.ServicerContext) -> bytes:
            self._serve(context)
            return self._answer

        def who_stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            self._serve(context)
            for _ in range(int(request or b"1")):
                yield self._answer

        def who_count(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
            self._serve(context)
            return b"%s:%d" % (self._answer, sum(1 for _ in requests))

        def who_chat(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            self._serve(context)
            for _ in requests:
                yield self._answer

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Who": grpc.unary_unary_rpc_method_handler(who),
                "WhoStream": grpc.unary_stream_rpc_method_handler(who_stream),
                "WhoCount": grpc.stream_unary_rpc_method_handler(who_count),
                "WhoChat": grpc.stream_stream_rpc_method_handler(who_chat),
            },
        )

    def _serve(self, context: grpc.ServicerContext) -> None:
        """What every method does first: count the call, keep its metadata, wait ``delay``,
        and end it with ``fail_with`` when that is set."""
        with self._lock:
            self.calls += 1
            self.metadata = dict(context.invocation_metadata())
        if self.delay:
            self._stopping.wait(self.delay)  # the slowness being simulated; stop() ends it
        failure = self.fail_with
        if failure is not None:
            context.abort(failure, f"{self.name} fails every call ({failure.name})")

    def set_serving(self, serving: bool) -> None:
        """Answer ``SERVING`` (True) or ``NOT_SERVING`` to health checks, for every service."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", SERVICE):
            self.health.set(service, status)

    def start(self) -> LoopbackGRPCServer:
        """Start serving (health ``SERVING``); returns self."""
        self._server.start()
        self.set_serving(True)
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stop serving: close the port, end the calls in progress (after ``grace`` seconds,
        None: at once) and wait until the server has stopped."""
        self._stopping.set()
        self.health.enter_graceful_shutdown()
        self._server.stop(grace).wait()

    def __enter__(self) -> LoopbackGRPCServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = ["WHO", "LoopbackGRPCServer"]
