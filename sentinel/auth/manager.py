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

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import Id

from sentinel.auth import acl
from sentinel.auth.enrolment import enrolled_owner, owned_by, slot_owner
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
from sentinel.registry.layout import AUTH_KEYS, CLIENTS, auth_keys_path, validate_name
from sentinel.registry.reads import pipelined, pipelined_reads, valid_children
from sentinel.registry.records import MAX_AUTH_VERSION, ClientRecord
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


def confirmation_owners(zk: KazooClient, clients: Iterable[str]) -> dict[str, Id | None] | None:
    """In a secured namespace, the identity whose ``/clients`` entries speak for each client
    (:func:`live_processes`' ``owners``); None in an open one, where every entry counts."""
    if not acl.is_secured(zk):
        return None
    return {client: slot_owner(zk, client) for client in clients}


def enrolled_owners(zk: KazooClient) -> dict[str, Id | None] | None:
    """In a secured namespace, the identity enrolled for every client with a key slot, to
    tell whose ``/clients`` entries are whose (:class:`ClientEntries`); None in an open one.

    Read-only (it checks no write right, unlike :func:`confirmation_owners`), for reports: a
    slot not as enrolled is left out, so entries naming its client count for nobody.
    """
    if not acl.is_secured(zk):
        return None
    admins = acl.admins(zk)
    owners: dict[str, Id | None] = {}
    for client in valid_children(zk, AUTH_KEYS):
        try:
            entries, _ = zk.get_acls(auth_keys_path(client))
            owners[client] = enrolled_owner(entries, admins)
        except (NoNodeError, ValueError):
            continue  # gone, or not as enrolled: `sentinel doctor` names it
    return owners


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
class Census:
    """Who uses a service now, by auth client, and how many entries count for nobody.

    ``processes``: auth client -> {``/clients`` node name: applied version}. ``ignored``: why
    entries count for no client (``"persistent"``, ``"not an enrolled identity's"``, ...) ->
    how many. ``unread``: entries left unread because the deadline passed. ``records``: the
    decoded entries that count, by node name (what ``sentinel ls`` and ``doctor`` show of
    them).
    """

    processes: dict[str, dict[str, Any]]
    ignored: Mapping[str, int]
    unread: int = 0
    records: Mapping[str, ClientRecord] = field(default_factory=dict)


