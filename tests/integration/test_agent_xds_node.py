"""A second gRPC language through the agent: Node's ``@grpc/grpc-js`` with
``@grpc/grpc-js-xds`` (versions pinned in ``tests/peers/node/package-lock.json``), resolving
``xds:///<service>`` with the bootstrap ``sentinel agent --print-xds-bootstrap`` prints, against
real grpcio servers: weights, a drain, a tenant's partition, an agent restarted.

One agent (``test_agent_xds.py``'s ``host`` fixture, started again for this module) and one
Node process serve the module; the process reads a JSON request a line and answers which instance
took each call (``tests/peers/node/xds_client.js``). ``./run.sh test`` installs the packages
when npm is there (``npm ci`` in ``tests/peers/node``); without node or them, the tests skip
saying so.
"""

from __future__ import annotations

import json
import math
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sentinel.telemetry import AGENT_XDS_NACKS
from tests.conftest import sentinel_in_process
from tests.integration import test_agent_xds
from tests.integration.test_agent_xds import BOOTSTRAP_ENV, FALSE_ALARM, chi_square, servers

host = test_agent_xds.host  # the module's agent and publisher, as for the grpcio client
PEER = Path(__file__).resolve().parents[1] / "peers" / "node"
ANSWER_SECONDS = 60  # a request of a few hundred calls, or one waiting out a reconnection


class NodeCallFailed(Exception):
    """A call of the Node client ended with a status (its name: ``code``)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code


class NodeClient:
    """The Node process: ``calls`` sends it a request and waits for its answer."""

    def __init__(self, bootstrap: str) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by close())
        self._process = subprocess.Popen(
            ["node", str(PEER / "xds_client.js")],
            cwd=PEER,
            env={**os.environ, BOOTSTRAP_ENV: bootstrap},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._answers: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._process.stdout:
            self._answers.put(line)
        self._answers.put("")  # the process ended

    def _ask(self, request: dict) -> dict:
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        try:
            line = self._answers.get(timeout=ANSWER_SECONDS)
        except queue.Empty:
            line = ""
        if not line:
            self._stderr.seek(0)
            raise AssertionError(f"the Node client did not answer: {self._stderr.read()}")
        return json.loads(line)

    def calls(
        self, service: str, n: int, partition: str | None = None, deadline: float = 5.0
    ) -> Counter[str]:
        """Which instance answered each of ``n`` calls to ``xds:///service`` (each given
        ``deadline`` seconds)."""
        request = {"op": "calls", "target": f"xds:///{service}", "n": n, "partition": partition}
        answer = self._ask({**request, "deadline": deadline})
        if "error" in answer:
            raise NodeCallFailed(answer["error"]["name"], answer["error"]["details"])
        return Counter(answer["counts"])

    def all_answer(self, service: str, names, partition: str | None = None) -> bool:
        """Poll until every instance of ``names`` has answered (each connected)."""
        seen: Counter[str] = Counter()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            seen.update(self.calls(service, 10, partition))
            if set(names) <= set(seen):
                return True
        return False

    def close(self) -> None:
        self._process.stdin.close()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join()
        self._stderr.close()


def _missing() -> str | None:
    """Why the Node client cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed (Debian: apt-get install nodejs npm)"
    if not (PEER / "node_modules" / "@grpc" / "grpc-js-xds").is_dir():
        return (
            "the Node client's packages are not installed: npm ci in tests/peers/node "
            "(./run.sh test does it when npm is there)"
        )
    return None


MISSING = _missing()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(MISSING is not None, reason=str(MISSING)),  # before the agent starts
]


@pytest.fixture(scope="module")
def node(host) -> Iterator[NodeClient]:
    # The bootstrap as a user copies it: the command's own output.
    printed = sentinel_in_process("agent", "--xds", host.xds.address, "--print-xds-bootstrap")
    assert printed.returncode == 0, printed.stderr
    client = NodeClient(printed.stdout)
    try:
        yield client
    finally:
        client.close()


