"""SentinelChannel (sentinel.integrations.grpc) against real grpcio servers on loopback, each
with the standard health service, registered in a real ZooKeeper: no agent, no xDS."""

from __future__ import annotations

import asyncio
import collections
import math
import re
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from sentinel.balancers.weighted import WeightedRandom

from sentinel.errors import NoInstanceAvailable, ValidationError
from sentinel.integrations.grpc import AsyncSentinelChannel, SentinelChannel
from sentinel.integrations.grpc import channel as sync_channel
from sentinel.registry.layout import instance_path
from sentinel.registry.records import InstanceRecord
from sentinel.testing.grpcserver import WHO, WHO_CHAT, WHO_COUNT, WHO_STREAM, LoopbackGRPCServer
from sentinel.testing.helpers import wait_until
from sentinel.zk.certificates import make_local_pki

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "grpc.md"
# The false-alarm rate of the statistical test: a correct balancer fails it once in a million.
FALSE_ALARM = 1e-6


@pytest.fixture(scope="module")
def servers():
    """Five grpcio servers for the module (a, b, c: one partition; x, y: another); each test
    leaves them as it found them: serving, no failure, no delay."""
    started = {name: LoopbackGRPCServer(name).start() for name in "abcxy"}
    yield started
    for server in started.values():
        server.stop()


@pytest.fixture(autouse=True)
def healthy(servers):
    yield
    for server in servers.values():
        server.fail_with, server.delay = None, 0.0


def register(publisher, service, servers, partition="p1", **kwargs):
    return {
        s.name: publisher.register(service, partition, "127.0.0.1", s.port, label=s.name, **kwargs)
        for s in servers
    }


def endpoint_of(client, service, label):
    return next(e for e in client.cached_instances(service) if e.label == label)


def who(channel, count, **kwargs):
    call = channel.unary_unary(WHO)
    return collections.Counter(call(b"", **kwargs).decode() for _ in range(count))


def test_each_kind_of_call_is_routed_and_the_shard_key_is_not_forwarded(make_client, servers):
    publisher, client = make_client("publisher"), make_client("reader")
    register(publisher, "api", [servers["a"], servers["b"]])
    with SentinelChannel(client, "api") as channel:
        assert who(channel, 4) == {"a": 2, "b": 2}  # round robin
        response, call = channel.unary_unary(WHO).with_call(b"")
        assert response in (b"a", b"b") and call.code() is grpc.StatusCode.OK
        assert channel.unary_unary(WHO).future(b"").result() in (b"a", b"b")
        assert set(channel.unary_stream(WHO_STREAM)(b"2")) <= {b"a", b"b"}
        assert channel.stream_unary(WHO_COUNT)(iter([b"", b"", b""])).endswith(b":3")
        assert channel.stream_unary(WHO_COUNT).future(iter([b""])).result().endswith(b":1")
        assert len(list(channel.stream_stream(WHO_CHAT)(iter([b"", b""])))) == 2
        channel.unary_unary(WHO)(b"", metadata=[("x-sentinel-key", "acme"), ("x-other", "1")])
        seen = [s.metadata for s in (servers["a"], servers["b"])]
        assert any(m.get("x-other") == "1" for m in seen)
        assert not any("x-sentinel-key" in m for m in seen)
        assert channel.open_channels == 2  # one per endpoint, reused by every call
        # A multicallable made per call (a stub per request) reuses the grpcio one.
        for _ in range(50):
            channel.unary_unary(WHO)(b"")
        assert all(len(s.callables) <= 4 for s in channel._pool.values())  # 4 methods used
        # Every call's outcome was reported: both instances have a measured latency.
        assert all(client.feedback.latency(e) is not None for e in client.cached_instances("api"))


def test_calls_are_spread_as_the_weights_say(make_client, servers):
    """1,000 calls through WeightedRandom over weights 1, 2 and 3, judged by Pearson's
    chi-squared test at a false-alarm rate of one in a million (two degrees of freedom: the
    critical value is -2 ln(rate)); calls spread evenly would score over 200."""
    publisher, client = make_client("publisher"), make_client("reader")
    weights = {"a": 1, "b": 2, "c": 3}
    for name, weight in weights.items():
        register(publisher, "api", [servers[name]], weight=weight)
    with SentinelChannel(client, "api", balancer=WeightedRandom()) as channel:
        counts = who(channel, 1000)
    total = sum(weights.values())
    expected = {name: 1000 * weight / total for name, weight in weights.items()}
    chi2 = sum((counts[name] - expected[name]) ** 2 / expected[name] for name in weights)
    assert chi2 < -2 * math.log(FALSE_ALARM), (counts, chi2)


