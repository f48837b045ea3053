"""The last-known-good snapshot: written atomically and rate-limited; served, marked stale,
when no server answers at start; replaced by the re-sync once one does; refused when corrupt
or foreign."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator

import pytest

from sentinel import Sentinel
from sentinel.auth import ClientKeyring
from sentinel.auth.config import AuthConfig
from sentinel.auth.envelope import seal
from sentinel.auth.reader import CredentialReader
from sentinel.auth.store import AuthRecord
from sentinel.cache.config import CacheConfig
from sentinel.cache.snapshot_file import hosts_fingerprint, load_snapshot
from sentinel.errors import EnvelopeError, SnapshotRejected, ZooKeeperUnavailable
from sentinel.private_files import write_private
from sentinel.registry.layout import auth_path
from sentinel.testing.helpers import cached_view, registry_view, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper

pytestmark = [pytest.mark.integration, pytest.mark.faults]


@pytest.fixture(scope="module")
def stoppable() -> Iterator[LocalZooKeeper]:
    """A server of this module's own, since its tests stop it (the session's must stay up);
    one start for the module, and each test works in a namespace of its own."""
    with LocalZooKeeper() as zk:
        yield zk


@pytest.fixture
def server(stoppable: LocalZooKeeper) -> LocalZooKeeper:
    """The module's server, started again when the previous test left it stopped."""
    member = stoppable.members[0]
    if not member.is_running():
        member.restart()
    return stoppable


def _world(writer: Sentinel) -> None:
    writer.shard_maps.create("tenants", "directory", buckets=4)
    writer.ensure_service("db", scheme="postgresql", shard_policy="tenants")
    writer.shard_maps.assign_many("tenants", {"acme": "p1", "globex": "p2"})
    writer.register("db", "p1", "10.0.0.1", 5432, scheme="postgresql", label="a")
    writer.register("db", "p2", "10.0.0.2", 5432, scheme="postgresql", label="b")
    writer.update_metrics("db", "p1", "a", {"lag": 3})


@pytest.mark.slow
def test_a_client_starts_from_its_snapshot_while_zookeeper_is_down(
    server, namespace, tmp_path, caplog
):
    path, zk = tmp_path / "cache.json", server
    # The writer's session outlives the outage, so its instances are still there after it.
    with Sentinel(zk.connect_string, "writer", namespace, session_timeout=30) as writer:
        hosts = zk.connect_string
        with Sentinel(hosts, "app", namespace, cache=CacheConfig(snapshot_path=path)) as app:
            _world(writer)
            assert app.get_service("db", "acme").label == "a"
            assert wait_until(lambda: path.exists() and "globex" in path.read_text())
            before = cached_view(app, "db")
        zk.members[0].stop()

        app = Sentinel(
            hosts, "app", namespace, cache=CacheConfig(snapshot_path=path), connect_timeout=1.0
        )
        with caplog.at_level(logging.WARNING, logger="sentinel.client"):
            app.start()
        try:
            assert "serving the snapshot" in caplog.text
            assert app.connection_state == "snapshot" and app.staleness > 0
            assert app.get_service("db", "acme").label == "a"
            assert app.get_service("db", "globex").label == "b"
            assert app.get_service("db", "acme").metrics == {"lag": 3}
            assert cached_view(app, "db") == before

            zk.members[0].restart()
            assert wait_until(lambda: app.connection_state == "connected", timeout=30)
            assert wait_until(lambda: app.cache_stats.resyncs >= 1, timeout=15)
            # A connection attempt that reached the server while it was still starting waits
            # for its handshake reply as long as kazoo's connect timeout: the session timeout
            # over the number of hosts, 30 s for the writer (seen once in a full CI run).
            assert wait_until(lambda: writer.connection_state == "connected", timeout=45)
            writer.shard_maps.assign("tenants", "acme", "p2")
            assert wait_until(lambda: app.get_service("db", "acme").label == "b", timeout=15)
            assert cached_view(app, "db") == registry_view(writer, "db")
            assert app.staleness == 0.0
            registration = app.register("web", "p1", "10.0.0.3", 80)  # fully started
            assert app.deregister(registration)
        finally:
            app.close()


