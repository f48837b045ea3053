"""Registering service instances: ephemeral nodes that outlive session expiry.

An instance is an ephemeral node, so ZooKeeper removes it when the publisher's session ends.
When the session expires while the process lives on, kazoo connects again with a new session and
the :class:`Publisher` re-creates every registration. A node that still carries an old session
(the server has not expired it yet, or another process took the name) is deleted and re-created
in one transaction, so watchers see the change and the node belongs to the live session. A
connection that merely flaps keeps its session, and then nothing is written.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)

from sentinel.errors import RegistryConflict, ServiceConflict
from sentinel.layout import instance_path, service_path
from sentinel.records import InstanceRecord, ServiceSpec

log = logging.getLogger(__name__)

_WRITE_ATTEMPTS = 5
_RETRY_AFTER_FAILURE = 1.0


@dataclass(frozen=True)
class Registration:
    """A live registration made by this client: pass it to ``deregister_service`` or ``drain``."""

    instance: InstanceRecord
    path: str

    @property
    def service(self) -> str:
        """The registered service."""
        return self.instance.service

    @property
    def partition(self) -> str:
        """The partition the instance serves."""
        return self.instance.partition

    @property
    def label(self) -> str:
        """The instance's label, unique within its partition."""
        return self.instance.label


def _failed(results: list[object]) -> Exception | None:
    """The first real failure of a committed transaction (kazoo returns errors as results)."""
    for result in results:
        if isinstance(result, Exception) and type(result).__name__ != "RolledBackError":
            return result
    return None


class Publisher:
    """Owns this client's registrations and keeps them alive across sessions."""

    def __init__(self, zk: KazooClient) -> None:
        self._zk = zk
        # Serialises writes of registrations between the caller's threads and the re-registering
        # worker; kazoo's own thread never takes it (its callbacks must not block).
        self._write_lock = threading.Lock()
        self._registrations: dict[str, Registration] = {}
        self._session_id: int | None = None
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._worker: threading.Thread | None = None

    @property
    def registrations(self) -> tuple[Registration, ...]:
        """Registrations made by this client and not yet deregistered."""
        return tuple(self._registrations.values())

    def start(self) -> None:
        """Begin watching the session; call once the client is connected."""
        self._session_id = self._zk.client_id[0]
        self._zk.add_listener(self._on_state)
        self._worker = threading.Thread(target=self._run, name="sentinel-publisher", daemon=True)
        self._worker.start()

    def close(self) -> None:
        """Stop the worker; the session's end removes the ephemeral nodes themselves."""
        self._closed.set()
        self._wake.set()
        self._zk.remove_listener(self._on_state)
        if self._worker is not None:
            self._worker.join()

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's thread: only wake the worker, never touch ZooKeeper here.
        if state == KazooState.CONNECTED:
            self._wake.set()

    def _run(self) -> None:
        timeout = None
        while True:
            self._wake.wait(timeout)
            self._wake.clear()
            if self._closed.is_set():
                return
            timeout = None
            if self._zk.state != KazooState.CONNECTED:
                continue
            session_id = self._zk.client_id[0]
            if session_id == self._session_id:
                continue  # same session: the ephemeral nodes are still there
            try:
                self._restore_all()
            except (ConnectionLoss, SessionExpiredError):
                continue  # the next CONNECTED wakes us again
            except Exception:
                log.exception("re-registration failed; retrying in %.0fs", _RETRY_AFTER_FAILURE)
                timeout = _RETRY_AFTER_FAILURE
                continue
            self._session_id = session_id

    def _restore_all(self) -> None:
        restored = 0
        for path in list(self._registrations):
            with self._write_lock:
                registration = self._registrations.get(path)
                if registration is None:
                    continue  # deregistered meanwhile
                self._put(path, registration.instance.to_bytes(path))
                restored += 1
        log.info("new ZooKeeper session: re-registered %d instance(s)", restored)

    def _put(self, path: str, data: bytes) -> None:
        """Make ``path`` an ephemeral node of the current session holding ``data``."""
        for _ in range(_WRITE_ATTEMPTS):
            try:
                self._zk.create(path, data, ephemeral=True)
                return
            except NodeExistsError:
                pass
            try:
                _, stat = self._zk.get(path)
            except NoNodeError:
                continue
            if stat.ephemeralOwner == self._zk.client_id[0]:
                try:
                    self._zk.set(path, data, version=stat.version)
                    return
                except (BadVersionError, NoNodeError):
                    continue
            log.warning("taking over %s from session 0x%x", path, stat.ephemeralOwner)
            transaction = self._zk.transaction()
            transaction.delete(path, version=stat.version)
            transaction.create(path, data, ephemeral=True)
            if _failed(transaction.commit()) is None:
                return
        raise RegistryConflict(f"{path} kept changing during {_WRITE_ATTEMPTS} write attempts")

    def ensure_service(self, spec: ServiceSpec) -> ServiceSpec:
        """Create the service spec if missing; return the stored one.

        Raises :class:`ServiceConflict` if a spec exists with other settings.
        """
        path = service_path(spec.service)
        try:
            self._zk.create(path, spec.to_bytes(path))
            return spec
        except NodeExistsError:
            pass
        data, _ = self._zk.get(path)
        stored = ServiceSpec.from_bytes(spec.service, path, data)
        if stored != spec:
            raise ServiceConflict(
                f"service {spec.service!r} exists with scheme={stored.scheme!r}, "
                f"shard_policy={stored.shard_policy!r}, defaults={dict(stored.defaults)!r}; "
                f"asked for scheme={spec.scheme!r}, shard_policy={spec.shard_policy!r}, "
                f"defaults={dict(spec.defaults)!r}"
            )
        return stored

    def register(self, instance: InstanceRecord) -> Registration:
        """Publish ``instance``; create its service spec in the same transaction if missing."""
        path = instance_path(instance.service, instance.partition, instance.label)
        data = instance.to_bytes(path)
        spec_path = service_path(instance.service)
        spec = ServiceSpec(instance.service, scheme=instance.scheme)
        with self._write_lock:
            if self._zk.exists(spec_path) is None:
                transaction = self._zk.transaction()
                transaction.create(spec_path, spec.to_bytes(spec_path))
                transaction.create(path, data, ephemeral=True)
                failure = _failed(transaction.commit())
                if failure is not None and not isinstance(failure, NodeExistsError):
                    raise failure
                if failure is not None:
                    self._put(path, data)  # a concurrent publisher created the spec first
            else:
                self._put(path, data)
            registration = Registration(instance, path)
            self._registrations[path] = registration
        log.info("registered %s (%s:%d)", path, instance.host, instance.port)
        return registration

    def deregister(self, registration: Registration) -> bool:
        """Remove a registration; False if this client did not hold it (already deregistered)."""
        with self._write_lock:
            if self._registrations.pop(registration.path, None) is None:
                return False
            stat = self._zk.exists(registration.path)
            if stat is not None and stat.ephemeralOwner == self._zk.client_id[0]:
                try:
                    self._zk.delete(registration.path, version=stat.version)
                except (NoNodeError, BadVersionError):
                    log.warning("%s changed while deregistering; left as it is", registration.path)
            elif stat is not None:
                log.warning("%s belongs to another session now; left in place", registration.path)
        log.info("deregistered %s", registration.path)
        return True
