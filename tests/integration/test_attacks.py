"""Attacks on a namespace made with ``sentinel init --secure`` (docs/auth.md, threat model).

Each test tries one attack as an anonymous session or as another client's identity, asserts
that ZooKeeper or Sentinel refuses it, and that the victim keeps working.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from sentinel import Sentinel
from sentinel.auth import ClientKeyring, ManagerKey
from sentinel.auth import acl as acls
from sentinel.auth.envelope import seal
from sentinel.auth.store import AuthRecord, read_auth, read_public_keys, write_auth
from sentinel.errors import SigningRequired
from sentinel.launcher import LocalZooKeeper
from sentinel.layout import auth_path, client_path
from sentinel.testing import wait_until

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

    def app(self, client_id: str, **kwargs: object) -> Sentinel:
        """An application client with an identity and a key ring of its own, trusting the
        namespace's manager signing key."""
        kwargs.setdefault("identity", f"{client_id}:{client_id}-password")
        kwargs.setdefault("auth_keys", ClientKeyring.generate())
        kwargs.setdefault("auth_signer", self.signer.public_text)
        return self.sentinel(client_id, **kwargs)

    def close(self) -> None:
        for close in reversed(self._closing):
            close()


@pytest.fixture
def secured(
    zookeeper: LocalZooKeeper, namespace: str, cli, tmp_path: Path
) -> Iterator[SecuredNamespace]:
    identities_file = tmp_path / "identities.json"
    done = cli("init", "--secure", "--identities", str(identities_file))
    assert done.returncode == 0, done.stderr
    space = SecuredNamespace(
        zookeeper.connect_string,
        namespace,
        json.loads(identities_file.read_text()),
        identities_file,
        ManagerKey.generate(),
    )
    yield space
    space.close()


# --- key slots (enrolment) ------------------------------------------------------------------

# --- /clients -------------------------------------------------------------------------------

# --- rollback and signing -------------------------------------------------------------------


def _service_with_a_manager(secured: SecuredNamespace) -> Sentinel:
    """The service published, and the authentication manager's client."""
    publisher = secured.role("publisher")
    publisher.ensure_service(SERVICE, scheme="postgresql")
    publisher.register_service(SERVICE, "p1", "10.0.0.5", 5432, scheme="postgresql", label="r1")
    return secured.role("auth_manager")


def _has(app: Sentinel, version: int, password: str) -> bool:
    auth = app.get_service(SERVICE).auth
    return auth is not None and auth.version == version and auth["password"] == password


def test_replay_an_older_credential_version(secured: SecuredNamespace) -> None:
    manager = _service_with_a_manager(secured)
    app = secured.app("billing-api")
    app.get_service(SERVICE)
    manager.update_auth(SERVICE, "billing-api", {"password": "one"}, signer=secured.signer)
    assert wait_until(lambda: _has(app, 1, "one"))
    attacker = secured.kazoo(secured.identities["auth_manager"])
    signed_v1, _ = attacker.get(auth_path(SERVICE, "billing-api"))
    manager.update_auth(SERVICE, "billing-api", {"password": "two"}, signer=secured.signer)
    assert wait_until(lambda: _has(app, 2, "two"))
    confirmed = client_path(SERVICE, app.client_id)
    assert wait_until(lambda: json.loads(attacker.get(confirmed)[0])["auth_version"] == 2)

    # The attacker writes back the old, validly signed v1 alone (v1 was revoked, or leaked).
    errors = app.cache_stats.auth_errors
    attacker.set(auth_path(SERVICE, "billing-api"), signed_v1)
    assert wait_until(lambda: app.cache_stats.auth_errors > errors)
    assert _has(app, 2, "two"), "the client went back to an older credential"

    # The manager moves on past every version a client confirmed, and the client follows.
    version = manager.update_auth(
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
    manager.update_auth(SERVICE, "billing-api", {"password": "signed"}, signer=secured.signer)
    assert wait_until(lambda: _has(app, 1, "signed"))
    attacker = secured.kazoo(secured.identities["auth_manager"])
    before = attacker.get(auth_path(SERVICE, "billing-api"))

    # The manager's own API refuses to publish unsigned here, before writing anything.
    with pytest.raises(SigningRequired, match="signing key"):
        manager.update_auth(SERVICE, "billing-api", {"password": "unsigned"})
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
    with pytest.raises(SigningRequired, match="auth_signer"):
        secured.app("careless", auth_signer=None)


# --- secrets in logs ------------------------------------------------------------------------