def test_without_a_balancer_the_channel_takes_each_instance_in_turn_whatever_its_weight(
    make_client, servers
):
    """What docs/grpc.md says: the default balancer is round robin, which ignores weights."""
    publisher, client = make_client("publisher"), make_client("reader")
    for name, weight in {"a": 1, "b": 2, "c": 3}.items():
        register(publisher, "api", [servers[name]], weight=weight)
    with SentinelChannel(client, "api") as channel:
        assert who(channel, 30) == dict.fromkeys("abc", 10)


def test_a_drained_instance_gets_no_call_and_a_new_one_gets_calls_within_a_second(
    make_client, servers, cli_in_process
):
    """``sentinel drain``: within 1 s the caller's cache has b draining, and from then on b
    gets none of 50 calls; a new instance answers a call within 1 s of its registration;
    ``sentinel undrain`` brings b back on the channel kept for it."""
    publisher, client = make_client("publisher"), make_client("reader")
    register(publisher, "api", [servers["a"], servers["b"]])
    b = servers["b"]
    with SentinelChannel(client, "api") as channel:
        assert who(channel, 2) == {"a": 1, "b": 1}
        assert cli_in_process("drain", "api", "p1:b").returncode == 0
        assert wait_until(lambda: endpoint_of(client, "api", "b").status == "draining", 1.0)
        before = b.calls
        assert who(channel, 50) == {"a": 50}
        assert b.calls == before
        register(publisher, "api", [servers["c"]])
        assert wait_until(lambda: channel.unary_unary(WHO)(b"") == b"c", 1.0) is not None
        assert cli_in_process("undrain", "api", "p1:b").returncode == 0
        assert wait_until(lambda: channel.unary_unary(WHO)(b"") == b"b", 1.0) is not None
        assert channel.open_channels == 3  # b's channel was kept while it was drained


def test_a_tenant_key_reaches_only_its_partition(make_client, servers):
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.shard_maps.ensure("tenants", "directory", partitions=["p1", "p2"])
    publisher.shard_maps.assign_many("tenants", {"acme": "p1", "globex": "p2"})
    publisher.ensure_service("orders", shard_policy="tenants")
    register(publisher, "orders", [servers["a"], servers["b"]], partition="p1")
    register(publisher, "orders", [servers["x"], servers["y"]], partition="p2")
    with SentinelChannel(client, "orders") as channel:
        assert set(who(channel, 20, metadata=[("x-sentinel-key", "acme")])) == {"a", "b"}
        assert set(who(channel, 20, metadata=[("x-sentinel-key", "globex")])) == {"x", "y"}
    with SentinelChannel(client, "orders", key="globex") as channel:  # the channel's own key
        assert set(who(channel, 20)) == {"x", "y"}
        assert set(who(channel, 20, metadata=[("x-sentinel-key", "acme")])) == {"a", "b"}


def test_failures_fed_back_eject_the_failing_instance(make_client, servers):
    publisher, client = make_client("publisher"), make_client("reader")
    register(publisher, "api", [servers[n] for n in "abc"])
    servers["b"].fail_with = grpc.StatusCode.UNAVAILABLE
    failures = 0
    with SentinelChannel(client, "api") as channel:
        call = channel.unary_unary(WHO)
        for _ in range(30):
            try:
                call(b"")
            except grpc.RpcError as exc:
                assert exc.code() is grpc.StatusCode.UNAVAILABLE  # raised as the server said
                failures += 1
        assert failures == client.feedback.detection.consecutive_failures
        assert client.feedback.is_down(endpoint_of(client, "api", "b"))
        assert set(who(channel, 10)) == {"a", "c"}
        # An application's status (the server answered) is not the instance's failure.
        servers["c"].fail_with = grpc.StatusCode.NOT_FOUND
        codes = collections.Counter()
        for _ in range(10):
            try:
                call(b"")
            except grpc.RpcError as exc:
                codes[exc.code()] += 1
        assert codes == {grpc.StatusCode.NOT_FOUND: 5}
        assert not client.feedback.is_down(endpoint_of(client, "api", "c"))


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNIMPLEMENTED]
)
def test_a_server_error_status_ejects_the_instance_by_default(make_client, servers, code):
    """The statuses Envoy maps to a 5xx count as the instance's failures (FAILURE_CODES)."""
    publisher, client = make_client("publisher"), make_client("reader")
    register(publisher, "api", [servers[n] for n in "abc"])
    servers["b"].fail_with = code
    failed = collections.Counter()
    with SentinelChannel(client, "api") as channel:
        call = channel.unary_unary(WHO)
        for _ in range(30):
            try:
                call(b"")
            except grpc.RpcError as exc:
                failed[exc.code()] += 1
    assert failed == {code: client.feedback.detection.consecutive_failures}
    assert client.feedback.is_down(endpoint_of(client, "api", "b"))


