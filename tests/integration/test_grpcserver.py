"""sentinel.testing.grpcserver: the gRPC test servers answer which instance served each kind
of call, serve the standard health service, and fail or stall calls when told to."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sentinel.testing.grpcserver import (
    SERVICE,
    WHO,
    WHO_CHAT,
    WHO_COUNT,
    WHO_STREAM,
    LoopbackGRPCServer,
)

pytestmark = pytest.mark.integration


def test_each_kind_of_call_answers_the_servers_name_and_health_follows_set_serving():
    with LoopbackGRPCServer("a") as a, grpc.insecure_channel(a.target) as channel:
        assert channel.unary_unary(WHO)(b"", metadata=[("x-probe", "1")]) == b"a"
        assert a.metadata["x-probe"] == "1"
        assert list(channel.unary_stream(WHO_STREAM)(b"3")) == [b"a"] * 3
        assert channel.stream_unary(WHO_COUNT)(iter([b"", b""])) == b"a:2"
        assert list(channel.stream_stream(WHO_CHAT)(iter([b"", b""]))) == [b"a"] * 2
        assert a.calls == 4
        check = health_pb2_grpc.HealthStub(channel).Check
        for service in ("", SERVICE):
            request = health_pb2.HealthCheckRequest(service=service)
            assert check(request).status == health_pb2.HealthCheckResponse.SERVING
        a.set_serving(False)
        request = health_pb2.HealthCheckRequest(service=SERVICE)
        assert check(request).status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_fail_with_ends_calls_with_the_status_and_delay_outlasts_the_deadline():
    with LoopbackGRPCServer("a") as a, grpc.insecure_channel(a.target) as channel:
        who = channel.unary_unary(WHO)
        a.fail_with = grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError) as failed:
            who(b"")
        assert failed.value.code() is grpc.StatusCode.UNAVAILABLE
        a.fail_with, a.delay = None, 600.0
        with pytest.raises(grpc.RpcError) as late:
            who(b"", timeout=0.2)
        assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    # stop() ended the stalled handler: the context manager returned without its 600 s.
