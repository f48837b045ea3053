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
from sentinel.launcher import LocalZooKeeper

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

# --- secrets in logs ------------------------------------------------------------------------
