"""Attacks on a namespace made with ``sentinel init --secure`` (docs/auth.md, threat model).

Each test tries one attack as an anonymous session or as another client's identity, asserts
that ZooKeeper or Sentinel refuses it, and that the victim keeps working.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, make_digest_acl

import sentinel.cache.reads
from sentinel import Sentinel
from sentinel.auth import ClientKeyring, ManagerKey
from sentinel.auth import acl as acls
from sentinel.auth.backends import FileBackend
from sentinel.auth.config import AuthConfig
from sentinel.auth.enrolment import enroll
from sentinel.auth.envelope import seal
from sentinel.auth.manager import Rotation
from sentinel.auth.store import AuthRecord, read_auth, read_public_keys, write_auth
from sentinel.cli import doctor_acls as acl_checks
from sentinel.errors import (
    ClientNotEnrolled,
    KeySlotNotOwned,
    NamespaceNotTrusted,
    RotationFailed,
    SigningRequired,
)
from sentinel.events import AuthChanged
from sentinel.registry.layout import (
    AUTH,
    AUTH_KEYS,
    CLIENTS,
    METRICS,
    SECTIONS,
    SERVICES,
    SHARD_INFO,
    auth_keys_path,
    auth_path,
    client_path,
    service_path,
)
from sentinel.registry.records import MAX_AUTH_VERSION, ServiceSpec
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper

pytestmark = [pytest.mark.integration, pytest.mark.faults]
SERVICE = "billing-db"


@dataclass
class SecuredNamespace:
    """A namespace secured by the CLI, with each role's identity and helpers to act as them."""

    hosts: str
    namespace: str
    identities: dict[str, str]
    identities_file: Path
    signer: ManagerKey
    _closing: list[Callable[[], None]] = field(default_factory=list)

    def kazoo(self, identity: str | None = None) -> KazooClient:
        """A raw kazoo session rooted at the namespace: anonymous, or acting as ``identity``."""
        zk = KazooClient(hosts=f"{self.hosts}{self.namespace}", **acls.client_arguments(identity))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No chroot path exists")
            zk.start(timeout=10)
        self._closing.append(lambda: (zk.stop(), zk.close()))
        return zk

    def sentinel(self, client_id: str, **kwargs: object) -> Sentinel:
        """A started Sentinel client in the namespace (closed at teardown)."""
        kwargs.setdefault("prometheus_registry", None)
        client = Sentinel(self.hosts, client_id, self.namespace, **kwargs).start()
        self._closing.append(client.close)
        return client

    def role(self, role: str, client_id: str | None = None, **kwargs: object) -> Sentinel:
        """A Sentinel client acting as one of the namespace's roles."""
        kwargs.setdefault("announce", False)
        return self.sentinel(client_id or role, identity=self.identities[role], **kwargs)

    def enroll(self, client: str, identity: str) -> None:
        """The admin gives ``client``'s key slot to ``identity`` (sentinel auth enroll)."""
        enroll(self.kazoo(self.identities["admin"]), client, acls.identity_id(identity))

    def app(self, client_id: str, *, signed: bool = True, **kwargs: object) -> Sentinel:
        """An enrolled application client with an identity and a key ring of its own,
        trusting the namespace's manager signing key (unless not ``signed``)."""
        identity = kwargs.setdefault("identity", f"{client_id}:{client_id}-password")
        signer = self.signer.public_text if signed else None
        kwargs.setdefault("auth", AuthConfig(keys=ClientKeyring.generate(), signer=signer))
        self.enroll(client_id, str(identity))
        return self.sentinel(client_id, **kwargs)

    def close(self) -> None:
        for close in reversed(self._closing):
            close()


@pytest.fixture
def secured(
    zookeeper: LocalZooKeeper, namespace: str, cli_in_process, tmp_path: Path
) -> Iterator[SecuredNamespace]:
    identities_file = tmp_path / "identities.json"
    done = cli_in_process("init", "--secure", "--identities", str(identities_file))
    assert done.returncode == 0, done.stderr
    space = secured_namespace(zookeeper, namespace, identities_file)
    yield space
    space.close()


def secured_namespace(
    zookeeper: LocalZooKeeper, namespace: str, identities_file: Path
) -> SecuredNamespace:
    """The namespace `init --secure` made with ``identities_file``, to act in as each role."""
    return SecuredNamespace(
        zookeeper.connect_string,
        namespace,
        json.loads(identities_file.read_text()),
        identities_file,
        ManagerKey.generate(),
    )


@pytest.fixture
def upgrade(
    zookeeper: LocalZooKeeper, namespace: str, cli_in_process, tmp_path: Path
) -> Iterator[SecuredNamespace]:
    """A namespace still open (`sentinel init` without --secure): sessions made with
    ``upgrade.kazoo()`` act in it before the test secures it with the CLI."""
    done = cli_in_process("init")
    assert done.returncode == 0, done.stderr
    identities_file = tmp_path / "identities.json"
    space = SecuredNamespace(
        zookeeper.connect_string, namespace, {}, identities_file, ManagerKey.generate()
    )
    yield space
    space.close()


def secure_with_cli(space: SecuredNamespace, cli_in_process) -> tuple[int, dict]:
    """`sentinel init --secure` as docs/auth.md tells an operator: its exit code and report
    (the space then knows the roles' identities)."""
    done = cli_in_process("init", "--secure", "--identities", str(space.identities_file), "--json")
    space.identities = json.loads(space.identities_file.read_text())
    return done.returncode, json.loads(done.stdout)["acl_nodes"]


def doctor_acls(cli_in_process, *options: str) -> tuple[int, list[dict]]:
    """`sentinel doctor --json`: its exit code and its ACL findings."""
    done = cli_in_process("doctor", "--json", *options)
    return done.returncode, [f for f in json.loads(done.stdout) if f["check"] == "acl"]


@pytest.fixture
def victim(secured: SecuredNamespace) -> Sentinel:
    """billing-api, enrolled, holding signed credential v1 for billing-db."""
    return enrolled_victim(secured)


def enrolled_victim(secured: SecuredNamespace) -> Sentinel:
    """billing-db published at 10.0.0.5:5432 and billing-api enrolled, holding signed
    credential v1 for it."""
    publisher = secured.role("publisher")
    publisher.register(SERVICE, "p1", "10.0.0.5", 5432, scheme="postgresql")
    app = secured.app("billing-api")
    manager = secured.role("auth_manager")
    manager.credentials.publish(SERVICE, "billing-api", CREDENTIAL, signer=secured.signer)
    assert wait_until(lambda: app.get_service(SERVICE).auth is not None) is not None
    return app