@pytest.mark.slow
def test_a_client_restarted_from_its_snapshot_refuses_a_replayed_older_credential(
    server, namespace, tmp_path
):
    path, keys = tmp_path / "cache.json", tmp_path / "app.keys"
    ClientKeyring.generate().save(keys)

    def password(client: Sentinel) -> tuple[int, str] | None:
        auth = client.get_service("db", "acme").auth
        return None if auth is None else (auth.version, auth["password"])

    zk = server
    with Sentinel(zk.connect_string, "writer", namespace, session_timeout=30) as writer:
        hosts, node = zk.connect_string, auth_path("db", "app")
        with Sentinel(
            hosts,
            "app",
            namespace,
            cache=CacheConfig(snapshot_path=path),
            auth=AuthConfig(keys=keys),
        ) as app:
            _world(writer)
            writer.credentials.publish("db", "app", {"user": "app", "password": "one"})
            assert wait_until(lambda: password(app) == (1, "one"))
            v1_node, _ = writer.session.zk.get(node)
            writer.credentials.publish("db", "app", {"user": "app", "password": "two"})
            assert wait_until(lambda: password(app) == (2, "two"))
            # FileNotFoundError: not written yet (the writer's first write may come later)
            assert wait_until(
                lambda: '"auth_version":2' in path.read_text(), ignore=(FileNotFoundError,)
            )
        writer.session.zk.set(node, v1_node)  # the replay happens while the app is away
        zk.members[0].stop()

        app = Sentinel(
            hosts,
            "app",
            namespace,
            cache=CacheConfig(snapshot_path=path),
            auth=AuthConfig(keys=keys),
            connect_timeout=1.0,
        )
        app.start()
        try:
            assert app.connection_state == "snapshot"
            assert password(app) == (2, "two")
            zk.members[0].restart()
            assert wait_until(lambda: app.connection_state == "connected", timeout=30)
            assert wait_until(lambda: app.cache_stats.auth_errors >= 1, timeout=15)
            assert password(app) == (2, "two")
        finally:
            app.close()


def test_the_snapshot_floor_holds_without_the_credential(tmp_path):
    """A snapshot whose credential is gone (or unreadable) still carries the version floor."""
    ring = ClientKeyring.generate()
    path = tmp_path / "cache.json"
    write_private(
        path, _snapshot(db={"spec": SPEC, "instances": {}, "metrics": {}, "auth_version": 2})
    )
    reader = CredentialReader(ring, "/sentinel", "app")
    load_snapshot(path, "/sentinel", "127.0.0.1:1", reader)
    assert reader.highest_versions() == {"db": 2}
    envelope = seal(
        {"password": "old"},
        ring.published("app").keys[0],
        namespace="/sentinel",
        service="db",
        client="app",
        version=1,
    )
    replayed = AuthRecord("db", "app", (envelope,)).to_bytes(auth_path("db", "app"))
    credential, errors = reader.newest("db", auth_path("db", "app"), replayed)
    assert credential is None and [type(e) for e in errors] == [EnvelopeError]
    assert "which this client applied already" in str(errors[0])


def test_without_a_snapshot_the_start_fails_as_before(tmp_path, caplog):
    path = tmp_path / "missing.json"
    client = Sentinel(
        "127.0.0.1:1", "app", cache=CacheConfig(snapshot_path=path), connect_timeout=0.5
    )
    with (
        caplog.at_level(logging.WARNING, logger="sentinel.client"),
        pytest.raises(ZooKeeperUnavailable),
    ):
        client.start()
    assert f"snapshot {path} does not exist; not serving it" in caplog.text


def _snapshot(namespace: str = "/sentinel", **services: object) -> bytes:
    """A snapshot document of this format for ``127.0.0.1:1``, with the services given."""
    document = {
        "format": "sentinel-snapshot",
        "version": 1,
        "namespace": namespace,
        "hosts": hosts_fingerprint("127.0.0.1:1"),
        "written_at": 0,
        "shard_maps": {},
        "services": services,
    }
    return json.dumps(document).encode()


SPEC = '{"v":1,"scheme":"http"}'


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{not json", "is unreadable"),
        (b'{"format": "something-else"}', "is not a Sentinel snapshot"),
        (b'{"format": "sentinel-snapshot", "version": 99}', "has version 99"),
        (_snapshot("/other"), "belongs to namespace '/other'"),
        (_snapshot(db={"spec": SPEC, "instances": 7}), "is corrupt"),
        (
            _snapshot(
                db={
                    "spec": SPEC,
                    "instances": {"p1:a": [1, '{"v":1,"host":"h","port":"80"}']},
                    "metrics": {},
                }
            ),
            "is corrupt",
        ),
        # Hostile JSON (issue 16): bounded before parsing, never a raw RecursionError.
        (b"[" * 100_000 + b"]" * 100_000, "is unreadable"),
        (b'{"format": "sentinel-snapshot", "written_at": NaN}', "is unreadable"),
        (b'{"format": "sentinel-snapshot", "written_at": ' + b"9" * 1000 + b"}", "is unreadable"),
        (b'{"format": "sentinel-snapshot", "x": "\xed\xa0\x80"}', "is unreadable"),
        (
            _snapshot(
                db={
                    "spec": SPEC,
                    "instances": {"p1:a": [1, '{"v":1,"weight":1e999}']},
                    "metrics": {},
                }
            ),
            "is corrupt",
        ),
        (_snapshot(db={"spec": "\ud800", "instances": {}, "metrics": {}}), "is corrupt"),
    ],
)
def test_corrupt_or_foreign_snapshots_are_refused_with_the_reason(
    tmp_path, caplog, content, reason
):
    path = tmp_path / "cache.json"
    write_private(path, content)  # private, so only the content is at fault
    with pytest.raises(SnapshotRejected, match=reason):
        load_snapshot(path, "/sentinel", "127.0.0.1:1")
    client = Sentinel(
        "127.0.0.1:1", "app", cache=CacheConfig(snapshot_path=path), connect_timeout=0.5
    )
    with (
        caplog.at_level(logging.WARNING, logger="sentinel.client"),
        pytest.raises(ZooKeeperUnavailable),
    ):
        client.start()
    assert reason in caplog.text and "not serving it" in caplog.text


