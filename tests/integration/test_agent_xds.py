"""The agent's xDS server against a real ZooKeeper, real grpcio servers (one per instance,
``sentinel.testing.grpcserver``) and a real grpcio client resolving ``xds:///<service>``
through the agent: weights, drains, new instances, partitions, and what a client keeps when
the agent fails.

One agent and one xDS server serve the whole module (gRPC's xDS client is one per process
and reads its bootstrap once, while a channel lives); each test has its own services.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from sentinel import Sentinel
from sentinel.agent.xds import XdsServer
from sentinel.agent.xds_bootstrap import bootstrap_json
from sentinel.testing.grpcserver import WHO, LoopbackGRPCServer

pytestmark = pytest.mark.integration

BOOTSTRAP_ENV = "GRPC_XDS_BOOTSTRAP_CONFIG"


@dataclass
class Host:
    """The module's agent: its session, its xDS server, and a publisher's session."""

    zk: str
    namespace: str
    agent: Sentinel
    xds: XdsServer
    publisher: Sentinel

    def service(self) -> str:
        return f"svc-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def host(zookeeper) -> Iterator[Host]:
    namespace = f"/test-{uuid.uuid4().hex[:12]}"
    publisher = Sentinel(zookeeper.connect_string, "publisher", namespace).start()
    publisher.ensure_namespace()
    agent = Sentinel(
        zookeeper.connect_string, "host-agent", namespace, announce=False, agent=False
    ).start()
    directory = tempfile.mkdtemp(prefix="xds-")
    xds = XdsServer(agent, f"unix:{directory}/xds.sock", send_timeout=2.0).start()
    old = os.environ.get(BOOTSTRAP_ENV)
    os.environ[BOOTSTRAP_ENV] = bootstrap_json(xds.address, "test-process")
    try:
        yield Host(zookeeper.connect_string, namespace, agent, xds, publisher)
    finally:
        if old is None:
            os.environ.pop(BOOTSTRAP_ENV, None)
        else:
            os.environ[BOOTSTRAP_ENV] = old
        xds.stop()
        agent.close()
        publisher.close()
        os.rmdir(directory)


@contextlib.contextmanager
def servers(*names: str) -> Iterator[dict[str, LoopbackGRPCServer]]:
    """One started grpcio server per name."""
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(LoopbackGRPCServer(name)) for name in names}


def calls(channel: grpc.Channel, n: int, metadata=None) -> Counter[str]:
    """Which instance answered each of ``n`` calls."""
    who = channel.unary_unary(WHO)
    return Counter(who(b"", timeout=5, metadata=metadata).decode() for _ in range(n))


def test_a_grpc_client_reaches_an_instance_registered_in_sentinel_through_the_agent(host):
    service = host.service()
    with servers("a") as running:
        host.publisher.register(service, "default", "127.0.0.1", running["a"].port, label="a")
        with grpc.insecure_channel(f"xds:///{service}") as channel:
            assert calls(channel, 3) == {"a": 3}