CREDENTIAL = {"user": "billing", "password": "v1-secret"}
ANOTHER_CLIENT = "billing-batch:batch-password"


def intruders(secured: SecuredNamespace) -> list[KazooClient]:
    """An anonymous session and one with another (enrolled) client's identity."""
    secured.enroll("billing-batch", ANOTHER_CLIENT)
    return [secured.kazoo(), secured.kazoo(ANOTHER_CLIENT)]


def refused(call: Callable[[], object]) -> bool:
    try:
        call()
    except NoAuthError:
        return True
    return False


def still_works(secured: SecuredNamespace, victim: Sentinel, password: str) -> None:
    """The manager still reaches the victim: a new credential arrives and opens."""
    manager = secured.role("auth_manager", "auth-manager-2")
    version = manager.credentials.publish(
        SERVICE, "billing-api", {"user": "billing", "password": password}, signer=secured.signer
    )

    def arrived() -> bool:
        auth = victim.get_service(SERVICE).auth
        return auth is not None and auth.version == version and auth["password"] == password

    assert wait_until(arrived) is not None


def still_rotates(secured: SecuredNamespace, victim: Sentinel, tmp_path: Path) -> int:
    """A full rotation of the victim's credential completes (create, publish, confirm,
    revoke) and the victim applies the new version; returns it."""
    manager = secured.role("auth_manager", f"rotator-{uuid.uuid4().hex[:6]}")
    backend = FileBackend(tmp_path / f"credentials-{uuid.uuid4().hex[:6]}.json")
    result = manager.credentials.rotate(
        SERVICE, "billing-api", backend, timeout=10, signer=secured.signer
    )
    version = result.versions["billing-api"]
    assert wait_until(lambda: victim.get_service(SERVICE).auth.version == version) is not None
    return version


# --- key slots (enrolment) ------------------------------------------------------------------


def test_squat_a_key_slot(secured: SecuredNamespace):
    for intruder in intruders(secured):
        assert refused(lambda i=intruder: i.create(auth_keys_path("billing-api"), b"{}"))
        assert intruder.exists(auth_keys_path("billing-api")) is None
    publisher = secured.role("publisher")
    publisher.register(SERVICE, "p1", "10.0.0.5", 5432, scheme="postgresql")
    # Not even a real client with an identity claims a slot the admin did not give it.
    with pytest.raises(ClientNotEnrolled):
        secured.sentinel(
            "billing-api",
            identity="billing-api:pw",
            auth=AuthConfig(keys=ClientKeyring.generate(), signer=secured.signer.public_text),
        )
    victim = secured.app("billing-api")  # enrolled by the admin: starts and publishes
    still_works(secured, victim, "after-squat")


def test_replace_a_key_node(secured: SecuredNamespace, victim: Sentinel):
    path = auth_keys_path("billing-api")
    published = secured.kazoo().get(path)[0]
    attacker_keys = ClientKeyring.generate().published("billing-api").to_bytes(path)
    for intruder in intruders(secured):
        assert refused(lambda i=intruder: i.set(path, attacker_keys))
        assert refused(lambda i=intruder: i.delete(path))
        assert refused(lambda i=intruder: i.set_acls(path, list(OPEN_ACL_UNSAFE)))
    assert secured.kazoo().get(path)[0] == published
    still_works(secured, victim, "after-replace")


def test_a_key_slot_the_admin_opened_is_refused_by_the_manager(secured, victim):
    path = auth_keys_path("billing-api")
    admin = secured.kazoo(secured.identities["admin"])
    admin.set_acls(path, list(OPEN_ACL_UNSAFE))  # a mistake: now anyone could swap the keys
    manager = secured.role("auth_manager")
    with pytest.raises(KeySlotNotOwned, match=path):
        manager.credentials.publish(SERVICE, "billing-api", CREDENTIAL, signer=secured.signer)
    assert victim.get_service(SERVICE).auth.version == 1  # nothing was written