def test_a_node_client_spreads_calls_as_the_weights_say(host, node):
    """500 calls against the weights 1:2:5, a chi-square test at a false-alarm rate of one in
    a million (critical value 27.6; an equal split scores about 200 on it)."""
    service = host.service()
    weights = {"a": 1.0, "b": 2.0, "c": 5.0}
    with servers(*weights) as running:
        for name, weight in weights.items():
            host.publisher.register(
                service, "default", "127.0.0.1", running[name].port, label=name, weight=weight
            )
        assert node.all_answer(service, weights)
        observed = node.calls(service, 500)
    print(f"Node: 500 calls by weights {weights}: {dict(observed)}")
    critical = -2 * math.log(FALSE_ALARM)
    assert chi_square(observed, weights) < critical, (observed, weights)
    assert chi_square(Counter(dict.fromkeys(weights, 167)), weights) > critical  # it could fail


def test_a_node_client_calls_a_drained_instance_no_more_within_a_second(host, node):
    service = host.service()
    with servers("a", "b") as running:
        for name in running:
            host.publisher.register(service, "default", "127.0.0.1", running[name].port, label=name)
        assert node.all_answer(service, running)
        drain = sentinel_in_process(
            "drain", service, "default:a", "--zk", host.zk, "--namespace", host.namespace
        )
        assert drain.returncode == 0, drain.stderr
        drained_at = time.monotonic()
        # Batches of 20 calls until one reaches no call to a (by chance with a served: one in
        # a million); that must happen within the second.
        while True:
            before = running["a"].calls
            node.calls(service, 20)
            if running["a"].calls == before:
                break
            assert time.monotonic() - drained_at < 1.0, "a still called 1 s after the drain"
        settled = running["a"].calls
        print(f"Node, drained: no call to a after {time.monotonic() - drained_at:.3f} s")
        assert node.calls(service, 200) == {"b": 200}
        assert running["a"].calls == settled


def test_a_node_clients_tenant_calls_reach_only_its_partition(host, node):
    service, policy = host.service(), f"tenants-{uuid.uuid4().hex[:6]}"
    host.publisher.shard_maps.ensure(policy, "directory", partitions=["p1", "p2"])
    host.publisher.shard_maps.assign(policy, "tenant-a", "p1")
    host.publisher.shard_maps.assign(policy, "tenant-b", "p2")
    host.publisher.ensure_service(service, shard_policy=policy)
    with servers("p1-x", "p1-y", "p2-x") as running:
        for name, server in running.items():
            partition, label = name.split("-")
            host.publisher.register(service, partition, "127.0.0.1", server.port, label=label)
        for tenant, members in (("tenant-a", {"p1-x", "p1-y"}), ("tenant-b", {"p2-x"})):
            partition = host.publisher.partition_of(service, tenant)
            assert node.all_answer(service, members, partition)
            assert set(node.calls(service, 100, partition)) == members
        for partition in (None, "p3"):
            with pytest.raises(NodeCallFailed) as failed:
                node.calls(service, 1, partition)
            assert failed.value.code == "UNAVAILABLE"


def test_a_node_client_keeps_its_endpoints_while_the_agent_restarts(host, node):
    service = host.service()
    with servers("a", "b") as running:
        host.publisher.register(service, "default", "127.0.0.1", running["a"].port, label="a")
        assert node.calls(service, 5) == {"a": 5}
        host.xds.stop()
        assert node.calls(service, 50) == {"a": 50}  # served while no agent answers
        host.restart_xds()
        assert node.calls(service, 50) == {"a": 50}
        host.publisher.register(service, "default", "127.0.0.1", running["b"].port, label="b")
        # The client reconnects with its backoff, then hears of b.
        assert node.all_answer(service, running)


def test_a_node_client_takes_the_agents_not_found_errors_and_keeps_its_other_services(host, node):
    """A name with no service is left out of the listeners, with a NOT_FOUND resource error
    that grpc-js does not read (docs/grpc.md): its calls wait for the name until their
    deadline, the client refuses no response for the error, and its other services are
    served on the same stream."""
    service = host.service()
    nacks = AGENT_XDS_NACKS._value.get()
    with servers("a") as running:
        host.publisher.register(service, "default", "127.0.0.1", running["a"].port, label="a")
        assert node.calls(service, 5) == {"a": 5}
        with pytest.raises(NodeCallFailed) as waited:
            node.calls(f"no-such-{service}", 1, deadline=0.5)
        assert waited.value.code == "DEADLINE_EXCEEDED"
        assert node.calls(service, 5) == {"a": 5}
    assert AGENT_XDS_NACKS._value.get() == nacks