def test_retries_make_an_unavailable_unary_call_again_elsewhere(make_client, servers):
    publisher, client = make_client("publisher"), make_client("reader")
    register(publisher, "api", [servers["a"], servers["b"]])
    servers["b"].fail_with = grpc.StatusCode.UNAVAILABLE
    with SentinelChannel(client, "api", retries=1) as channel:
        assert who(channel, 6) == {"a": 6}  # b's failures were made again on a
        # A stream is never made again: its failure is the caller's.
        servers["a"].fail_with = grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError):
            list(channel.unary_stream(WHO_STREAM)(b"1"))


def test_no_eligible_instance_raises_sentinels_error_and_bad_arguments_are_refused(
    make_client, servers
):
    publisher, client = make_client("publisher"), make_client("reader")
    registrations = register(publisher, "api", [servers["a"]])
    with SentinelChannel(client, "api") as channel:
        assert who(channel, 1) == {"a": 1}
        publisher.update_registration(registrations["a"], status="draining")
        assert wait_until(lambda: endpoint_of(client, "api", "a").status == "draining", 5.0)
        with pytest.raises(NoInstanceAvailable):
            channel.unary_unary(WHO)(b"")
    for bad in ({"retries": -1}, {"max_channels": 0}, {"timeout": 0}, {"key_metadata": "X-K"}):
        with pytest.raises(ValidationError):
            SentinelChannel(client, "api", **bad)


def test_a_garbage_endpoint_and_a_server_that_never_answers_are_failures_not_hangs(
    make_client, servers
):
    """A registry entry whose host names nothing and one whose port has no server fail fast
    with UNAVAILABLE; a server that never answers costs each call its deadline
    (DEADLINE_EXCEEDED). All three are reported until ejected (lookups skip two of them, the
    cap being 30 % of seven), and the answers come from the four good ones."""
    publisher, client = make_client("publisher"), make_client("reader")
    register(publisher, "api", [servers[n] for n in "abcxy"])
    publisher.register("api", "p1", "no-such-host.invalid", 443, label="nowhere")
    publisher.register("api", "p1", "127.0.0.1", 1, label="refused")
    servers["b"].delay = 600.0  # never answers in time; stop() would end it
    with SentinelChannel(client, "api", timeout=0.3) as channel:
        codes = collections.Counter()
        answers = collections.Counter()
        for _ in range(40):
            try:
                answers[channel.unary_unary(WHO)(b"").decode()] += 1
            except grpc.RpcError as exc:
                codes[exc.code()] += 1
        assert set(codes) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
        assert codes[grpc.StatusCode.DEADLINE_EXCEEDED] >= 1
        down = [e.label for e in client.cached_instances("api") if client.feedback.is_down(e)]
        assert sorted(down) == ["b", "nowhere", "refused"]
        assert set(answers) == {"a", "c", "x", "y"} and sum(answers.values()) >= 20


def test_channels_of_departed_instances_are_closed_and_the_pool_is_bounded(
    make_client, raw_zk, monkeypatch
):
    """5,000 distinct endpoints come and go, 100 at a time (one transaction each way); a call
    reaches each while it is registered. Every grpcio channel of an instance that left is
    closed, never more than 100 are open, and max_channels bounds the pool below that."""
    opened: list[grpc.Channel] = []
    real = grpc.insecure_channel

    def recording(*args, **kwargs):
        channel = real(*args, **kwargs)
        opened.append(channel)
        return channel

    monkeypatch.setattr(grpc, "insecure_channel", recording)
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.ensure_service("churn")
    with SentinelChannel(client, "churn", timeout=1.0, max_channels=64) as channel:
        client.prefetch("churn")
        peak = 0
        for round_ in range(50):
            paths = []
            transaction = raw_zk.transaction()
            for n in range(100):
                label = f"r{round_}-{n}"
                path = instance_path("churn", "p1", label)
                # Ports 40000-44999 on 127.0.0.2: nothing listens there, each call fails fast.
                record = InstanceRecord("churn", "p1", label, "127.0.0.2", 40000 + round_ * 100 + n)
                transaction.create(path, record.to_bytes(path))
                paths.append(path)
            assert all(isinstance(r, str) for r in transaction.commit())
            assert wait_until(lambda: len(client.cached_instances("churn")) == 100, 10.0)
            call = channel.unary_unary(WHO)
            for _ in range(100):
                with pytest.raises(grpc.RpcError):
                    call(b"")
            peak = max(peak, channel.open_channels)
            transaction = raw_zk.transaction()
            for path in paths:
                transaction.delete(path)
            assert all(r is True for r in transaction.commit())
            assert wait_until(lambda: channel.open_channels == 0, 10.0)  # departures close
        assert peak <= 64
        assert len(opened) >= 5000 - 50  # about one per endpoint (ejected ones may be skipped)
        assert wait_until(lambda: all(_closed(c) for c in opened), 10.0)


