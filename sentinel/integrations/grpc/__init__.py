"""A ``grpc.Channel`` that resolves every call through a Sentinel client, for gRPC Python
without the host agent's xDS.

Install with the ``grpc`` extra (from a checkout: ``pip install -e '.[grpc]'``)::

    with SentinelChannel(sentinel, "billing") as channel:
        stub = billing_pb2_grpc.InvoicesStub(channel)  # any generated stub takes it
        stub.Get(request, metadata=[("x-sentinel-key", "acme")])

gRPC Python has no pluggable name resolver, so the channel does the resolving itself: each call
asks ``get_service(service, key, policy, balancer)`` for an endpoint (a warm-cache lookup, no
I/O) and is made on a plain ``grpcio`` channel to that endpoint. The shard key is the call's
metadata ``x-sentinel-key`` (not forwarded), else the channel's ``key``. One ``grpcio`` channel
is kept per endpoint address and reused across changes (a weight, a status, a metric); the
channel of an instance that left the registry is closed once its calls in flight have ended,
on a thread of this channel's own, never on the cache's. At most ``max_channels`` are kept;
past that the least recently opened idle ones are closed.

Each outcome is reported as the httpx transport reports it
(:class:`sentinel.integrations.retry.Route`): an answer, whatever its status but those of
``failure_codes``, with the call's latency when it has one response (a stream's time is the
caller's reading); a status of
``failure_codes`` (by default :data:`FAILURE_CODES`, the statuses Envoy counts as 5xx:
``UNAVAILABLE``, the connection failures among them, ``DEADLINE_EXCEEDED``, ``UNKNOWN``,
``INTERNAL``, ``DATA_LOSS``, ``UNIMPLEMENTED``) as a failure, so that an instance that keeps
failing is ejected from lookups, within the caps of ``docs/health.md``. A call the caller
cancelled is not reported.

A call with no eligible instance raises the :class:`~sentinel.errors.ResolutionError` that
``get_service`` raises (:class:`~sentinel.errors.NoInstanceAvailable`,
:class:`~sentinel.errors.ServiceNotFound`, ...), not a ``grpc.RpcError``: no server was asked,
so there is no gRPC status to give, and an ``UNAVAILABLE`` made up here would look like a
server's answer to code that retries on it, while a missing service or partition is a mistake
no retry mends. The httpx transport does the same.

:class:`AsyncSentinelChannel` is the same on ``grpc.aio`` channels, for stubs used with
``await``.
"""

from sentinel.integrations.grpc.aio import AsyncSentinelChannel
from sentinel.integrations.grpc.channel import SentinelChannel
from sentinel.integrations.grpc.routing import FAILURE_CODES, overall, target

__all__ = ["FAILURE_CODES", "AsyncSentinelChannel", "SentinelChannel", "overall", "target"]