def test_an_interrupted_write_leaves_the_previous_snapshot(tmp_path, monkeypatch):
    path = tmp_path / "cache.json"
    write_private(path, b"old")

    def crash(_fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        write_private(path, b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["cache.json"], "a temporary file was left behind"


def test_snapshot_writes_are_rate_limited(make_client, tmp_path):
    path = tmp_path / "cache.json"
    writer = make_client("writer")
    app = make_client(
        "app",
        cache=CacheConfig(snapshot_path=path, snapshot_interval=0.5),
    )
    writer.register("api", "p1", "10.0.0.1", 80, label="x0")
    app.prefetch("api")
    started = time.monotonic()
    for i in range(1, 40):  # 39 changes, each applied to the cache by a watch
        writer.register("api", "p1", "10.0.0.1", 80 + i, label=f"x{i}")
    assert wait_until(lambda: len(app.cached_instances("api")) == 40)
    # FileNotFoundError: not written yet (a loaded machine may not have written the prefetch)
    assert wait_until(
        lambda: '"p1:x39"' in path.read_text(), timeout=5, ignore=(FileNotFoundError,)
    )
    elapsed = time.monotonic() - started
    writes = app.session.snapshot_writer.writes
    # One write for the prefetch, then at most one per 0.5 s interval begun while the changes
    # arrived: 2 when they take under 0.5 s (as on a quiet machine), a few more on a slow one.
    # Without the limit each change is a write: 15 or more at a hundredth of the interval.
    limit = 2 + int(elapsed / 0.5)
    assert 1 <= writes <= limit, f"{writes} writes for 40 changes in {elapsed:.2f} s"


@pytest.mark.slow
def test_credentials_are_kept_encrypted_and_served_from_the_snapshot(
    server, namespace, tmp_path, caplog
):
    path, keys = tmp_path / "cache.json", tmp_path / "app.keys"
    ClientKeyring.generate().save(keys)
    hosts = server.connect_string
    with (
        Sentinel(hosts, "writer", namespace) as writer,
        Sentinel(
            hosts,
            "app",
            namespace,
            cache=CacheConfig(snapshot_path=path),
            auth=AuthConfig(keys=keys),
        ) as app,
    ):
        _world(writer)
        writer.credentials.publish("db", "app", {"user": "app", "password": "kept-secret"})
        assert wait_until(lambda: app.get_service("db", "acme").auth is not None)
        assert wait_until(lambda: path.exists() and '"auth":{' in path.read_text())
    server.members[0].stop()
    assert "kept-secret" not in path.read_text()

    app = Sentinel(
        hosts,
        "app",
        namespace,
        cache=CacheConfig(snapshot_path=path),
        auth=AuthConfig(keys=keys),
        connect_timeout=1.0,
    )
    app.start()
    try:
        assert app.connection_state == "snapshot"
        assert dict(app.get_service("db", "acme").auth) == {
            "user": "app",
            "password": "kept-secret",
        }
    finally:
        app.close()

    stranger = Sentinel(
        hosts,
        "app",
        namespace,
        cache=CacheConfig(snapshot_path=path),
        auth=AuthConfig(keys=ClientKeyring.generate()),
        connect_timeout=1,
    )
    with caplog.at_level(logging.WARNING, logger="sentinel.cache.snapshot_file"):
        stranger.start()
    try:  # another key ring serves the locations, not the credential it cannot open
        assert stranger.get_service("db", "acme").label == "a"
        assert stranger.get_service("db", "acme").auth is None
        assert "skipping a credential" in caplog.text
    finally:
        stranger.close()