def test_a_call_in_flight_ends_normally_when_its_instance_leaves(make_client, servers):
    """The channel of an instance that left is closed only once its calls ended: a slow call
    started before the deregistration is answered, then the channel is closed."""
    publisher, client = make_client("publisher"), make_client("reader")
    registrations = register(publisher, "api", [servers["a"]])
    servers["a"].delay = 1.0
    with SentinelChannel(client, "api") as channel:
        calls_before = servers["a"].calls
        pending = channel.unary_unary(WHO).future(b"", timeout=30)
        assert wait_until(lambda: servers["a"].calls > calls_before, 10.0)  # it reached a
        publisher.deregister(registrations["a"])
        assert wait_until(lambda: channel.open_channels == 0, 5.0)  # retired at once
        assert pending.result() == b"a"  # not CANCELLED by the departure
        assert pending.code() is grpc.StatusCode.OK


def test_closing_a_channel_never_holds_the_caches_thread(make_client, servers, monkeypatch):
    """Closing is handed to the channel's own thread: with that close stuck, the cache still
    delivers the next change (the close stuck on the cache's thread would stop it)."""
    stuck = threading.Event()
    real_close = sync_channel._close

    def stuck_close(service, subchannel):
        stuck.wait(30)
        real_close(service, subchannel)

    monkeypatch.setattr(sync_channel, "_close", stuck_close)
    publisher, client = make_client("publisher"), make_client("reader")
    registrations = register(publisher, "api", [servers["a"], servers["b"]])
    try:
        with SentinelChannel(client, "api") as channel:
            assert who(channel, 2) == {"a": 1, "b": 1}
            publisher.deregister(registrations["a"])  # a's channel: closing, stuck
            register(publisher, "api", [servers["c"]])
            assert wait_until(lambda: channel.unary_unary(WHO)(b"") == b"c", 5.0) is not None
            stuck.set()
    finally:
        stuck.set()


def _closed(channel: grpc.Channel) -> bool:
    try:
        channel.unary_unary(WHO)(b"", timeout=0.001)
    except ValueError:  # "Cannot invoke RPC on closed channel!"
        return True
    except grpc.RpcError:
        return False
    return False


def _tls_server(tmp_path):
    pki = make_local_pki(tmp_path / "pki")
    key_and_cert = pki.server_keystore.read_bytes()
    split = key_and_cert.index(b"-----BEGIN CERTIFICATE-----")
    server_credentials = grpc.ssl_server_credentials([(key_and_cert[:split], key_and_cert[split:])])
    channel_credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
    return LoopbackGRPCServer("tls", credentials=server_credentials), channel_credentials


def test_tls_by_scheme_or_by_credentials_and_never_in_the_clear_when_asked(
    make_client, servers, tmp_path
):
    """A ``grpcs`` endpoint is dialled with TLS (a plaintext server under that scheme fails:
    nothing is sent in the clear); given credentials, every endpoint is, whatever its scheme."""
    publisher, client = make_client("publisher"), make_client("reader")
    tls_server, credentials = _tls_server(tmp_path)
    with tls_server:
        publisher.register("secure", "p1", "127.0.0.1", tls_server.port, scheme="grpcs")
        publisher.register("plain-scheme", "p1", "127.0.0.1", tls_server.port)
        publisher.register("liar", "p1", "127.0.0.1", servers["a"].port, scheme="grpcs")
        for service in ("secure", "plain-scheme"):
            with SentinelChannel(client, service, credentials=credentials) as channel:
                assert who(channel, 2) == {"tls": 2}
        plaintext_calls = servers["a"].calls
        with SentinelChannel(client, "liar") as channel, pytest.raises(grpc.RpcError) as failed:
            channel.unary_unary(WHO)(b"", timeout=5)
        assert failed.value.code() is grpc.StatusCode.UNAVAILABLE
        assert servers["a"].calls == plaintext_calls and tls_server.calls == 4