class ClientEntries:
    """The entries under ``/clients/<service>``, read incrementally for repeated passes.

    Anyone may add entries there (``init --secure`` grants CREATE to all), so what one costs
    must stay small. Each entry is read once and its outcome kept until a watch says it
    changed or went: a later pass costs a listing plus the entries that changed. In a secured
    namespace (``owners``: auth client -> its enrolled identity, see
    :func:`~sentinel.auth.enrolment.slot_owner`) an entry is read in stages, each bounded
    whatever its writer put there: its stat (a persistent entry is no live process's), its
    ACL (only one an owner in ``owners`` could have written goes on), and only then its data
    (which must name that owner's client). Junk costs one stat per rotation.
    """

    def __init__(
        self,
        zk: KazooClient,
        service: str,
        *,
        owners: Mapping[str, Id | None] | None = None,
        watch: Callable[..., Any] | None = None,
    ) -> None:
        self._zk = zk
        self.service = service
        self.parent = f"{CLIENTS}/{service}"
        self._owners = owners
        self._watch = watch
        self._admins = acl.admins(zk) if owners is not None else frozenset()
        # name -> (client, version) when it counts, (None, reason) when it does not.
        self._known: dict[str, tuple[str | None, Any]] = {}
        self._records: dict[str, ClientRecord] = {}  # of the names that count and decode
        self._stale: set[str] = set()  # filled by watches (kazoo's thread), drained per pass
        # Without a watch nothing says what changed, so nothing is kept between passes.
        self._node_watch = self._wake if watch is not None else None

    def _wake(self, event: Any) -> None:
        if event.path and event.path != self.parent:
            self._stale.add(event.path.rpartition("/")[2])
        if self._watch is not None:
            self._watch(event)

    def read(self, deadline: float | None = None) -> Census:
        """One pass: list, read what is new or changed, and say who uses the service.

        With a ``deadline`` (``time.monotonic()``), reading stops once it passes, within the
        pass, and the entries left unread are counted in :attr:`Census.unread`.
        """
        try:
            names = self._zk.get_children(self.parent, watch=self._node_watch)
        except NoNodeError:
            names = []
        if self._node_watch is None:
            self._known.clear()
        while self._stale:
            self._known.pop(self._stale.pop(), None)
        listed = set(names)
        for name in [n for n in self._known if n not in listed]:
            del self._known[name]
        unread = self._classify([n for n in names if n not in self._known], deadline)
        processes: dict[str, dict[str, Any]] = {}
        ignored: dict[str, int] = {}
        for name, (client, outcome) in self._known.items():
            if client is None:
                ignored[outcome] = ignored.get(outcome, 0) + 1
            else:
                processes.setdefault(client, {})[name] = outcome
        counted = {name for names in processes.values() for name in names}
        self._records = {n: r for n, r in self._records.items() if n in counted}
        if ignored:
            log.debug("%s: ignoring entries that count for no client: %s", self.parent, ignored)
        return Census(processes, ignored, unread, dict(self._records))

    def _classify(self, names: list[str], deadline: float | None) -> int:
        """Read ``names`` into ``_known``; how many were left unread at the deadline."""
        matches: dict[str, frozenset[str]] = {}
        if self._owners is not None:
            names, unread = self._ephemeral(names, deadline)
            if not unread:
                matches, unread = self._owned(names, deadline)
            if unread:
                return unread
            names = list(matches)
        reads = pipelined_reads(self._zk, names, self._path, watch=self._node_watch)
        for done, (name, result) in enumerate(reads):
            if _passed(deadline):
                return len(names) - done
            try:
                data, _ = result.get()
            except NoNodeError:
                continue
            except NoAuthError:  # its writer shut it to this session: it confirms nothing
                self._known[name] = (None, "unreadable")
                continue
            record: ClientRecord | None
            try:
                record = ClientRecord.from_bytes(self.service, name, self._path(name), data)
                client, version = record.confirms_for, record.auth_version
                gone = record.left is not None
            except DecodeError:
                record = None
                client, version = name, None  # counts as its name's, confirming nothing
                gone = False
            if self._owners is not None and client not in matches[name]:
                log.warning(
                    "ignoring %s/%s: not written by %s's enrolled identity",
                    self.parent,
                    name,
                    client,
                )
                self._known[name] = (None, "not its client's identity")
            elif gone:  # its writer marked it: the process left (see sentinel.agent.server)
                self._known[name] = (None, "left")
            else:
                self._known[name] = (client, version)
                if record is None:
                    self._records.pop(name, None)
                else:
                    self._records[name] = record
        return 0

    def _ephemeral(self, names: list[str], deadline: float | None) -> tuple[list[str], int]:
        """The names whose entry is ephemeral (a live process's); persistent ones are known
        as ignored. A stat is all this reads, whatever the entry's size."""
        kept: list[str] = []
        exists = functools.partial(self._zk.exists_async, watch=self._node_watch)
        for done, (name, result) in enumerate(pipelined(exists, names, self._path)):
            if _passed(deadline):
                return kept, len(names) - done
            stat = result.get()
            if stat is None:
                continue  # deleted since the listing
            if stat.ephemeralOwner:
                kept.append(name)
            else:
                self._known[name] = (None, "persistent")
        return kept, 0

    def _owned(
        self, names: list[str], deadline: float | None
    ) -> tuple[dict[str, frozenset[str]], int]:
        """For each name whose ACL only an owner in ``owners`` could have written, the
        clients it may speak for; the others are known as ignored."""
        owners = self._owners or {}
        matches: dict[str, frozenset[str]] = {}
        acls = pipelined(self._zk.get_acls_async, names, self._path)
        for done, (name, result) in enumerate(acls):
            if _passed(deadline):
                return matches, len(names) - done
            try:
                entries, _ = result.get()
            except NoNodeError:
                continue
            except NoAuthError:  # ZooKeeper shows an ACL only to who may read the node
                self._known[name] = (None, "unreadable")
                continue
            clients = frozenset(
                client for client, owner in owners.items() if owned_by(entries, owner, self._admins)
            )
            if clients:
                matches[name] = clients
            else:
                self._known[name] = (None, "not an enrolled identity's")
        return matches, 0

    def _path(self, name: str) -> str:
        return f"{self.parent}/{name}"


def _passed(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def live_processes(
    zk: KazooClient,
    service: str,
    watch: Callable[..., Any] | None = None,
    *,
    owners: Mapping[str, Id | None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Who uses ``service`` now: auth client -> {``/clients`` node name: applied version}.

    A node names its auth client (processes of one application share one, each with a node of
    its own); older nodes without the field are their own auth client. A node that cannot be
    decoded counts as its name's and as having confirmed nothing. ``watch`` is set on the list
    and on every node read, so a waiter wakes on any change.

    ``owners`` (in a secured namespace: auth client -> the identity enrolled for it, see
    :func:`~sentinel.auth.enrolment.slot_owner`) makes a node count only for a client in it
    and only if that client's identity owns it: anyone may add a node under
    ``/clients/<service>``, and a forged one neither confirms for a client nor holds its
    rotation up. That holds for an undecodable node too (a squatter's garbage, perhaps with an
    ACL the admin cannot undo), and for a persistent node, which no live process's entry is.
    :class:`ClientEntries` also says how many were ignored, and why.
    """
    return ClientEntries(zk, service, owners=owners, watch=watch).read().processes


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
