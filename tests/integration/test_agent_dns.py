"""The agent's DNS server against a real ZooKeeper, asked with ``dig`` (Debian's dnsutils):
A and SRV answers, truncation and TCP, partitions and keys, eligibility, negative answers,
and what a flood leaves of the agent.

One agent (an in-process DNS server on the agent's session) serves the module; each test has
its own services. The command itself (``sentinel agent --dns``) runs in
test_agent_xds.py's test of ``sentinel agent --xds``, the same process serving both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import dns.message
import pytest

from sentinel import Sentinel
from sentinel.agent.dns.names import Question, name_of, zone_name
from sentinel.agent.dns.server import DnsServer
from sentinel.agent.server import AgentServer
from sentinel.agent.xds import XdsServer
from sentinel.telemetry import AGENT_DNS_ANSWERS, AGENT_DNS_DROPPED, AGENT_DNS_QUERIES
from sentinel.testing.helpers import wait_until
from tests.conftest import sentinel_in_process

pytestmark = pytest.mark.integration

DIG = shutil.which("dig")
needs_dig = pytest.mark.skipif(
    DIG is None, reason="dig is not installed (Debian: apt-get install dnsutils; run.sh does)"
)
if DIG is None:
    print("tests/integration/test_agent_dns.py: dig not found, its dig tests skip")
ZONE = zone_name("sentinel.")
# SRV weight scaled: the heaviest instance 65535, RFC 2782's largest.
HEAVIEST = 65535


# One try of 2 s, no recursion asked, no cookie (see dig()).
ONCE = ("+norec", "+nocookie", "+tries=1", "+time=2")


@dataclass(frozen=True)
class Dig:
    """What ``dig`` printed of one answer: its status, header flags, and the records of
    its answer and additional sections as (name, type, data) rows."""

    status: str
    flags: frozenset[str]
    answer: list[tuple[str, str, str]]
    additional: list[tuple[str, str, str]]

    def data(self, rdtype: str) -> list[str]:
        return [data for _, kind, data in self.answer if kind == rdtype]


def dig(address: str, name: str, rdtype: str = "A", *options: str) -> Dig:
    """``dig @HOST -p PORT NAME TYPE`` (one try, 2 s), parsed."""
    host, _, port = address.rpartition(":")
    result = subprocess.run(
        # No cookie: the same question is the same bytes (after the id) each time, as a
        # poller such as HAProxy sends it, and is answered from the server's encoded answers.
        [DIG, f"@{host}", "-p", port, name, rdtype, *ONCE, *options],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    header = re.search(r"status: (\w+)", result.stdout)
    flags = re.search(r";; flags: ([\w ]*);", result.stdout)
    sections: dict[str, list[tuple[str, str, str]]] = {"ANSWER": [], "ADDITIONAL": []}
    current = None
    for line in result.stdout.splitlines():
        heading = re.match(r";; (\w+) SECTION:", line)
        if heading:
            current = heading.group(1)
        elif line and not line.startswith(";") and current in sections:
            owner, _ttl, _class, kind, data = line.split(None, 4)
            sections[current].append((owner, kind, data))
    return Dig(
        header.group(1) if header else f"no answer: {result.stdout[-300:]}",
        frozenset(flags.group(1).split()) if flags else frozenset(),
        sections["ANSWER"],
        sections["ADDITIONAL"],
    )


@dataclass
class Host:
    zk: str
    namespace: str
    agent: Sentinel
    dns: DnsServer
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
    dns = DnsServer(agent, "127.0.0.1:0").start()
    try:
        yield Host(zookeeper.connect_string, namespace, agent, dns, publisher)
    finally:
        dns.stop()
        agent.close()
        publisher.close()


def settles(probe, expected, within: float = 5.0):
    """``probe()`` once it returns ``expected`` (polled), else its last answer: the agent's
    cache hears of a change a moment after the registry holds it."""
    last = [None]

    def matches() -> bool:
        last[0] = probe()
        return last[0] == expected

    wait_until(matches, within)
    return last[0]


@needs_dig
def test_dig_a_and_srv_answer_every_instance_with_its_port_weight_and_own_target(host):
    """Three instances, two on one address and different ports, weights 1, 2, 5: A lists
    the two addresses once each; SRV one record per instance, weights 1:2:5 with the
    heaviest at 65535 (what HAProxy divides by 256 keeps 1:2:5), each its own target whose
    address is in the additional section."""
    service = host.service()
    for label, address, port, weight in (
        ("a", "127.0.0.1", 8001, 1),
        ("b", "127.0.0.1", 8002, 2),
        ("c", "127.0.0.2", 8003, 5),
    ):
        host.publisher.register(service, "default", address, port, label=label, weight=weight)
    addresses = dig(host.dns.address, f"{service}.sentinel", "A")
    assert addresses.status == "NOERROR" and "aa" in addresses.flags
    assert sorted(addresses.data("A")) == ["127.0.0.1", "127.0.0.2"]
    srv = dig(host.dns.address, f"_{service}._tcp.sentinel", "SRV")
    assert srv.status == "NOERROR"
    records = {}
    for data in srv.data("SRV"):
        priority, weight, port, target = data.split()
        records[int(port)] = (int(priority), int(weight), target)
    assert {port: r[:2] for port, r in records.items()} == {
        8001: (0, round(HEAVIEST / 5)),
        8002: (0, round(2 * HEAVIEST / 5)),
        8003: (0, HEAVIEST),
    }
    by_haproxy = [records[port][1] // 256 for port in (8001, 8002, 8003)]
    assert by_haproxy[0] * 2 == by_haproxy[1] and by_haproxy[0] * 5 == by_haproxy[2]
    targets = {port: r[2] for port, r in records.items()}
    assert len(set(targets.values())) == 3
    additional = {owner: data for owner, kind, data in srv.additional if kind == "A"}
    assert {port: additional[t] for port, t in targets.items()} == {
        8001: "127.0.0.1",
        8002: "127.0.0.1",
        8003: "127.0.0.2",
    }
    # A target resolves on its own too (a client that does not read the additional section).
    assert dig(host.dns.address, targets[8003], "A").data("A") == ["127.0.0.2"]


@needs_dig
def test_an_answer_too_large_for_udp_is_truncated_and_whole_over_tcp(host):
    """40 instances: their SRV answer is over 512 octets. Without EDNS0 the UDP answer has
    TC set; over TCP it holds all 40 (and with EDNS0's 4096 octets over UDP too)."""
    service = host.service()
    for i in range(40):
        host.publisher.register(service, "default", "127.0.0.1", 9000 + i, label=f"i{i}")
    name = f"_{service}._tcp.sentinel"
    truncated = dig(host.dns.address, name, "SRV", "+noedns", "+ignore")
    assert "tc" in truncated.flags and len(truncated.data("SRV")) < 40
    whole = dig(host.dns.address, name, "SRV", "+noedns", "+tcp")
    assert "tc" not in whole.flags
    assert sorted(int(d.split()[2]) for d in whole.data("SRV")) == list(range(9000, 9040))
    assert len(dig(host.dns.address, name, "SRV", "+bufsize=4096").data("SRV")) == 40


@needs_dig
def test_a_tenant_key_resolves_to_its_partition_only(host):
    """A sharded service: ``KEY.key.SERVICE`` answers the instances of the partition the
    shard map maps the key to, and no other partition's; a key DNS cannot hold (upper case)
    in its encoded form; ``PARTITION.SERVICE`` and ``_PARTITION._SERVICE._tcp`` as well; the
    service's bare name none (a sharded service is asked by partition or key)."""
    service, policy = host.service(), f"tenants-{uuid.uuid4().hex[:6]}"
    host.publisher.shard_maps.ensure(policy, "directory", partitions=["p1", "p2"])
    host.publisher.shard_maps.assign(policy, "tenant-a", "p1")
    host.publisher.shard_maps.assign(policy, "Tenant-B", "p2")
    host.publisher.ensure_service(service, shard_policy=policy)
    host.publisher.register(service, "p1", "127.0.0.11", 80, label="x")
    host.publisher.register(service, "p1", "127.0.0.12", 80, label="y")
    host.publisher.register(service, "p2", "127.0.0.21", 80, label="x")
    p1, p2 = ["127.0.0.11", "127.0.0.12"], ["127.0.0.21"]
    assert sorted(dig(host.dns.address, f"tenant-a.key.{service}.sentinel").data("A")) == p1
    encoded = name_of(Question(service, key="Tenant-B"), ZONE).to_text()
    assert encoded.startswith("x--")
    assert dig(host.dns.address, encoded).data("A") == p2
    assert sorted(dig(host.dns.address, f"p1.{service}.sentinel").data("A")) == p1
    srv = dig(host.dns.address, f"_p2._{service}._tcp.sentinel", "SRV")
    assert [d.split()[3] for d in srv.data("SRV")] == [f"x.p2.instance.{service}.sentinel."]
    bare = dig(host.dns.address, f"{service}.sentinel")
    assert (bare.status, bare.answer) == ("NOERROR", [])
    unknown_key = dig(host.dns.address, f"tenant-z.key.{service}.sentinel")
    assert unknown_key.status == "NXDOMAIN"


@needs_dig
def test_drained_and_down_instances_are_never_answered_and_txt_says_why(host):
    """Of three instances, one drained and one down: A and SRV answer the third only, within
    a moment of the change; TXT names each one left out with its status. All of them out:
    an empty NOERROR (the service exists), never NXDOMAIN."""
    service = host.service()
    regs = {
        label: host.publisher.register(service, "default", f"127.0.1.{i}", 80, label=label)
        for i, label in enumerate(("up", "drained", "down"), start=1)
    }
    assert len(dig(host.dns.address, f"{service}.sentinel").data("A")) == 3
    for _ in range(2):  # the second answered as encoded for the first
        assert len(dig(host.dns.address, f"_{service}._tcp.sentinel", "SRV").data("SRV")) == 3
    host.publisher.update_registration(regs["drained"], status="draining")
    host.publisher.update_registration(regs["down"], status="down")
    only = ["127.0.1.1"]
    assert settles(lambda: dig(host.dns.address, f"{service}.sentinel").data("A"), only) == only
    srv = dig(host.dns.address, f"_{service}._tcp.sentinel", "SRV").data("SRV")
    assert [d.split()[3] for d in srv] == [f"up.default.instance.{service}.sentinel."]
    txt = " ".join(dig(host.dns.address, f"{service}.sentinel", "TXT").data("TXT"))
    assert "default:drained 127.0.1.2:80 not answered: status draining" in txt
    assert "default:down 127.0.1.3:80 not answered: status down" in txt
    host.publisher.update_registration(regs["up"], status="draining")
    empty = settles(
        lambda: (lambda d: (d.status, d.answer))(dig(host.dns.address, f"{service}.sentinel")),
        ("NOERROR", []),
    )
    assert empty == ("NOERROR", [])


@needs_dig
def test_nxdomain_for_no_service_refused_outside_the_zone_and_a_fresh_agent_never_negative(
    host,
):
    """An unknown service: NXDOMAIN (the zone's SOA, TTL 5, for negative caching); a name
    outside the zone: REFUSED (no recursion); a name that is no form: NXDOMAIN. A new
    agent's first query of a service it has not loaded waits for the load and is answered
    with the instances, never a negative answer first."""
    unknown = dig(host.dns.address, f"{host.service()}.sentinel")
    assert unknown.status == "NXDOMAIN" and "aa" in unknown.flags
    assert dig(host.dns.address, "example.com").status == "REFUSED"
    assert dig(host.dns.address, "a.b.c.d.e.sentinel").status == "NXDOMAIN"
    service = host.service()
    host.publisher.register(service, "default", "127.0.0.9", 80, label="a")
    with (
        Sentinel(host.zk, "fresh-agent", host.namespace, announce=False, agent=False) as fresh,
        DnsServer(fresh, "127.0.0.1:0") as restarted,
    ):
        first = dig(restarted.address, f"{service}.sentinel")
        assert (first.status, first.data("A")) == ("NOERROR", ["127.0.0.9"])


def test_a_port_another_process_holds_is_refused_with_address_in_use(host):
    """``sentinel agent --dns`` on a taken port: exit 4 (AddressInUse, as --xds), before any
    connection; a wildcard address without --dns-wildcard: exit 2."""
    taken = host.dns.address
    result = sentinel_in_process("agent", "--dns", taken, "--socket", "/nonexistent/a.sock")
    assert result.returncode == 4, result.stderr
    assert "taken by another process" in result.stderr
    result = sentinel_in_process("agent", "--dns", "0.0.0.0:53")
    assert result.returncode == 2 and "--dns-wildcard" in result.stderr


# Packets sent ahead of what the DNS server has read: fewer than its socket's buffer holds.
IN_FLIGHT = 50
# A query whose name is a compression pointer to itself (a loop): with random bytes and
# 2,000 octets, what a peer may send that is no query.
LOOP = bytes.fromhex("1234 0100 0001 0000 0000 0000 c00c 0001 0001".replace(" ", ""))


def test_garbage_and_a_flood_leave_the_agent_serving_a_new_process_within_a_second(host, caplog):
    """10,000 packets that are no query (random bytes, a compression loop, oversized) and
    30,000 queries from one socket, a thousand at a time, at the agent's DNS server
    (in this process, with its socket and its xDS server on the same session: one
    interpreter's time shared): each dropped and counted (the queries over the source's
    rate among them) or answered, never a traceback;
    the log holds a few lines, what the peer sent quoted; then a new process is served by
    the agent's socket and by xDS within a second, and DNS answers a new client."""
    from tests.integration.test_agent_xds import seconds_to_serve

    service = host.service()
    host.publisher.register(service, "default", "127.0.0.1", 9, label="a")
    directory = tempfile.mkdtemp(prefix="dns-flood-")
    reasons = ("malformed", "oversized", "rate", "error")
    before = {reason: AGENT_DNS_DROPPED.labels(reason)._value.get() for reason in reasons}
    answered = AGENT_DNS_ANSWERS.labels("a")._value.get()
    caplog.set_level(logging.INFO)
    with (
        AgentServer(host.agent, f"{directory}/agent.sock"),
        XdsServer(host.agent, f"unix:{directory}/xds.sock") as xds,
    ):
        host.agent.prefetch(service)
        host_name, _, port = host.dns.address.rpartition(":")
        query = bytes.fromhex("abcd 0000 0001 0000 0000 0000".replace(" ", ""))
        query += name_of(Question(service), ZONE).to_wire() + b"\x00\x01\x00\x01"
        caplog.clear()
        target = (host_name, int(port))
        garbage = [(LOOP, os.urandom(40), os.urandom(2000))[i % 3] for i in range(10_000)]
        started = time.monotonic()
        received = AGENT_DNS_QUERIES.labels("udp")
        first = received._value.get()
        sent = 0
        # The garbage from ten sockets, a thousand each (within a source's burst: every
        # packet reaches the parser), then the queries from one.
        with contextlib.ExitStack() as sockets:
            senders = [
                sockets.enter_context(socket.socket(type=socket.SOCK_DGRAM)) for _ in range(11)
            ]
            flood = senders[-1]
            packets = [(senders[i % 10], g) for i, g in enumerate(garbage)]
            for sender, packet in [*packets, *[(flood, query)] * 30_000]:
                # At most IN_FLIGHT ahead of what the server has read (none lost in the
                # kernel's buffer): each packet is counted, received and dropped or answered.
                deadline = time.monotonic() + 10
                while received._value.get() < first + sent - IN_FLIGHT:
                    assert time.monotonic() < deadline, "the server stopped reading"
                    time.sleep(0.0005)
                sender.sendto(packet, target)
                sent += 1
            assert wait_until(lambda: received._value.get() == first + 40_000, 10)
        flooded = time.monotonic() - started
        started = time.monotonic()
        with Sentinel(host.zk, "app", host.namespace, agent=f"{directory}/agent.sock") as app:
            assert app.get_service(service).port == 9
        socket_served = time.monotonic() - started
        xds_served = seconds_to_serve(xds.address, service)
        print(
            f"after the flood: the agent's socket served a new process in "
            f"{socket_served * 1000:.0f} ms, xDS in {xds_served * 1000:.0f} ms"
        )
        assert socket_served < 1.0 and xds_served < 1.0
        assert dig(host.dns.address, f"{service}.sentinel").data("A") == ["127.0.0.1"]
    os.rmdir(directory)
    dropped = {r: AGENT_DNS_DROPPED.labels(r)._value.get() - before[r] for r in reasons}
    answers = AGENT_DNS_ANSWERS.labels("a")._value.get() - answered - 1  # and the dig's
    print(f"in {flooded:.1f} s: dropped {dropped}, answered {answers:.0f}")
    assert dropped["malformed"] == 6667 and dropped["oversized"] == 3333
    assert dropped["error"] == 0
    # Over its rate: the source's burst (2,000) and 1,000 a second, the rest dropped.
    assert dropped["rate"] + answers == 30_000
    assert answers <= 2000 + 1000 * flooded + 1
    records = [r for r in caplog.records if r.name.startswith("sentinel.agent.dns")]
    print(f"the DNS log after the flood: {len(records)} records", *caplog.messages, sep="\n")
    assert not [r for r in records if r.exc_info or r.levelno >= logging.ERROR]
    assert 1 <= len(records) <= 6
    quoted_loop = [r.getMessage() for r in records if LOOP.hex() in r.getMessage()]
    assert len(quoted_loop) <= 1


def test_the_agents_own_failure_drops_the_query_with_one_traceback_in_the_log(
    host, monkeypatch, caplog
):
    """A bug of the agent's answering a query (here: building records raises): each such
    query is dropped and counted as an error, the first logged with its traceback and the
    others in at most a line; the server goes on serving."""
    service = host.service()
    host.publisher.register(service, "default", "127.0.0.1", 9, label="a")
    name = name_of(Question(service), ZONE)
    target = host.dns.address.rpartition(":")

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    errors = AGENT_DNS_DROPPED.labels("error")._value.get()
    caplog.set_level(logging.INFO)
    monkeypatch.setattr("sentinel.agent.dns.answers.records", broken)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        for i in range(200):
            query = dns.message.make_query(name, "A", id=i)
            client.sendto(query.to_wire(), (target[0], int(target[2])))
        assert wait_until(lambda: AGENT_DNS_DROPPED.labels("error")._value.get() >= errors + 200)
    records = [r for r in caplog.records if r.name.startswith("sentinel.agent.dns")]
    assert len([r for r in records if r.exc_info]) <= 1 and 1 <= len(records) <= 2, records
    monkeypatch.undo()
    assert settles(lambda: dig(host.dns.address, f"{service}.sentinel").data("A"), ["127.0.0.1"])