def test_a_slot_squatted_before_securing_is_reset(zookeeper, namespace, cli_in_process, tmp_path):
    open_space = KazooClient(hosts=zookeeper.connect_string)
    open_space.start(timeout=10)
    open_space.ensure_path(f"{namespace}{AUTH_KEYS}")
    open_space.chroot = namespace
    try:
        # Before `init --secure` anyone could create the slot, with an ACL of their choice.
        squatter_keys = ClientKeyring.generate().published("billing-api")
        path = auth_keys_path("billing-api")
        open_space.create(path, squatter_keys.to_bytes(path), acl=list(READ_ACL_UNSAFE))
        identities = tmp_path / "identities.json"
        done = cli_in_process("init", "--secure", "--identities", str(identities), "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(done.stdout)["acl_nodes"]
        assert report["reset_key_slots"] == [path] and report["unrepaired"] == []
        assert open_space.get(path)[0] == b""  # the squatter's key is gone
        again = json.loads(
            cli_in_process("init", "--secure", "--identities", str(identities), "--json").stdout
        )
        assert again["acl_nodes"]["changed"] == 0 and again["acl_nodes"]["reset_key_slots"] == []
    finally:
        open_space.stop()
        open_space.close()


# --- /clients -------------------------------------------------------------------------------


def test_set_acls_on_clients(secured: SecuredNamespace, victim: Sentinel):
    for intruder in intruders(secured):
        for path in (CLIENTS, f"{CLIENTS}/{SERVICE}"):
            assert refused(lambda i=intruder, p=path: i.set_acls(p, list(READ_ACL_UNSAFE)))
    newcomer = secured.app("billing-report")
    assert newcomer.get_service(SERVICE).port == 5432
    entry = client_path(SERVICE, "billing-report")
    assert wait_until(lambda: secured.kazoo().exists(entry)) is not None


def test_delete_another_clients_confirmation(secured: SecuredNamespace, victim: Sentinel, tmp_path):
    entry = client_path(SERVICE, "billing-api")
    for intruder in intruders(secured):
        assert refused(lambda i=intruder: i.delete(entry))
    assert secured.kazoo().exists(entry) is not None
    # So a rotation still waits for the victim while its application holds the switch.
    assert held_rotation(secured, victim, tmp_path).laggards == ("billing-api",)


def held_rotation(secured: SecuredNamespace, victim: Sentinel, tmp_path: Path) -> RotationFailed:
    """A rotation of the victim's credential while its application holds the switch (its
    listener blocks): it must time out at ``confirm``."""
    release = threading.Event()
    victim.listen(SERVICE, lambda e: isinstance(e, AuthChanged) and release.wait(30))
    manager = secured.role("auth_manager", f"rotator-{uuid.uuid4().hex[:6]}")
    backend = FileBackend(tmp_path / "credentials.json")
    try:
        with pytest.raises(RotationFailed) as caught:
            manager.credentials.rotate(
                SERVICE, "billing-api", backend, timeout=1.5, signer=secured.signer
            )
    finally:
        release.set()
    assert caught.value.step == "confirm"
    return caught.value


def test_forge_a_confirmation(secured: SecuredNamespace, victim: Sentinel, tmp_path):
    forged = {"client_id": "billing-api-2", "auth_client": "billing-api", "auth_version": 99}
    for name, intruder in zip(("forged-1", "forged-2"), intruders(secured), strict=True):
        path = client_path(SERVICE, name)
        intruder.create(path, json.dumps({**forged, "v": 1}).encode(), ephemeral=True)
    # The forged "already applied" entries did not stand in for the real process ...
    assert held_rotation(secured, victim, tmp_path).laggards == ("billing-api",)
    # ... and forged laggards do not hold a rotation up: it finishes once the victim confirms.
    manager = secured.role("auth_manager", "resumer")
    backend = FileBackend(tmp_path / "credentials.json")
    rotation = Rotation(
        manager.session.zk,
        manager.namespace,
        SERVICE,
        ["billing-api"],
        backend,
        signer=secured.signer,
    )
    assert rotation.resume(10).revoked == {"billing-api": (1,)}


@pytest.mark.parametrize("who", ["impostor", "another client", "the client itself"])
def test_a_confirmation_cannot_move_the_next_version(secured, victim, tmp_path, who):
    identity = {
        "impostor": "billing-api:evil",  # anyone may claim the client's user name
        "another client": ANOTHER_CLIENT,
        "the client itself": "billing-api:billing-api-password",  # a compromised process
    }[who]
    if who == "another client":
        intruders(secured)  # enrolled
    writer = secured.kazoo(identity)
    for name, version in (
        ("x-billing-api", 10**300 - 2),  # would make every later version unwritable
        ("y-billing-api", MAX_AUTH_VERSION - 1),
        ("z-billing-api", "1e300"),
    ):
        forged = {"client_id": name, "auth_client": "billing-api", "auth_version": version}
        writer.create(client_path(SERVICE, name), json.dumps({**forged, "v": 1}).encode())
    # The manager issues the next version itself: the victim moves from 1 to 2, then 3.
    assert still_rotates(secured, victim, tmp_path) == 2
    assert still_rotates(secured, victim, tmp_path) == 3
    still_works(secured, victim, "after-forged-versions")
    assert victim.get_service(SERVICE).auth.version == 4


def test_a_squatter_under_clients_holds_no_rotation_and_is_named(
    secured: SecuredNamespace, victim: Sentinel, cli_in_process, tmp_path: Path
):
    # Two enrolled clients that are not running now (their keys are published).
    for idle in ("billing-report", "billing-audit"):
        app = secured.app(idle)
        app.get_service(SERVICE)
        app.close()
    squats = {}
    for idle, intruder in zip(("billing-report", "billing-audit"), intruders(secured), strict=True):
        path = client_path(SERVICE, idle)
        wait_until(lambda p=path: secured.kazoo().exists(p) is None)
        intruder.create(path, b"garbage", acl=list(OPEN_ACL_UNSAFE))
        intruder.create(f"{path}/pinned", b"", acl=list(OPEN_ACL_UNSAFE))
        intruder.set_acls(path, list(READ_ACL_UNSAFE))  # now nobody may delete below it
        squats[path] = intruder
    removable = client_path(SERVICE, "leftover")
    secured.kazoo().create(removable, b"garbage", acl=list(OPEN_ACL_UNSAFE))
    admin = secured.kazoo(secured.identities["admin"])
    for path in squats:
        assert refused(lambda p=path: admin.delete(p, recursive=True))  # ZooKeeper's limit
    # The tooling says what it can and cannot do ...
    code, report = secure_with_cli(secured, cli_in_process)
    assert (code, sorted(report["unrepaired"])) == (1, sorted(squats))
    assert report["removed"] == [removable] and admin.exists(removable) is None
    code, findings = doctor_acls(cli_in_process, "--identities", str(secured.identities_file))
    flagged = {f["detail"].split(": ")[0]: f["detail"] for f in findings}
    assert code == 1 and all("rotations ignore it" in flagged[path] for path in squats)
    # ... and rotations ignore what nobody they trust wrote, and what no live process holds
    # (a persistent entry, even the client's own identity's: it would outlive any process).
    ghost = secured.kazoo("billing-api:billing-api-password")
    never = json.dumps({"v": 1, "auth_client": "billing-api"}).encode()  # applied nothing
    ghost.create(client_path(SERVICE, "billing-api-ghost"), never)
    manager = secured.role("auth_manager", "rotator")
    backend = FileBackend(tmp_path / "credentials.json")
    clients = ["billing-api", "billing-report", "billing-audit"]
    result = manager.credentials.rotate(
        SERVICE, clients, backend, timeout=10, signer=secured.signer
    )
    assert result.versions == {"billing-api": 2, "billing-report": 1, "billing-audit": 1}
    assert wait_until(lambda: victim.get_service(SERVICE).auth.version == 2)
    still_rotates(secured, victim, tmp_path)
    assert victim.get_service(SERVICE).port == 5432


def test_a_refused_clients_write_never_fails_a_lookup(secured: SecuredNamespace, cli_in_process):
    # The spec is written by the admin alone, so nobody created /clients/<service> for it.
    admin = secured.kazoo(secured.identities["admin"])
    spec = ServiceSpec("ledger", scheme="http")
    section_acl = admin.get_acls(SERVICES)[0]
    admin.create(service_path("ledger"), spec.to_bytes(service_path("ledger")), acl=section_acl)
    secured.role("publisher").register("ledger", "p1", "10.0.0.9", 80)
    app = secured.sentinel("ledger-app", identity="ledger-app:pw")
    assert app.get_service("ledger").port == 80  # served although /clients refused it
    assert app.cache_stats.clients_write_failures >= 1
    assert admin.exists(client_path("ledger", "ledger-app")) is None
    # Repaired by the admin, the entry is written by the background retry.
    done = cli_in_process("init", "--secure", "--identities", str(secured.identities_file))
    assert done.returncode == 0, done.stderr
    assert wait_until(lambda: admin.exists(client_path("ledger", "ledger-app")), 10) is not None


# --- rollback and signing -------------------------------------------------------------------


def _service_with_a_manager(secured: SecuredNamespace) -> Sentinel:
    """The service published, and the authentication manager's client."""
    publisher = secured.role("publisher")
    publisher.ensure_service(SERVICE, scheme="postgresql")
    publisher.register(SERVICE, "p1", "10.0.0.5", 5432, scheme="postgresql", label="r1")
    return secured.role("auth_manager")


def _has(app: Sentinel, version: int, password: str) -> bool:
    auth = app.get_service(SERVICE).auth
    return auth is not None and auth.version == version and auth["password"] == password


def test_replay_an_older_credential_version(secured: SecuredNamespace) -> None:
    manager = _service_with_a_manager(secured)
    app = secured.app("billing-api")
    app.get_service(SERVICE)
    manager.credentials.publish(SERVICE, "billing-api", {"password": "one"}, signer=secured.signer)
    assert wait_until(lambda: _has(app, 1, "one"))
    attacker = secured.kazoo(secured.identities["auth_manager"])
    signed_v1, _ = attacker.get(auth_path(SERVICE, "billing-api"))
    manager.credentials.publish(SERVICE, "billing-api", {"password": "two"}, signer=secured.signer)
    assert wait_until(lambda: _has(app, 2, "two"))
    confirmed = client_path(SERVICE, app.client_id)
    assert wait_until(lambda: json.loads(attacker.get(confirmed)[0])["auth_version"] == 2)

    # The attacker writes back the old, validly signed v1 alone (v1 was revoked, or leaked).
    errors = app.cache_stats.auth_errors
    attacker.set(auth_path(SERVICE, "billing-api"), signed_v1)
    assert wait_until(lambda: app.cache_stats.auth_errors > errors)
    assert _has(app, 2, "two"), "the client went back to an older credential"

    # The manager moves on past every version a client confirmed, and the client follows.
    version = manager.credentials.publish(
        SERVICE, "billing-api", {"password": "three"}, signer=secured.signer
    )
    assert version == 3
    assert wait_until(lambda: _has(app, 3, "three"))


def test_write_an_unsigned_credential_in_a_secured_namespace(
    secured: SecuredNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SENTINEL_AUTH_SIGNER", raising=False)
    manager = _service_with_a_manager(secured)
    app = secured.app("billing-api")
    app.get_service(SERVICE)
    manager.credentials.publish(
        SERVICE, "billing-api", {"password": "signed"}, signer=secured.signer
    )
    assert wait_until(lambda: _has(app, 1, "signed"))
    attacker = secured.kazoo(secured.identities["auth_manager"])
    before = attacker.get(auth_path(SERVICE, "billing-api"))

    # The manager's own API refuses to publish unsigned here, before writing anything.
    with pytest.raises(SigningRequired, match="signing key"):
        manager.credentials.publish(SERVICE, "billing-api", {"password": "unsigned"})
    assert attacker.get(auth_path(SERVICE, "billing-api")) == before

    # A writer of /auth forges one anyway, encrypted to the app's real public key, in front.
    recipient = read_public_keys(attacker, "billing-api").keys[0]
    forged = seal(
        {"password": "forged"},
        recipient,
        namespace=secured.namespace,
        service=SERVICE,
        client="billing-api",
        version=2,
    )
    record, node_version = read_auth(attacker, SERVICE, "billing-api")
    errors = app.cache_stats.auth_errors
    write_auth(
        attacker, AuthRecord(SERVICE, "billing-api", (forged, *record.envelopes)), node_version
    )
    assert wait_until(lambda: app.cache_stats.auth_errors > errors)
    assert _has(app, 1, "signed"), "the client took an unsigned credential"

    # A client with a key ring and no manager key to verify with does not start at all.
    with pytest.raises(SigningRequired, match=r"AuthConfig\(signer=\.\.\.\)"):
        secured.app("careless", signed=False)


# --- secrets in logs ------------------------------------------------------------------------


def test_read_a_password_from_debug_logs(secured: SecuredNamespace, cli, caplog, monkeypatch):
    publisher = secured.identities["publisher"]
    password = publisher.split(":", 1)[1]
    # The library: kazoo's records at every level (BLATHER too) while a role connects.
    caplog.set_level(1, logger="kazoo")
    client = secured.role("publisher", "debug-publisher")
    client.register(SERVICE, "p1", "10.0.0.5", 5432)
    _, session_password = client.session.zk.client_id  # joins the session: a secret too
    auth_records = [r for r in caplog.records if "Auth(" in r.getMessage()]
    assert auth_records, "kazoo logged no Auth request: the test would prove nothing"
    assert password not in caplog.text
    assert session_password.hex() not in caplog.text
    assert repr(session_password)[2:-1] not in caplog.text
    assert all(password not in f"{r.msg} {r.args}" for r in caplog.records)
    # The command line at its most verbose.
    monkeypatch.setenv(acls.IDENTITY_ENV, publisher)
    listed = cli("-vv", "ls")
    assert listed.returncode == 0, listed.stderr
    assert "scheme='digest', auth='publisher:***'" in listed.stderr
    assert password not in listed.stderr + listed.stdout
    assert "DEBUG" in listed.stderr


# --- nodes planted while the namespace was open ---------------------------------------------


def impostor(space: SecuredNamespace, role: str) -> KazooClient:
    """An anonymous session that claims ``role``'s user name with a password of its own."""
    zk = space.kazoo()
    zk.add_auth("digest", f"{role}:evil")
    return zk


def impostor_acl(role: str) -> list:
    return [acls.owner_acl(f"{role}:evil"), acls.WORLD_READ]


def plant(space: SecuredNamespace) -> dict[str, KazooClient]:
    """While the namespace is open, the attacker writes a node in each section as the
    section's role's user name (its own password): path -> the session that made it."""
    legit = space.sentinel("old-publisher")  # the publisher of the open era, anonymous
    legit.register(SERVICE, "p1", "10.0.0.5", 5432, scheme="postgresql")
    [name] = [n for n in space.kazoo().get_children(service_path(SERVICE))]
    record = json.loads(space.kazoo().get(f"{service_path(SERVICE)}/{name}")[0])
    record.update(host="127.0.0.77", port=7777, label="zz")
    planted: dict[str, KazooClient] = {}
    for role, parent, child, data in (
        ("publisher", service_path(SERVICE), "p1:zz", json.dumps(record).encode()),
        ("collector", f"{METRICS}/{SERVICE}", "p1:zz", b'{"v": 1}'),
        ("shard_manager", SHARD_INFO, "evil-policy", b'{"v": 1}'),
        ("auth_manager", f"{AUTH}/{SERVICE}", "billing-api", b'{"v": 1}'),
    ):
        session = impostor(space, role)
        session.ensure_path(parent)  # world-writable, as anything made while it was open
        session.create(f"{parent}/{child}", data, acl=impostor_acl(role))
        planted[f"{parent}/{child}"] = session
    return planted


def test_nodes_planted_with_a_roles_user_name_are_removed_by_init_secure(
    upgrade: SecuredNamespace, cli_in_process, tmp_path: Path
):
    planted = plant(upgrade)
    code, report = secure_with_cli(upgrade, cli_in_process)
    # Each was written by `<role>:evil`, not by the role: removed (its ACL cannot be reset).
    assert (code, sorted(report["removed"]), report["unrepaired"]) == (0, sorted(planted), [])
    assert all(upgrade.kazoo().exists(path) is None for path in planted)
    code, findings = doctor_acls(cli_in_process, "--identities", str(upgrade.identities_file))
    assert [f["severity"] for f in findings] == ["ok"], findings
    victim = enrolled_victim(upgrade)
    # Neither the impostors nor the other intruders can put the nodes back.
    for path, session in planted.items():
        for intruder in (session, *intruders(upgrade)):
            assert refused(lambda i=intruder, p=path: i.create(p, b"{}"))
    assert {e.host for e in victim.cached_instances(SERVICE)} == {"10.0.0.5"}
    still_rotates(upgrade, victim, tmp_path)
    assert victim.get_service(SERVICE).host == "10.0.0.5"


def test_a_planted_node_init_secure_cannot_remove_is_named_and_doctor_flags_it(
    upgrade: SecuredNamespace, cli_in_process, tmp_path: Path
):
    session = impostor(upgrade, "shard_manager")
    policy = f"{SHARD_INFO}/evil-policy"
    session.create(policy, b"{}", acl=impostor_acl("shard_manager"))
    session.create(f"{policy}/a-key", b"{}", acl=impostor_acl("shard_manager"))  # blocks removal
    code, report = secure_with_cli(upgrade, cli_in_process)
    assert code == 1 and report["unrepaired"] == [policy, f"{policy}/a-key"]
    code, findings = doctor_acls(cli_in_process, "--identities", str(upgrade.identities_file))
    flagged = {f["detail"].split(":")[0]: f for f in findings if f["severity"] == "error"}
    assert code == 1 and set(flagged) == {policy, f"{policy}/a-key"}
    assert "another password" in flagged[policy]["detail"]
    # Without the identities doctor cannot see digests, and says what it could not check.
    code, findings = doctor_acls(cli_in_process)
    assert any(f["severity"] == "warn" and "user name only" in f["detail"] for f in findings)
    # The rest of the namespace is secured: the victim resolves and rotates.
    victim = enrolled_victim(upgrade)
    still_rotates(upgrade, victim, tmp_path)


def test_an_upgrade_from_an_open_namespace_an_attacker_wrote_to(
    upgrade: SecuredNamespace, cli_in_process, tmp_path: Path
):
    planted = plant(upgrade)  # role user names with the attacker's passwords, every section
    anonymous = upgrade.kazoo()
    slot = auth_keys_path("billing-api")  # a key slot holding the attacker's key
    keys = ClientKeyring.generate().published("billing-api").to_bytes(slot)
    anonymous.ensure_path(AUTH_KEYS)
    anonymous.create(slot, keys, acl=list(READ_ACL_UNSAFE))
    squat = client_path(SERVICE, "carol")  # a /clients entry the admin cannot delete
    anonymous.ensure_path(f"{CLIENTS}/{SERVICE}")
    anonymous.create(squat, b"garbage", acl=list(OPEN_ACL_UNSAFE))
    anonymous.create(f"{squat}/pinned", b"", acl=list(OPEN_ACL_UNSAFE))
    anonymous.set_acls(squat, list(READ_ACL_UNSAFE))
    opened = f"{METRICS}/{SERVICE}/p1:open"  # anyone's, as everything was: its ACL is reset
    anonymous.create(opened, b'{"v": 1}', acl=list(OPEN_ACL_UNSAFE))
    code, report = secure_with_cli(upgrade, cli_in_process)
    # Every node is repaired (reset, removed, or made again empty) or named.
    assert code == 1 and report["unrepaired"] == [squat]
    assert sorted(report["removed"]) == sorted(planted) and report["reset_key_slots"] == [slot]
    assert not acls.world_writable(anonymous.get_acls(opened)[0])
    assert anonymous.get(slot)[0] == b""
    # doctor agrees: what init named, and only that (with what lies below it), is flagged.
    code, findings = doctor_acls(cli_in_process, "--identities", str(upgrade.identities_file))
    flagged = {f["detail"].split(": ")[0] for f in findings if f["severity"] == "error"}
    assert code == 1 and flagged == {squat, f"{squat}/pinned"}, findings
    # The victim resolves the publisher's instance only, and rotates.
    victim = enrolled_victim(upgrade)
    assert {e.host for e in victim.cached_instances(SERVICE)} == {"10.0.0.5"}
    still_rotates(upgrade, victim, tmp_path)


# --- ADMIN is the admin's -------------------------------------------------------------------


def test_no_role_may_change_an_acl_it_did_not_create(
    secured: SecuredNamespace, victim: Sentinel, cli_in_process, tmp_path: Path
):
    daemon_service = service_path("metric-collector-default")  # granted by init --secure
    nodes = ["/", *SECTIONS, AUTH_KEYS, f"{CLIENTS}/{SERVICE}", daemon_service]
    roles = [role for role in acls.ROLES if role != "admin"]
    sessions = [secured.kazoo(secured.identities[role]) for role in roles]
    for session in (*sessions, *intruders(secured)):
        for path in nodes:
            for acl in (list(OPEN_ACL_UNSAFE), list(READ_ACL_UNSAFE)):  # open it, or shut it
                assert refused(lambda s=session, p=path, a=acl: s.set_acls(p, a)), path
    code, findings = doctor_acls(cli_in_process, "--identities", str(secured.identities_file))
    assert (code, [f["severity"] for f in findings]) == (0, ["ok"]), findings
    # A namespace secured by an earlier version gave each role ALL (ADMIN too) on its section:
    # doctor says so, from the section node itself, and init --secure takes it back.
    admin = secured.kazoo(secured.identities["admin"])
    earlier = [acls.owner_acl(secured.identities[r]) for r in ("admin", "collector")]
    admin.set_acls(METRICS, [*earlier, acls.WORLD_READ])
    code, findings = doctor_acls(cli_in_process)
    assert code == 1 and any(
        f["detail"].startswith(f"{METRICS}: collector may change its ACL") for f in findings
    ), findings
    code, report = secure_with_cli(secured, cli_in_process)
    assert (code, report["changed"], report["unrepaired"]) == (0, 1, [])
    code, findings = doctor_acls(cli_in_process, "--identities", str(secured.identities_file))
    assert (code, [f["severity"] for f in findings]) == (0, ["ok"]), findings
    still_rotates(secured, victim, tmp_path)
    assert victim.get_service(SERVICE).port == 5432


def test_a_node_a_daemon_left_that_nobody_may_remove_is_named(
    secured: SecuredNamespace, victim: Sentinel, cli_in_process, tmp_path: Path
):
    collector = secured.kazoo(secured.identities["collector"])
    pinned = f"{service_path('metric-collector-default')}/p1:pinned"
    collector.create(pinned, b"{}", acl=list(OPEN_ACL_UNSAFE))
    collector.create(f"{pinned}/child", b"", acl=list(OPEN_ACL_UNSAFE))
    collector.set_acls(pinned, list(READ_ACL_UNSAFE))  # its own node: nobody may write it now
    admin = secured.kazoo(secured.identities["admin"])
    assert refused(lambda: admin.delete(pinned, recursive=True))
    code, report = secure_with_cli(secured, cli_in_process)
    assert (code, report["unrepaired"]) == (1, [pinned])
    code, findings = doctor_acls(cli_in_process, "--identities", str(secured.identities_file))
    flagged = [f["detail"] for f in findings if f["severity"] == "error"]
    assert code == 1 and flagged == [
        f"{pinned}: nobody may write it, so nobody can change or remove what it says"
    ]
    still_rotates(secured, victim, tmp_path)


# --- a namespace someone else made -----------------------------------------------------------


@pytest.mark.parametrize(
    ("squatter", "open_sections"), [("admin:evil", True), ("mallory:mallory-pw", False)]
)
def test_a_squatted_namespace_root_is_refused(
    zookeeper, namespace, cli_in_process, tmp_path, squatter, open_sections
):
    attacker = KazooClient(hosts=zookeeper.connect_string)
    attacker.start(timeout=10)
    try:
        # ZooKeeper's / is anyone's: the namespace is made first, with the squatter as admin.
        attacker.add_auth("digest", squatter)
        mine = [acls.owner_acl(squatter), acls.WORLD_READ]
        attacker.create(namespace, b"", acl=mine)
        for section in SECTIONS:
            attacker.create(
                namespace + section, b"", acl=OPEN_ACL_UNSAFE if open_sections else mine
            )
        slot = auth_keys_path("billing-api")
        attacker.create(namespace + AUTH_KEYS, b"", acl=mine)
        keys = ClientKeyring.generate().published("billing-api").to_bytes(slot)
        attacker.create(namespace + slot, keys, acl=mine)  # the squatter's own key
        identities = tmp_path / "identities.json"
        done = cli_in_process("init", "--secure", "--identities", str(identities))
        user = squatter.split(":")[0]
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"{namespace} is controlled by digest:{user}" in done.stderr
        assert "superuser" in done.stderr and "another --namespace" in done.stderr
        assert attacker.get_acls(namespace)[0] == mine  # nothing was changed
        # The operator carries on anyway: the manager encrypts nothing to the squatter's key.
        space = secured_namespace(zookeeper, namespace, identities)
        manager = space.role("auth_manager")
        with pytest.raises(NamespaceNotTrusted, match="/auth"):
            manager.credentials.publish(SERVICE, "billing-api", CREDENTIAL, signer=space.signer)
        assert attacker.exists(namespace + auth_path(SERVICE, "billing-api")) is None
        space.close()
    finally:
        attacker.stop()
        attacker.close()
    # The fix it names: another namespace, secured by the CLI, serves the victim.
    elsewhere = f"{namespace}-2"
    done = cli_in_process(
        "init", "--secure", "--identities", str(identities), namespace_override=elsewhere
    )
    assert done.returncode == 0, done.stderr
    space = secured_namespace(zookeeper, elsewhere, identities)
    try:
        victim = enrolled_victim(space)
        still_rotates(space, victim, tmp_path)
    finally:
        space.close()


# --- what the admin sees and repairs ----------------------------------------------------------


def test_doctor_flags_what_init_secure_repairs(
    secured: SecuredNamespace, victim: Sentinel, cli_in_process
):
    def doctor() -> tuple[int, list[dict]]:
        return doctor_acls(cli_in_process, "--identities", str(secured.identities_file))

    code, findings = doctor()
    assert [f["severity"] for f in findings] == ["ok"], findings
    admin = secured.kazoo(secured.identities["admin"])
    slot = auth_keys_path("billing-api")
    admin.set_acls(slot, list(OPEN_ACL_UNSAFE))  # a mistake the admin made by hand
    secured.kazoo().create(client_path(SERVICE, "anonymous-app"), b"{}", ephemeral=True)
    code, findings = doctor()
    flagged = {f["detail"].split(":")[0]: f["fix"] for f in findings if f["severity"] == "error"}
    assert code == 1
    assert "sentinel auth enroll billing-api" in flagged[slot]
    assert "identity" in flagged[client_path(SERVICE, "anonymous-app")]
    done = cli_in_process(
        "init", "--secure", "--identities", str(secured.identities_file), "--json"
    )
    assert json.loads(done.stdout)["acl_nodes"]["reset_key_slots"] == [slot]
    assert admin.get(slot)[0] == b""  # keys anyone could have swapped are never used


def test_init_secure_converges_on_a_namespace_in_use(
    secured: SecuredNamespace, victim, cli_in_process
):
    # Every role has written its own nodes, with its own ACLs, since the namespace was secured.
    secured.role("shard_manager").shard_maps.create("tenants", "directory", partitions=["p1"])
    secured.role("collector").update_metrics(SERVICE, "p1", "10.0.0.5_5432", {"lag": 0.5})

    def init() -> dict:
        done = cli_in_process(
            "init", "--secure", "--identities", str(secured.identities_file), "--json"
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    first = init()
    assert first["acl_nodes"]["unrepaired"] == [] and first["acl_nodes"]["reset_key_slots"] == []
    assert "shard-manager-tenants" in first["grants"]  # the new policy's manager is granted
    again = init()["acl_nodes"]
    assert (again["changed"], again["unrepaired"], again["reset_key_slots"]) == (0, [], [])
    assert again["checked"] > 10
    still_works(secured, victim, "after-init")


# --- junk under /clients (anyone may add entries there) ---------------------------------------

JUNK = 3_000


def flood(secured: SecuredNamespace, count: int = JUNK) -> list[str]:
    """``count`` persistent entries under /clients/billing-db, added by an anonymous session in
    transactions (fast); half of them claim billing-api and never confirm. Returns the paths."""
    intruder = secured.kazoo()
    claim = json.dumps({"v": 1, "auth_client": "billing-api"}).encode()
    paths = [client_path(SERVICE, f"junk-{i:06d}") for i in range(count)]
    for start in range(0, count, 500):
        transaction = intruder.transaction()
        for i, path in enumerate(paths[start : start + 500], start):
            transaction.create(path, claim if i % 2 else b"junk")
        assert all(isinstance(r, str) for r in transaction.commit())
    return paths


def counting(zk: KazooClient, monkeypatch, delay: float = 0.0) -> dict[str, int]:
    """Count the reads ``zk`` sends by kind (each ``delay`` seconds slower): get, stat, acl."""
    counts = {"get": 0, "stat": 0, "acl": 0}
    for kind, method in (("get", "get_async"), ("stat", "exists_async"), ("acl", "get_acls_async")):
        original = getattr(zk, method)

        def counted(*args, _kind=kind, _original=original, **kwargs):
            counts[_kind] += 1
            if delay:
                time.sleep(delay)
            return _original(*args, **kwargs)

        monkeypatch.setattr(zk, method, counted)
    return counts


def test_junk_under_clients_costs_a_rotation_one_stat_per_entry(
    secured: SecuredNamespace, victim: Sentinel, tmp_path: Path, monkeypatch
):
    flood(secured)
    manager = secured.role("auth_manager", "rotator")
    reads = counting(manager.session.zk, monkeypatch)
    backend = FileBackend(tmp_path / "credentials.json")
    started = time.monotonic()
    result = manager.credentials.rotate(
        SERVICE, "billing-api", backend, timeout=20, signer=secured.signer
    )
    took = time.monotonic() - started
    print(f"rotation with {JUNK:,} junk entries: {took:.2f}s, reads {reads}")
    assert result.versions == {"billing-api": 2}
    # Each junk entry was looked at once (its stat: persistent), however many passes ran, and
    # no junk entry's data or ACL was read: only the victim's entry, once per change.
    assert JUNK <= reads["stat"] < JUNK + 20, reads
    assert reads["acl"] < 20 and reads["get"] < 20, reads


def test_a_confirm_pass_ends_at_the_deadline_however_much_junk(
    secured: SecuredNamespace, victim: Sentinel, tmp_path: Path, monkeypatch
):
    flood(secured)
    manager = secured.role("auth_manager", "rotator")
    # Each read 1 ms slower: one pass over the junk takes > 3 s, the timeout is 1 s.
    counting(manager.session.zk, monkeypatch, delay=0.001)
    release = threading.Event()
    victim.listen(SERVICE, lambda e: isinstance(e, AuthChanged) and release.wait(30))
    backend = FileBackend(tmp_path / "credentials.json")
    started = time.monotonic()
    try:
        with pytest.raises(RotationFailed) as caught:
            manager.credentials.rotate(
                SERVICE, "billing-api", backend, timeout=1, signer=secured.signer
            )
    finally:
        release.set()
    took = time.monotonic() - started
    assert took < 2.5, f"the confirm step ran {took:.1f}s past a 1s timeout"
    assert caught.value.step == "confirm" and "still unread" in str(caught.value)


def test_auth_status_lists_no_junk_or_forged_entry_as_a_process(
    secured: SecuredNamespace, victim: Sentinel, cli_in_process
):
    flood(secured, 200)
    forged = {"client_id": "billing-api-2", "auth_client": "billing-api", "auth_version": 1}
    for name, intruder in zip(("forged-1", "forged-2"), intruders(secured), strict=True):
        path = client_path(SERVICE, name)
        intruder.create(path, json.dumps({**forged, "v": 1}).encode(), ephemeral=True)
    done = cli_in_process("auth", "status", "--service", SERVICE, "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["client"]: row for row in json.loads(done.stdout)}
    assert set(rows) == {"billing-api"}, sorted(rows)[:5]
    assert rows["billing-api"]["processes"] == {"billing-api": 1}
    assert "202 entries under /clients/billing-db belong to no process" in done.stderr
    assert "200 persistent" in done.stderr


def test_doctor_checks_every_node_of_the_roles_however_much_junk(
    secured: SecuredNamespace, victim: Sentinel, cli_in_process, monkeypatch
):
    monkeypatch.setattr(acl_checks, "ACL_SAMPLE", 1_000)  # 3,000 junk entries are a flood then
    flood(secured)
    # A real problem deep in a role's section, which breadth first comes after the junk.
    publisher = secured.kazoo(secured.identities["publisher"])
    hidden = f"{service_path(SERVICE)}/deep/open"
    publisher.create(hidden, b"", acl=list(OPEN_ACL_UNSAFE), makepath=True)
    code, findings = doctor_acls(cli_in_process, "--identities", str(secured.identities_file))
    details = [f["detail"] for f in findings]
    assert code == 1
    assert any(d.startswith(f"{hidden}: anyone may write it") for d in details), details
    # The junk is one finding, with how much of it was looked at, not one finding each.
    [junk] = [d for d in details if "belong to no process" in d]
    count, _, rest = junk.partition(" entries under ")
    # The random sample of 1,000 of the 3,001 entries may include the victim's own.
    assert count in ("999", "1,000") and rest.startswith(f"{CLIENTS}/{SERVICE} belong to no")
    assert any("has 3,001 entries: checked a random sample of 1,000" in d for d in details)
    assert len(findings) < 10, details


def test_an_entry_shut_to_the_manager_holds_no_rotation_and_is_named(
    secured: SecuredNamespace, victim: Sentinel, cli_in_process, tmp_path: Path
):
    impostor = secured.kazoo("billing-api:evil")  # the client's user name, another password
    claim = {"client_id": "shut", "auth_client": "billing-api", "v": 1}
    only_me = [make_digest_acl("billing-api", "evil", all=True)]
    impostor.create(client_path(SERVICE, "shut"), json.dumps(claim).encode(), only_me, True)
    assert refused(lambda: secured.kazoo().get(client_path(SERVICE, "shut")))
    assert still_rotates(secured, victim, tmp_path) == 2
    code, findings = doctor_acls(cli_in_process, "--identities", str(secured.identities_file))
    shut = f"{client_path(SERVICE, 'shut')}: nobody but its writer may read it"
    assert code == 1 and any(f["detail"].startswith(shut) for f in findings), findings


# --- a daemon flooding a section (attack 6) -------------------------------------------------


def test_a_collector_flooding_metrics_cannot_stall_a_new_clients_first_lookup(
    secured: SecuredNamespace, victim: Sentinel, monkeypatch, cli_in_process, tmp_path
):
    """The collector identity may write /metrics: it floods /metrics/billing-db past what a
    follower reads (the bound lowered to 200 nodes here, 20,000 as shipped). A new client's
    first lookup reads the bound, the instance's own metrics first, and resolves at once;
    doctor names the flooded section; the victim still resolves and rotates."""
    monkeypatch.setattr(sentinel.cache.reads, "MAX_SECTION_NODES", 200)
    publisher = secured.role("publisher", "publisher-2")
    instance = publisher.register(SERVICE, "p1", "10.0.0.6", 5432, label="b")
    collector = secured.role("collector")
    collector.update_metrics(instance, {"replication_lag": 0.5})
    flood = secured.kazoo(secured.identities["collector"])
    for start in range(0, 600, 200):
        transaction = flood.transaction()
        for n in range(start, start + 200):
            transaction.create(f"{METRICS}/{SERVICE}/{n:05d}", b"x" * 1000)
        assert all(isinstance(r, str) for r in transaction.commit())
    started = time.monotonic()
    newcomer = secured.app("billing-report")
    endpoints = newcomer.eligible_instances(SERVICE)
    assert time.monotonic() - started < 5.0
    assert {e.label for e in endpoints} >= {"b"}
    assert next(e for e in endpoints if e.label == "b").metrics == {"replication_lag": 0.5}
    assert newcomer.cache_stats.over_limit == 600 + 1 - 200  # junk and b's node, 200 read
    findings = json.loads(cli_in_process("doctor", "--json").stdout)
    assert any(f["check"] == "flooded section" for f in findings)
    still_rotates(secured, victim, tmp_path)


def test_forged_protection_claims_are_reported_never_summed(secured, victim, cli_in_process):
    """Issue 50 item 8: ``ls`` and ``doctor`` count a ``/clients`` entry's ``protecting``
    only when the identity enrolled for the client it names wrote it, on a live session, for
    a service whose spec marks departures (the only ones ever protected). An anonymous
    entry, persistent or ephemeral, is reported as counting for nobody, never summed."""
    marked = "orders-db"
    publisher = secured.role("publisher")
    publisher.ensure_service(marked, mark_departures=True)
    publisher.register(marked, "p1", "10.0.0.6", 5432)
    victim.get_service(marked)  # its /clients entry, on its identity's session
    own = secured.kazoo("billing-api:billing-api-password")
    parent = f"{CLIENTS}/{marked}"
    assert wait_until(lambda: own.get_children(parent))
    (entry,) = own.get_children(parent)
    since = time.time() - 5

    def claim(client_id: str, count: int) -> bytes:
        document = {"v": 1, "client_id": client_id, "app": "billing-api"}
        return json.dumps({**document, "protecting": count, "protecting_since": since}).encode()

    own.set(f"{parent}/{entry}", claim(entry, 2))  # the process's own claim: counted
    anonymous = secured.kazoo()
    anonymous.create(f"{parent}/forged-1", claim("forged-1", 400))  # persistent
    anonymous.create(f"{parent}/forged-2", claim("forged-2", 300), ephemeral=True)
    # A claim about a service whose spec does not mark departures: the registry says no
    # client protects it, whoever wrote it.
    (unmarked,) = own.get_children(f"{CLIENTS}/{SERVICE}")
    own.set(f"{CLIENTS}/{SERVICE}/{unmarked}", claim(unmarked, 7))

    listed = cli_in_process("ls", marked, "--json")
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert [(c["client"], c["instances"]) for c in document["protecting_clients"]] == [(entry, 2)]
    assert document["ignored_clients"] == {"persistent": 1, "not an enrolled identity's": 1}
    text = cli_in_process("ls", marked).stdout
    assert "1 client(s) (" + entry + ") serve up to 2 instance(s)" in text, text
    assert "2 entries under /clients/orders-db count for no process" in text, text
    assert "400" not in text and "300" not in text, text
    unmarked_document = json.loads(cli_in_process("ls", SERVICE, "--json").stdout)
    assert unmarked_document["protecting_clients"] == []
    assert list(unmarked_document["ignored_clients"].values()) == [1]

    findings = json.loads(cli_in_process("doctor", "--json").stdout)
    (protection,) = [f for f in findings if f["check"] == "protection"]
    assert "serve up to 2 instance(s) of orders-db" in protection["detail"], protection
    ignored = {f["detail"].split()[3]: f for f in findings if f["check"] == "clients"}
    assert set(ignored) == {f"/clients/{marked}", f"/clients/{SERVICE}"}, ignored
    assert all(f["severity"] == "warn" for f in ignored.values())
    assert not [f for f in findings if "400" in f["detail"] or "300" in f["detail"]]
