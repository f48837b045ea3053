"""Who uses a service now: the entries under ``/clients/<service>``, and whose each one is.

Rotations wait on these entries (:mod:`sentinel.auth.manager`), and ``sentinel auth status``,
``ls`` and ``doctor`` report them. Anyone may add an entry there (``init --secure`` grants
CREATE to all), so in a secured namespace an entry counts only for the client whose enrolled
identity wrote it. Reading them needs no key and no cipher: this module imports neither, so a
command that only reports (``sentinel ls``) starts without the cryptography library.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import Id

from sentinel.auth import acl
from sentinel.auth.enrolment import enrolled_owner, owned_by, slot_owner
from sentinel.errors import DecodeError
from sentinel.registry.layout import AUTH_KEYS, CLIENTS, auth_keys_path
from sentinel.registry.reads import pipelined, pipelined_reads, valid_children
from sentinel.registry.records import ClientRecord

log = logging.getLogger(__name__)


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
