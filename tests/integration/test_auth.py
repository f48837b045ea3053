"""Credential distribution on a real ZooKeeper: per-client encryption, Procedure 2, ACLs."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from sentinel import Sentinel
from sentinel.auth import ClientKeyring, ManagerKey, acl
from sentinel.auth.backends import FileBackend
from sentinel.auth.config import AuthConfig
from sentinel.auth.manager import Rotation, live_versions
from sentinel.errors import AccessDenied, ClientKeyNotFound, RotationFailed, ValidationError
from sentinel.events import AuthChanged
from sentinel.registry.layout import auth_path
from sentinel.testing.helpers import expire_session, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper
from tests.conftest import sentinel_in_process
from tests.integration.recorder import Recorder

pytestmark = pytest.mark.integration
SERVICE = "billing-db"


@pytest.fixture
def manager(make_client):
    client = make_client("auth-manager", announce=False)
    client.ensure_service(SERVICE, scheme="postgresql")
    client.register(SERVICE, "p1", "10.0.0.5", 5432, scheme="postgresql", label="r1")
    return client


def auth_of(client: Sentinel):
    return client.get_service(SERVICE).auth


def wait_for_version(client: Sentinel, version: int, timeout: float = 10.0) -> None:
    def reached() -> bool:
        auth = auth_of(client)
        return auth is not None and auth.version == version

    assert wait_until(reached, timeout) is not None, f"{client.client_id} has {auth_of(client)!r}"


def test_each_client_gets_its_own_credential_and_cannot_read_another(manager, make_client, raw_zk):
    alice = make_client("alice", auth=AuthConfig(keys=ClientKeyring.generate()))
    bob = make_client("bob", auth=AuthConfig(keys=ClientKeyring.generate()))
    assert auth_of(alice) is None and auth_of(bob) is None
    manager.credentials.publish(SERVICE, "alice", {"user": "alice", "password": "a-secret"})
    manager.credentials.publish(SERVICE, "bob", {"user": "bob", "password": "b-secret"})
    wait_for_version(alice, 1)
    wait_for_version(bob, 1)
    assert dict(auth_of(alice)) == {"user": "alice", "password": "a-secret"}
    assert dict(auth_of(bob)) == {"user": "bob", "password": "b-secret"}

    # Alice's node copied over Bob's: Bob cannot open it and keeps nothing from it.
    errors_before = bob.cache_stats.auth_errors
    data, _ = raw_zk.get(auth_path(SERVICE, "alice"))
    raw_zk.set(auth_path(SERVICE, "bob"), data)
    # The error is counted while the node is read, before the snapshot without the credential
    # is swapped in: wait for the snapshot, then check the count.
    assert wait_until(lambda: auth_of(bob) is None) is not None, auth_of(bob)
    assert bob.cache_stats.auth_errors > errors_before
    assert "a-secret" not in repr(bob.get_service(SERVICE))


def test_listeners_hear_of_changes_and_the_client_confirms_after_them(manager, make_client):
    client = make_client("worker", auth=AuthConfig(keys=ClientKeyring.generate()))
    client.get_service(SERVICE)
    heard = Recorder()
    client.listen(SERVICE, heard)
    manager.credentials.publish(SERVICE, "worker", {"user": "w", "password": "one"})
    event = heard.wait(lambda e: isinstance(e, AuthChanged))
    assert (event.old_version, event.new_version) == (None, 1)
    assert event.credential["password"] == "one"
    manager.credentials.publish(SERVICE, "worker", {"user": "w", "password": "two"})
    event = heard.wait(lambda e: isinstance(e, AuthChanged) and e.new_version == 2)
    assert event.old_version == 1


def test_unknown_client_key_refused_before_writing(manager, raw_zk):
    with pytest.raises(ClientKeyNotFound, match="nobody"):
        manager.credentials.publish(SERVICE, "nobody", {"user": "x", "password": "y"})
    with pytest.raises(ValidationError):
        manager.credentials.publish(SERVICE, "nobody", {"password": ["not", "text"]})
    assert raw_zk.exists(auth_path(SERVICE, "nobody")) is None


def test_signed_credentials_only(manager, make_client):
    signing_key = ManagerKey.generate()
    strict = make_client(
        "strict",
        auth=AuthConfig(keys=ClientKeyring.generate(), signer=signing_key.public_text),
    )
    strict.get_service(SERVICE)
    manager.credentials.publish(SERVICE, "strict", {"user": "s", "password": "unsigned"})
    assert wait_until(lambda: strict.cache_stats.auth_errors >= 1) is not None
    assert auth_of(strict) is None
    manager.credentials.publish(
        SERVICE, "strict", {"user": "s", "password": "signed"}, signer=signing_key
    )
    wait_for_version(strict, 2)
    assert auth_of(strict)["password"] == "signed"


def test_credential_survives_session_expiry(manager, make_client):
    client = make_client("durable", auth=AuthConfig(keys=ClientKeyring.generate()))
    manager.credentials.publish(SERVICE, "durable", {"user": "d", "password": "p1"})
    wait_for_version(client, 1)
    expire_session(client)
    manager.credentials.publish(SERVICE, "durable", {"user": "d", "password": "p2"})
    wait_for_version(client, 2, timeout=20)


def test_rotation_waits_for_every_live_client(manager, make_client, tmp_path):
    backend = FileBackend(tmp_path / "credentials.json")
    clients = {
        name: make_client(name, auth=AuthConfig(keys=ClientKeyring.generate()))
        for name in ("api", "batch")
    }
    for name, client in clients.items():
        manager.credentials.publish(SERVICE, name, backend.create(SERVICE, name, 1))
        wait_for_version(client, 1)
    old = {name: dict(auth_of(c)) for name, c in clients.items()}

    # The batch client's application is slow to rebuild its pool: it holds the listener.
    entered, release = threading.Event(), threading.Event()

    def slow_pool_rebuild(event):
        if isinstance(event, AuthChanged) and event.new_version == 2:
            entered.set()
            release.wait(30)

    clients["batch"].listen(SERVICE, slow_pool_rebuild)
    outcome = {}
    rotating = threading.Thread(
        target=lambda: outcome.update(
            result=manager.credentials.rotate(SERVICE, ["api", "batch"], backend, timeout=30)
        )
    )
    rotating.start()
    assert entered.wait(10), "the batch client never saw the new credential"
    wait_for_version(clients["api"], 2)
    # While one client has not confirmed, the rotation waits and the old credentials live.
    rotating.join(0.5)
    assert rotating.is_alive()
    assert all(backend.accepts(SERVICE, n, old[n]) for n in clients)
    release.set()
    rotating.join(30)
    assert not rotating.is_alive()
    result = outcome["result"]
    assert dict(result.versions) == {"api": 2, "batch": 2}
    assert dict(result.revoked) == {"api": (1,), "batch": (1,)}
    for name, client in clients.items():
        assert not backend.accepts(SERVICE, name, old[name])
        assert backend.accepts(SERVICE, name, auth_of(client))


def test_rotation_times_out_naming_the_laggard_and_keeps_the_old_credential(
    manager, make_client, tmp_path
):
    backend = FileBackend(tmp_path / "credentials.json")
    fast = make_client("fast", auth=AuthConfig(keys=ClientKeyring.generate()))
    paused = make_client("paused", auth=AuthConfig(keys=ClientKeyring.generate()))
    for name, client in (("fast", fast), ("paused", paused)):
        manager.credentials.publish(SERVICE, name, backend.create(SERVICE, name, 1))
        wait_for_version(client, 1)
    old_paused = dict(auth_of(paused))
    release = threading.Event()
    paused.listen(SERVICE, lambda e: isinstance(e, AuthChanged) and release.wait(30))
    try:
        with pytest.raises(RotationFailed) as caught:
            manager.credentials.rotate(SERVICE, ["fast", "paused"], backend, timeout=1.5)
    finally:
        release.set()
    assert caught.value.step == "confirm"
    assert caught.value.laggards == ("paused",)
    assert "paused" in str(caught.value)
    assert backend.accepts(SERVICE, "paused", old_paused)
    # Both versions stay published, so the laggard still holds a valid credential...
    wait_for_version(paused, 2)
    # ...and resuming finishes the job once it has confirmed.
    rotation = Rotation(manager.session.zk, manager.namespace, SERVICE, ["fast", "paused"], backend)
    result = rotation.resume(timeout=10)
    assert result.revoked == {"fast": (1,), "paused": (1,)}
    assert not backend.accepts(SERVICE, "paused", old_paused)


def test_a_failing_backend_leaves_the_old_credential(manager, make_client, tmp_path):
    client = make_client("solo", auth=AuthConfig(keys=ClientKeyring.generate()))
    manager.credentials.publish(SERVICE, "solo", {"user": "solo", "password": "old"})
    wait_for_version(client, 1)

    class Broken:
        def create(self, service, client, version):
            raise ConnectionError("backend down")

        def revoke(self, service, client, version):
            raise AssertionError("nothing was created, nothing to revoke")

    with pytest.raises(RotationFailed) as caught:
        manager.credentials.rotate(SERVICE, "solo", Broken(), timeout=5)
    assert caught.value.step == "create"
    assert "ConnectionError" in str(caught.value)
    assert auth_of(client)["password"] == "old"


def test_a_rotation_failing_for_one_client_keeps_what_it_published_for_another(
    manager, make_client, tmp_path
):
    backend = FileBackend(tmp_path / "credentials.json")
    api = make_client("api", auth=AuthConfig(keys=ClientKeyring.generate()))
    manager.credentials.publish(SERVICE, "api", backend.create(SERVICE, "api", 1))
    wait_for_version(api, 1)
    old = dict(auth_of(api))

    class FailsForFlaky(FileBackend):
        def create(self, service, client, version):
            if client == "flaky":
                raise ConnectionError("backend down")
            return super().create(service, client, version)

    with pytest.raises(RotationFailed) as caught:
        manager.credentials.rotate(
            SERVICE, ["api", "flaky"], FailsForFlaky(backend.path), timeout=5
        )
    assert caught.value.step == "create" and "--resume" in str(caught.value)
    # api may have applied v2 already, and clients never go back a version: so v2 stays
    # published and valid next to v1, as after a confirmation timeout.
    wait_for_version(api, 2)
    assert live_versions(manager.session.zk, SERVICE, "api") == (2, 1)
    assert backend.accepts(SERVICE, "api", auth_of(api)) and backend.accepts(SERVICE, "api", old)
    result = Rotation(manager.session.zk, manager.namespace, SERVICE, ["api"], backend).resume(10)
    assert result.revoked == {"api": (1,)}
    assert not backend.accepts(SERVICE, "api", old)


def test_cli_set_status_and_rotate(manager, make_client, cli_in_process, tmp_path):
    make_client("cli-app", auth=AuthConfig(keys=ClientKeyring.generate())).get_service(SERVICE)
    credential = json.dumps({"user": "cli", "password": "from-stdin"})
    done = cli_in_process(
        "auth", "set", "--service", SERVICE, "--client", "cli-app", "-", input=credential
    )
    assert done.returncode == 0, done.stderr
    assert "from-stdin" not in done.stdout + done.stderr
    store = tmp_path / "creds.json"
    done = cli_in_process(
        "auth", "rotate", "--service", SERVICE, "--option", f"path={store}", "--json"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["versions"] == {"cli-app": 2}
    done = cli_in_process("auth", "status", "--service", SERVICE, "--json")
    [row] = json.loads(done.stdout)
    assert row["client"] == "cli-app" and row["published"] == [2]
    assert row["live"] is True and row["processes"] == {"cli-app": 2}
    bad = cli_in_process("auth", "rotate", "--service", SERVICE, "--backend", "vault")
    assert bad.returncode == 2 and "vault" in bad.stderr


@pytest.mark.slow
def test_acls_keep_each_role_to_its_section(tmp_path: Path):
    identities_file = tmp_path / "identities.json"
    with LocalZooKeeper() as zk:
        done = sentinel_in_process(
            "init", "--zk", zk.connect_string, "--secure", "--identities", str(identities_file)
        )
        assert done.returncode == 0, done.stderr
        identities = json.loads(identities_file.read_text())
        assert identities_file.stat().st_mode & 0o077 == 0
        password = identities["publisher"].split(":", 1)[1]
        assert password not in done.stdout + done.stderr

        hosts = zk.connect_string
        enrolled = sentinel_in_process(
            *("auth", "enroll", "an-app", "--digest", acl.identity_id("an-app:pw").id),
            *("--identities", str(identities_file), "--zk", hosts, "--json"),
        )
        assert enrolled.returncode == 0, enrolled.stderr
        assert json.loads(enrolled.stdout)["changed"] is True
        # A secured namespace requires signed credentials (see test_attacks.py for without).
        signing_key = ManagerKey.generate()
        with (
            Sentinel(hosts, "the-publisher", identity=identities["publisher"]) as publisher,
            Sentinel(
                hosts, "the-manager", identity=identities["auth_manager"], announce=False
            ) as auth_manager,
            Sentinel(
                hosts,
                "an-app",
                auth=AuthConfig(keys=ClientKeyring.generate(), signer=signing_key.public_text),
                identity="an-app:pw",
            ) as app,
        ):
            publisher.register("db", "p1", "10.0.0.1", 5432)
            assert app.get_service("db").port == 5432  # clients read, and add /clients nodes
            with pytest.raises(AccessDenied):
                publisher.credentials.publish(
                    "db", "an-app", {"user": "u", "password": "p"}, signer=signing_key
                )
            with pytest.raises(AccessDenied):
                auth_manager.register("db", "p1", "10.6.6.6", 1)
            with pytest.raises(AccessDenied):
                app.update_metrics("db", "p1", "10.0.0.1_5432", {"lag": 0})
            auth_manager.credentials.publish(
                "db", "an-app", {"user": "u", "password": "p"}, signer=signing_key
            )
            assert wait_until(lambda: app.get_service("db").auth is not None) is not None

        anonymous = KazooClient(hosts=f"{hosts}/sentinel")
        anonymous.start(timeout=10)
        try:
            from kazoo.exceptions import NoAuthError

            with pytest.raises(NoAuthError):
                anonymous.create("/auth/db/an-app-2", b"{}")
            with pytest.raises(NoAuthError):
                anonymous.set("/auth/.keys/an-app", b"{}")  # a client's key is its own
            with pytest.raises(NoAuthError):
                anonymous.create("/auth/.keys/newcomer", b"{}")  # only the admin enrols
        finally:
            anonymous.stop()
            anonymous.close()


def test_processes_sharing_an_auth_client_each_confirm(manager, make_client, tmp_path):
    backend = FileBackend(tmp_path / "credentials.json")
    ring = ClientKeyring.generate()  # one application, one key ring, two processes
    workers = [
        make_client(
            f"etl-{i}",
            auth=AuthConfig(keys=ring, client="etl"),
        )
        for i in (1, 2)
    ]
    manager.credentials.publish(SERVICE, "etl", backend.create(SERVICE, "etl", 1))
    for worker in workers:
        wait_for_version(worker, 1)
    release = threading.Event()
    workers[1].listen(SERVICE, lambda e: isinstance(e, AuthChanged) and release.wait(30))
    try:
        with pytest.raises(RotationFailed) as caught:
            manager.credentials.rotate(SERVICE, "etl", backend, timeout=1.5)
    finally:
        release.set()
    assert caught.value.laggards == ("etl-2",)  # the process, not just the application
    wait_for_version(workers[1], 2)
    result = Rotation(manager.session.zk, manager.namespace, SERVICE, ["etl"], backend).resume(10)
    assert result.revoked == {"etl": (1,)}
    assert all(auth_of(w) == auth_of(workers[0]) for w in workers)


def test_cli_keygen_never_overwrites_a_key_file(cli_in_process, tmp_path):
    ring, manager_key = tmp_path / "app.keys", tmp_path / "manager.key"
    assert cli_in_process("auth", "keygen", "--out", str(ring)).returncode == 0
    assert cli_in_process("auth", "keygen", "--out", str(manager_key), "--manager").returncode == 0
    kept = {p: p.read_bytes() for p in (ring, manager_key)}
    for args in (
        ("--out", str(ring)),
        ("--out", str(manager_key), "--manager"),
        ("--out", str(tmp_path / "new.keys"), "--publish"),  # no --client: nothing written
    ):
        refused = cli_in_process("auth", "keygen", *args)
        assert refused.returncode == 2, refused.stderr
    assert {p: p.read_bytes() for p in kept} == kept
    assert not (tmp_path / "new.keys").exists()
    added = cli_in_process("auth", "keygen", "--out", str(ring), "--add", "--json")
    assert added.returncode == 0 and len(json.loads(added.stdout)["key_ids"]) == 2
    missing = cli_in_process(
        "auth", "set", "--service", SERVICE, "--client", "x", str(tmp_path / "absent")
    )
    assert missing.returncode == 2 and "cannot read the credential file" in missing.stderr


def test_cli_signs_with_the_key_file_the_environment_names_in_a_secured_namespace(
    cli_in_process, make_client, tmp_path, monkeypatch
):
    identities = tmp_path / "identities.json"
    done = cli_in_process("init", "--secure", "--identities", str(identities))
    assert done.returncode == 0, done.stderr
    roles = json.loads(identities.read_text())
    signing_key, key_file = ManagerKey.generate(), tmp_path / "manager.key"
    signing_key.save(key_file)
    publisher = make_client("pub", identity=roles["publisher"], announce=False)
    publisher.ensure_service(SERVICE, scheme="postgresql")
    publisher.register(SERVICE, "p1", "10.0.0.5", 5432, scheme="postgresql", label="r1")
    digest = acl.identity_id("signed-app:pw").id
    enrolled = cli_in_process(
        "auth", "enroll", "signed-app", "--digest", digest, "--identities", str(identities)
    )
    assert enrolled.returncode == 0, enrolled.stderr
    app = make_client(
        "signed-app",
        auth=AuthConfig(keys=ClientKeyring.generate(), signer=signing_key.public_text),
        identity="signed-app:pw",
    )
    app.get_service(SERVICE)
    monkeypatch.setenv("SENTINEL_ZK_IDENTITY", roles["auth_manager"])
    monkeypatch.delenv("SENTINEL_AUTH_SIGNING_KEY_FILE", raising=False)
    credential = json.dumps({"user": "u", "password": "from-the-cli"})
    args = ("auth", "set", "--service", SERVICE, "--client", "signed-app", "-")
    refused = cli_in_process(*args, input=credential)
    assert refused.returncode == 2, refused.stderr
    assert "SENTINEL_AUTH_SIGNING_KEY_FILE" in refused.stderr
    monkeypatch.setenv("SENTINEL_AUTH_SIGNING_KEY_FILE", str(key_file))
    done = cli_in_process(*args, input=credential)
    assert done.returncode == 0, done.stderr
    wait_for_version(app, 1)
    assert auth_of(app)["password"] == "from-the-cli"


@pytest.mark.parametrize("credential", [{"password": 10**400}, {"password": float("inf")}])
def test_credentials_past_the_readers_bounds_are_refused_before_writing(
    manager, make_client, raw_zk, credential
):
    make_client("bounded", auth=AuthConfig(keys=ClientKeyring.generate()))
    with pytest.raises(ValidationError):
        manager.credentials.publish(SERVICE, "bounded", credential)
    assert raw_zk.exists(auth_path(SERVICE, "bounded")) is None
