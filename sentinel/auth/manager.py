"""The authentication manager: publish credentials, and rotate them by Procedure 2.

:func:`update_auth` encrypts one credential to a client's newest public key and makes it the
only live one. :class:`Rotation` is the paper's Procedure 2 with confirmed propagation:

1. ``create``: the backend makes a new credential (the old one keeps working);
2. ``publish``: it is published *in front of* the old one, so clients switch to it;
3. ``confirm``: wait until every live ``/clients/<service>/*`` node of the client (each
   process using it has one) reports the new version (a process writes it after its listeners
   have rebuilt their pools), or time out naming the processes that have not;
4. ``revoke``: only then remove the old envelopes from ``/auth`` and revoke the old
   credentials in the backend.

A failure at any step raises :class:`~sentinel.errors.RotationFailed` with the step, and the old
credential still works. New credentials already published stay published next to the old ones,
valid: a client may have applied one already, and clients never go back to an older version
(see :mod:`sentinel.auth.reader`), so withdrawing and revoking it would leave that client with
a dead credential. After ``confirm`` times out, or ``create``/``publish`` fails for a later
client, :meth:`Rotation.resume` finishes the job later.

Versions only grow, and only the manager issues them: a new one is above every version
published for the client and every one the manager recorded as issued
(:func:`~sentinel.auth.store.read_issued`), so a node rewritten with an old credential (a
replay) or removed and created again never makes the manager reuse a number clients have
seen, and nothing a client writes (its ``/clients`` confirmation) moves the next one. In a
secured namespace (``sentinel init --secure``) clients accept only signed credentials, so
publishing without a signing key is refused (:class:`~sentinel.errors.SigningRequired`) before
anything is written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kazoo.client import KazooClient

from sentinel.auth import acl
from sentinel.auth.enrolment import slot_owner
from sentinel.auth.entries import ClientEntries, confirmation_owners
from sentinel.auth.envelope import seal, validate_credential
from sentinel.auth.keys import ManagerKey
from sentinel.auth.store import (
    MAX_LIVE_CREDENTIALS,
    AuthRecord,
    change_auth,
    read_auth,
    read_issued,
    read_public_keys,
    record_issued,
)
from sentinel.errors import (
    DecodeError,
    RotationFailed,
    SentinelError,
    SigningRequired,
    ValidationError,
)
from sentinel.registry.layout import validate_name
from sentinel.registry.records import MAX_AUTH_VERSION
from sentinel.telemetry import auth_rotation

log = logging.getLogger(__name__)


class CredentialBackend(Protocol):
    """Where credentials are made and revoked: a database, a mail relay, a queue broker.

    ``create`` returns the new credential's fields (``user``, ``password``, ...) for
    ``version``; ``revoke`` makes that version stop working. Both must be idempotent: a
    rotation retried after a failure may call them again for the same version.
    """

    def create(self, service: str, client: str, version: int) -> Mapping[str, Any]: ...

    def revoke(self, service: str, client: str, version: int) -> None: ...


def live_versions(zk: KazooClient, service: str, client: str) -> tuple[int, ...]:
    """The versions published for (service, client), newest first; () when none."""
    try:
        record, _ = read_auth(zk, service, client)
    except DecodeError:
        return ()
    return () if record is None else record.versions


def require_signing_key(zk: KazooClient, signer: ManagerKey | None) -> None:
    """SigningRequired if the namespace is secured and there is no key to sign with: its
    clients refuse unsigned credentials, so publishing one would only take theirs away."""
    if signer is None and acl.is_secured(zk):
        raise SigningRequired(
            "the namespace is secured, so its clients accept only signed credentials: give "
            "the manager's signing key (signer=ManagerKey.load(...), or --signing-key / "
            "$SENTINEL_AUTH_SIGNING_KEY_FILE on the command line); nothing was written"
        )


def next_version(published: tuple[int, ...], issued: int) -> int:
    """The version after every one published (newest first) and every one issued.

    Confirmations play no part: a ``/clients`` entry is the client's to write (and, where
    ZooKeeper hides digests, anyone's who claims its user name), so a version read there
    would let a writer of one push the next version as high as it likes.
    """
    return max(published[0] if published else 0, issued) + 1


def update_auth(
    zk: KazooClient,
    namespace: str,
    service: str,
    client: str,
    credential: Mapping[str, Any],
    *,
    signer: ManagerKey | None = None,
    keep: Iterable[int] = (),
) -> int:
    """Publish ``credential`` as the newest version for (service, client); return the version.

    Versions older than the new one are dropped unless listed in ``keep``. Validation,
    the signing requirement and encryption happen before anything is written. The version is
    :func:`next_version` of what is published and what live processes confirmed.
    """
    validate_name("service", service)
    validate_name("client", client)
    validate_credential(credential)
    require_signing_key(zk, signer)
    keep = set(keep)
    slot_owner(zk, client)  # refuses a key slot someone other than the client may have written
    recipient = read_public_keys(zk, client).keys[0]  # the newest key; read once, not per retry
    issued = read_issued(zk, service, client)

    def change(current: AuthRecord | None) -> AuthRecord:
        version = next_version(() if current is None else current.versions, issued)
        if version > MAX_AUTH_VERSION:
            raise ValidationError(f"{service}/{client} has used every credential version")
        envelope = seal(
            credential,
            recipient,
            namespace=namespace,
            service=service,
            client=client,
            version=version,
            signer=signer,
        )
        kept = [e for e in (current.envelopes if current else ()) if e["version"] in keep]
        if len(kept) + 1 > MAX_LIVE_CREDENTIALS:
            raise ValidationError(
                f"{service}/{client} would hold more than {MAX_LIVE_CREDENTIALS} credentials"
            )
        return AuthRecord(service, client, (envelope, *kept))

    version = change_auth(zk, service, client, change).versions[0]
    record_issued(zk, service, client, version)
    log.info("published credential v%d for client %s of %s", version, client, service)
    return version


def withdraw(zk: KazooClient, service: str, client: str, versions: Iterable[int]) -> None:
    """Remove some versions from ``/auth/<service>/<client>`` (the node goes when none is left)."""
    gone = set(versions)

    def change(current: AuthRecord | None) -> AuthRecord | None:
        if current is None:
            return None
        left = tuple(e for e in current.envelopes if e["version"] not in gone)
        return AuthRecord(service, client, left) if left else None

    change_auth(zk, service, client, change)


@dataclass(frozen=True)
class RotationResult:
    """A completed rotation: the new version per client and how long confirmation took."""

    service: str
    versions: Mapping[str, int]
    revoked: Mapping[str, tuple[int, ...]]
    confirmed_in: float


class Rotation:
    """Procedure 2 for one service and one or more of its clients.

    Example::

        rotation = Rotation(zk, "/sentinel", "billing-db", ["billing-api"], backend)
        result = rotation.run(timeout=30)      # RotationFailed names the step (and laggards)
    """

    def __init__(
        self,
        zk: KazooClient,
        namespace: str,
        service: str,
        clients: Iterable[str],
        backend: CredentialBackend,
        *,
        signer: ManagerKey | None = None,
    ) -> None:
        self._zk = zk
        self._namespace = namespace
        self.service = validate_name("service", service)
        self.clients = tuple(validate_name("client", c) for c in clients)
        if not self.clients:
            raise ValidationError("a rotation needs at least one client")
        self._backend = backend
        self._signer = signer

    def __repr__(self) -> str:
        return f"Rotation(service={self.service!r}, clients={self.clients!r})"

    def run(self, timeout: float = 30.0) -> RotationResult:
        """Create, publish, confirm and revoke; see the module's description.

        Raises :class:`~sentinel.errors.SigningRequired` before the backend creates anything
        when the namespace is secured and the rotation has no signing key.
        """
        require_signing_key(self._zk, self._signer)
        confirmation_owners(self._zk, self.clients)  # key slots and namespace, before `create`
        auth_rotation(self.service, "started")
        try:
            return self._run(timeout)
        except RotationFailed:
            auth_rotation(self.service, "failed")
            raise

    def _run(self, timeout: float) -> RotationResult:
        old = {c: live_versions(self._zk, self.service, c) for c in self.clients}
        new: dict[str, int] = {}
        try:
            for client in self.clients:
                issued = read_issued(self._zk, self.service, client)
                version = next_version(old[client], issued)
                credential = self._step(
                    "create", self._backend.create, self.service, client, version
                )
                self._step(
                    "publish",
                    update_auth,
                    self._zk,
                    self._namespace,
                    self.service,
                    client,
                    credential,
                    signer=self._signer,
                    keep=old[client],
                )
                new[client] = version
        except RotationFailed as failed:
            if not new:
                raise
            # Published is kept (see the module's description): both live and valid.
            published = ", ".join(f"{c} v{v}" for c, v in new.items())
            raise RotationFailed(
                failed.step,
                f"{failed.detail}; new credentials stay published next to the old ones for "
                f"{published}: finish with 'sentinel auth rotate --service {self.service} "
                "--resume'",
            ) from failed.__cause__
        return self.complete(new, timeout)

    def resume(self, timeout: float = 30.0) -> RotationResult:
        """Finish a rotation whose confirmation timed out: the newest version is the new one."""
        live = {c: live_versions(self._zk, self.service, c) for c in self.clients}
        return self.complete({c: v[0] for c, v in live.items() if len(v) > 1}, timeout)

    def complete(self, versions: Mapping[str, int], timeout: float = 30.0) -> RotationResult:
        """Steps 3 and 4 for versions already published (also: finish a timed-out rotation)."""
        started = time.monotonic()
        self._confirm(versions, timeout)
        confirmed_in = time.monotonic() - started
        revoked: dict[str, tuple[int, ...]] = {}
        for client, version in versions.items():
            older = tuple(v for v in live_versions(self._zk, self.service, client) if v < version)
            self._step("revoke", withdraw, self._zk, self.service, client, older)
            for old_version in older:
                self._step("revoke", self._backend.revoke, self.service, client, old_version)
            revoked[client] = older
        log.info("rotation of %s done: %s", self.service, dict(versions))
        auth_rotation(self.service, "completed")
        return RotationResult(self.service, dict(versions), revoked, confirmed_in)

    def _step(self, step: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            # The cause's type and message: backends and Sentinel put no secrets in them.
            detail = str(exc) if isinstance(exc, SentinelError) else type(exc).__name__
            raise RotationFailed(step, f"{detail}; the old credential is still valid") from exc

    def _confirm(self, versions: Mapping[str, int], timeout: float) -> None:
        """Wait until every live client reports its new version, woken by watches.

        The deadline holds within a pass too: however many entries were added under
        ``/clients/<service>``, the wait ends at ``timeout``, naming what it could not read.
        """
        changed = threading.Event()

        def wake(_event: object) -> None:
            changed.set()

        deadline = time.monotonic() + timeout
        entries = ClientEntries(
            self._zk,
            self.service,
            owners=confirmation_owners(self._zk, versions),
            watch=wake,
        )
        while True:
            changed.clear()
            census = entries.read(deadline)
            laggards = sorted(
                name
                for client, version in versions.items()
                for name, applied in census.processes.get(client, {}).items()
                if not _reached(applied, version)
            )
            if not laggards and not census.unread:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                unread = (
                    f"{census.unread:,} entries under {entries.parent} were still unread and "
                    if census.unread
                    else ""
                )
                lagging = (
                    f"{', '.join(laggards)} had not applied the new credential"
                    if laggards
                    else "no process was seen to apply the new credential"
                )
                raise RotationFailed(
                    "confirm",
                    f"{unread}{lagging} after {timeout:g}s; both old and new are published and "
                    f"valid; finish with 'sentinel auth rotate --service {self.service} "
                    "--resume'",
                    tuple(laggards),
                )
            # Watches wake us at once; the cap re-checks in case one fired between reads.
            changed.wait(min(remaining, 1.0))


def _is_version(applied: object) -> bool:
    return isinstance(applied, int) and not isinstance(applied, bool)


def _reached(applied: object, version: int) -> bool:
    return _is_version(applied) and applied >= version  # type: ignore[operator]