def test_subscribe_reports_the_channel_as_a_whole(make_client, servers):
    publisher, client = make_client("publisher"), make_client("reader")
    register(publisher, "api", [servers["a"], servers["b"]])
    states: list[grpc.ChannelConnectivity] = []
    with SentinelChannel(client, "api") as channel:
        channel.subscribe(states.append)
        assert states == [grpc.ChannelConnectivity.IDLE]  # no channel open yet
        channel.unsubscribe(states.append)
        channel.subscribe(states.append, try_to_connect=True)  # dials every eligible endpoint
        assert wait_until(lambda: states[-1] is grpc.ChannelConnectivity.READY, 10.0)
        assert channel.open_channels == 2
        channel.unsubscribe(states.append)
        count = len(states)
        who(channel, 2)
        assert len(states) == count  # no callback once unsubscribed


@pytest.mark.parametrize(
    ("index", "printed"),
    [(0, ["a b a", "a a a a a a", "down:True", "globex->p2"]), (1, ["a b"])],
)
def test_the_documented_examples_run_and_print_what_they_say(index, printed):
    section = DOC.read_text().split("## Without the agent: sentinel.integrations.grpc")[1]
    blocks = re.findall(r"```python\n(.*?)```", section.split("\n## ")[0], re.S)
    assert len(blocks) == 2, "docs/grpc.md: two python examples in the integration's section"
    result = subprocess.run(
        [sys.executable, "-c", blocks[index]], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == printed


def test_the_asyncio_channel_routes_reports_and_follows_the_cache(make_client, servers):
    """AsyncSentinelChannel: every kind of call routed (round robin, the tenant key to its
    partition), UNAVAILABLE answers eject the instance, channel_ready connects, a departed
    instance's channel is closed on the loop; made off a loop, or with retries, it refuses."""
    publisher, client = make_client("publisher"), make_client("reader")
    publisher.shard_maps.ensure("tenants", "directory", partitions=["p1", "p2"])
    publisher.shard_maps.assign_many("tenants", {"acme": "p1", "globex": "p2"})
    publisher.ensure_service("orders", shard_policy="tenants")
    registrations = register(publisher, "orders", [servers[n] for n in "abc"], partition="p1")
    register(publisher, "orders", [servers["x"]], partition="p2")
    client.prefetch("orders")

    async def main():
        async with AsyncSentinelChannel(client, "orders", key="acme") as channel:
            who = channel.unary_unary(WHO)
            assert sorted([(await who(b"")).decode() for _ in range(3)]) == ["a", "b", "c"]
            globex = [("x-sentinel-key", "globex")]
            assert await who(b"", metadata=globex) == b"x"
            assert [r async for r in channel.unary_stream(WHO_STREAM)(b"2", metadata=globex)] == [
                b"x",
                b"x",
            ]
            assert (await channel.stream_unary(WHO_COUNT)(iter([b"", b""]))).endswith(b":2")
            assert len([r async for r in channel.stream_stream(WHO_CHAT)(iter([b""]))]) == 1
            await channel.channel_ready()
            assert channel.get_state() is grpc.ChannelConnectivity.READY
            servers["b"].fail_with = grpc.StatusCode.UNAVAILABLE
            codes = collections.Counter()
            for _ in range(12):
                try:
                    await who(b"")
                except grpc.aio.AioRpcError as exc:
                    codes[exc.code()] += 1
            assert codes == {grpc.StatusCode.UNAVAILABLE: 3}  # then b was ejected
            opened = channel.open_channels
            c_uri = endpoint_of(client, "orders", "c").uri
            c_channel = channel._pool[c_uri].channel
            publisher.deregister(registrations["c"])
            shutdown = grpc.ChannelConnectivity.SHUTDOWN
            while c_uri in channel._pool or c_channel.get_state() is not shutdown:
                await asyncio.sleep(0.01)  # bounded by the wait_for below
        return opened

    opened = asyncio.run(asyncio.wait_for(main(), 30))
    assert opened == 4  # a, b, c and x
    assert client.feedback.is_down(endpoint_of(client, "orders", "b"))
    with pytest.raises(ValidationError):
        AsyncSentinelChannel(client, "orders")  # no running loop

    async def with_retries():
        AsyncSentinelChannel(client, "orders", retries=1)

    with pytest.raises(ValidationError):
        asyncio.run(with_retries())
