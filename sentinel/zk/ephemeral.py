"""Ephemeral nodes that a client keeps for as long as it lives, across session expiry.

ZooKeeper removes a session's ephemeral nodes when the session ends. When it expires while the
process lives on, kazoo connects again with a new session and :class:`EphemeralNodes` re-creates
every node it keeps. A node that still carries another session (the server has not expired a
crashed predecessor yet, or another process took the name) is deleted and re-created in one
transaction (the new node one version above the old, see ``_TRUSTED_VERSIONS``), so watchers
see the change and the node belongs to the live session. A connection that merely flaps keeps
its session, and then nothing is written.

Some nodes are bookkeeping that must never fail the caller (a client's ``/clients`` entry): put
with ``keep_trying``, a failed write is logged once, counted and retried in the background.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from kazoo.client import KazooClient, KazooState, TransactionRequest
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.protocol.states import WatchedEvent

from sentinel.errors import LabelTaken, RegistryConflict

log = logging.getLogger(__name__)

_WRITE_ATTEMPTS = 5
_RETRY_AFTER_FAILURE = 1.0
_RETRY_MAX_DELAY = 30.0
# A take-over writes the successor's node one version above the node it replaces while that
# node's version is below this bound, so that the one-request delete of a node known at such a
# version never matches its direct successor (remove() trusts only these versions). Each step
# is one more op in the take-over's transaction: the bound keeps it small.
_TRUSTED_VERSIONS = 8


def first_failure(results: list[object]) -> Exception | None:
    """The first real failure of a committed transaction (kazoo returns errors as results)."""
    for result in results:
        if isinstance(result, Exception) and type(result).__name__ != "RolledBackError":
            return result
    return None


class EphemeralNodes:
    """Keeps a set of ephemeral nodes alive for one kazoo client."""

    def __init__(self, zk: KazooClient) -> None:
        self._zk = zk
        # Serialises writes between the callers' threads and the restoring worker; kazoo's own
        # thread never takes it (its callbacks must not block).
        self._lock = threading.Lock()
        self._nodes: dict[str, bytes] = {}
        self._prepare: dict[str, Callable[[], None]] = {}
        # keep_trying nodes whose last write failed -> seconds until the next attempt
        self._unwritten: dict[str, float] = {}
        self._on_failure: dict[str, Callable[[], None]] = {}
        # path -> check of another session's node before it is taken over (raises to refuse)
        self._may_take_over: dict[str, Callable[[bytes], None]] = {}
        # path -> rule for what another client wrote into our node (see follow()), and the
        # followed paths changed since the worker last looked (kazoo's thread adds to it)
        self._follow: dict[str, Callable[[bytes, bytes], bytes | None]] = {}
        self._changed: set[str] = set()
        # What the last watch-setting read of a followed node found, so that a deregistration
        # needs no read: path -> (our node's version, or None when the node is another
        # session's or missing; the path's watch events heard then; connection losses then).
        # "Ours at this version" is trusted only while both counts are unchanged (kazoo's
        # threads bump them): an event or a lost connection since makes it unknown, and the
        # delete reads first. "Not ours" stays true until this session writes the node again
        # (each write forgets what was seen): only our own writes make a node ours.
        self._seen: dict[str, tuple[int | None, int, int]] = {}
        self._events: dict[str, int] = {}
        self._losses = 0
        self._session_id: int | None = None
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._worker: threading.Thread | None = None

    def start(self) -> None:
        """Begin watching the session; call once the client is connected."""
        self._session_id = self._zk.client_id[0]
        self._zk.add_listener(self._on_state)
        self._worker = threading.Thread(target=self._run, name="sentinel-ephemeral", daemon=True)
        self._worker.start()

    def close(self, timeout: float | None = None) -> bool:
        """Stop the worker, waiting ``timeout`` seconds at most (None: as long as its write
        in progress takes); whether it has stopped. The session's end removes the nodes
        themselves, and fails a write that waits on a session that cannot reconnect: a caller
        that bounds the wait ends the session next, then calls :meth:`join`."""
        self._closed.set()
        self._wake.set()
        self._zk.remove_listener(self._on_state)
        return self.join(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a closed worker to end, ``timeout`` seconds at most; whether it has."""
        if self._worker is not None:
            self._worker.join(timeout)
            if self._worker.is_alive():
                return False
            self._worker = None
        return True

    def put(
        self,
        path: str,
        data: bytes,
        *,
        prepare: Callable[[], None] | None = None,
        keep_trying: bool = False,
        on_failure: Callable[[], None] | None = None,
        may_take_over: Callable[[bytes], None] | None = None,
        expect: bytes | None = None,
    ) -> bool:
        """Make ``path`` an ephemeral node of the current session holding ``data``, and keep it.

        ``prepare`` runs before every write of the node (to make its parent, say). With
        ``keep_trying`` a write that fails does not raise: it is logged (once until it
        succeeds), reported to ``on_failure`` (each failed attempt) and retried in the
        background, backing off to 30 s, until it is written or removed; False is returned then.
        ``may_take_over`` sees the value of a node another session holds at ``path`` before it
        is taken over, and raises (:class:`LabelTaken`) to refuse; the node is then left as it
        is, and a refused re-creation after a session expiry is logged and skipped. With
        ``expect``, nothing is written (False) unless what is kept for ``path`` is still
        ``expect``: a change computed from it is not written over what a :meth:`follow` rule
        adopted meanwhile.
        """
        with self._lock:
            if expect is not None and self._nodes.get(path) != expect:
                return False
            if prepare is not None:
                self._prepare[path] = prepare
            if on_failure is not None:
                self._on_failure[path] = on_failure
            if not keep_trying:
                self._write(path, data, may_take_over)
                self._nodes[path] = data
                if may_take_over is not None:
                    self._may_take_over[path] = may_take_over
                return True
            self._nodes[path] = data
            written = self._try_write(path, data)
        if not written:
            self._wake.set()
        return written

    def _try_write(self, path: str, data: bytes) -> bool:
        """Write a keep_trying node; on failure schedule its retry. Holds the lock."""
        try:
            self._write(path, data)
        except Exception as exc:
            on_failure = self._on_failure.get(path)
            if on_failure is not None:
                on_failure()
            delay = self._unwritten.get(path)
            if delay is None:
                log.warning("could not write %s (%r); retrying in the background", path, exc)
            self._unwritten[path] = min((delay or _RETRY_AFTER_FAILURE / 2) * 2, _RETRY_MAX_DELAY)
            return False
        if self._unwritten.pop(path, None) is not None:
            log.info("wrote %s after earlier failures", path)
        return True

    def kept(self, path: str) -> bytes | None:
        """What is kept for ``path`` now (None: not kept); pass it to :meth:`put` as
        ``expect``."""
        return self._nodes.get(path)

    def follow(self, path: str, adopt: Callable[[bytes, bytes], bytes | None]) -> None:
        """Watch the kept node ``path`` for writes by other clients (an operator's ``sentinel
        drain``): ``adopt(kept, found)`` returns the bytes to keep from now on (what is
        re-created after a session expiry) or None to ignore them. It runs on the worker,
        holding the lock, with what the node holds then; the watch is set by the worker too,
        so following costs the caller no round trip, and kazoo's thread only wakes it."""
        self._follow[path] = adopt
        self._changed.add(path)
        self._wake.set()

    def _node_changed(self, event: WatchedEvent) -> None:
        # Runs on kazoo's thread: only count the event, note the path and wake the worker.
        if event.path in self._follow:
            self._events[event.path] = self._events.get(event.path, 0) + 1
            self._changed.add(event.path)
            self._wake.set()

    def _adopt_changes(self) -> None:
        """Read each followed node that changed (setting its next watch) and apply its
        ``follow`` rule to what another client wrote there. On the worker."""
        while self._changed:
            path = self._changed.pop()
            with self._lock:
                adopt, kept = self._follow.get(path), self._nodes.get(path)
                if adopt is None or kept is None:
                    continue
                heard = self._events.get(path, 0), self._losses  # before the read is sent
                try:
                    found, stat = self._zk.get(path, watch=self._node_changed)
                    owned = stat.ephemeralOwner == self._session()
                except NoNodeError:
                    # Gone with a session: re-created with what is kept, then read. Not
                    # ours until then, which needs no watch to stay true.
                    self._seen[path] = (None, *heard)
                    continue
                except (ConnectionLoss, SessionExpiredError):
                    self._changed.add(path)  # read again once connected
                    return
                self._seen[path] = (stat.version if owned else None, *heard)
                if owned and found != kept:
                    kept = adopt(kept, found)
                    if kept is not None:
                        self._nodes[path] = kept

    def remove(self, path: str, mark: str | None = None) -> bool:
        """Stop keeping ``path`` and delete it if this session owns it; False if not kept.

        With ``mark`` (an instance node's :func:`~sentinel.registry.layout.departure_path`),
        the delete is one transaction that first creates and deletes that mark, so watchers
        hear the owner remove the node, which a session's expiry never does.

        A followed node (:meth:`follow`) is often known without a read: ours at the version
        its watch-setting read found, if that watch has reported nothing and the connection
        has not been lost since, deleted with one ``delete(path, version)``; or seen held by
        another session (a successor took it over) or missing since this session last wrote
        it, left without a request. Otherwise (never followed, changed since, or events
        possibly missed while disconnected) the ownership is read first and the delete is
        conditional on it. When a newer process registered the same identity (a rolling
        restart on the same host and port), the old one shutting down must not delete the new
        one's node, and its version alone does not tell them apart
        (docs/decisions/deregistration-reads-before-deleting.md).
        """
        with self._lock:
            # What is known, before the node stops being followed (from then on its events are
            # no longer counted): an event after this point is the race the read had too.
            known = self._known(path)
            data = self._forget(path)
            if data is None:
                return False
            if self._unwritten.pop(path, None) is not None:
                return True  # never written
            try:
                self._delete_own(path, known, mark)
            except BaseException:
                # Not known to be deleted (the connection dropped): keep the node, so that a
                # retry deletes it instead of answering "not held" while it lives on.
                self._nodes[path] = data
                raise
        return True

    def _forget(self, path: str) -> bytes | None:
        """Stop keeping and following ``path``; what was kept there (None: nothing). Holds
        the lock."""
        self._follow.pop(path, None)
        self._prepare.pop(path, None)
        self._on_failure.pop(path, None)
        self._may_take_over.pop(path, None)
        self._seen.pop(path, None)
        self._events.pop(path, None)
        return self._nodes.pop(path, None)

    def leave(self, marks: Mapping[str, str], timeout: float) -> list[str]:
        """Delete, in one transaction and each after its departure mark (see :meth:`remove`),
        every node of ``marks`` (path -> mark) known to be this session's without a read;
        wait ``timeout`` seconds at most; the paths deleted. For a client closing: the
        session's end deletes what is left, unmarked, as it always did."""
        with self._lock:
            owned = [(path, self._known(path)) for path in marks]
            versions = {
                path: known[1]
                for path, known in owned
                if known is not None and known[0] and known[1] < _TRUSTED_VERSIONS
            }
            if not versions:
                return []
            transaction = self._zk.transaction()
            for path, version in versions.items():
                _marked_delete(transaction, path, version, marks[path])
            pending = transaction.commit_async()
        try:
            failure = first_failure(pending.get(timeout=timeout))
        except Exception as exc:  # a timeout, a lost connection: the session's end removes them
            failure = exc
        if failure is not None:
            log.info("marked deletion failed (%r); the session's end removes the nodes", failure)
            return []
        with self._lock:
            for path in versions:
                self._forget(path)
        return list(versions)

    def owns(self, path: str) -> bool | None:
        """Whether the node at ``path`` is known to be this session's (True), known to be
        another's (False), or not known without a read (None). Holds no lock: a snapshot."""
        known = self._known(path)
        return None if known is None else known[0]

    def _known(self, path: str) -> tuple[bool, int] | None:
        """(ours, version) as the last watch-setting read left it, if still known (see
        ``_seen``): (False, -1) for a node this session has not written since it saw it
        another's or missing; (True, its version) if nothing was heard of it since."""
        seen = self._seen.get(path)
        if seen is None:
            return None
        version, events, losses = seen
        if version is None:
            return False, -1
        if (events, losses) != (self._events.get(path, 0), self._losses):
            return None
        return True, version

    def _delete_own(self, path: str, known: tuple[bool, int] | None, mark: str | None) -> None:
        if known is not None:
            ours, version = known
            if not ours:
                log.warning("%s belongs to another session now; left in place", path)
                return
            # A successor that took the node over since (its event not heard yet) holds it at
            # a higher version (see _write): this delete then fails and the read below tells.
            # Above the bound its version may be ours again: read first.
            if version < _TRUSTED_VERSIONS:
                try:
                    self._delete(path, version, mark)
                    return
                except NoNodeError:
                    return  # gone already (its session ended): nothing of ours is left
                except BadVersionError:
                    pass  # written since the read (a drain, a take-over): read who holds it
        stat = self._zk.exists(path)
        if stat is not None and stat.ephemeralOwner == self._session():
            try:
                self._delete(path, stat.version, mark)
            except NoNodeError:
                pass  # deleted meanwhile (a retirement, the session's end): what was wanted
            except BadVersionError:
                log.warning("%s changed while being removed; left as it is", path)
        elif stat is not None:
            log.warning("%s belongs to another session now; left in place", path)

    def _delete(self, path: str, version: int, mark: str | None) -> None:
        """``delete(path, version)``, after creating and deleting ``mark`` in the same
        transaction when there is one; raises what the delete failed with."""
        if mark is None:
            self._zk.delete(path, version=version)
            return
        transaction = self._zk.transaction()
        _marked_delete(transaction, path, version, mark)
        failure = first_failure(transaction.commit())
        if isinstance(failure, NodeExistsError):
            # A node squats on the mark (written by someone who may write the service): the
            # node is deleted unmarked, as a session's end would delete it.
            log.warning("%s exists and is no departure mark; %s deleted unmarked", mark, path)
            self._zk.delete(path, version=version)
        elif failure is not None:
            raise failure

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's thread: only count a lost connection (events may be missed until
        # the watches are set again, so what was seen is no longer known) and wake the worker,
        # never touch ZooKeeper here.
        if state == KazooState.CONNECTED:
            self._wake.set()
        else:
            self._losses += 1

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
            timeout = self._retry_unwritten()
            self._adopt_changes()
            client_id = self._zk.client_id
            if client_id is None:
                continue  # dropped again since the check above; the next CONNECTED wakes us
            session_id = client_id[0]
            if session_id == self._session_id:
                continue  # same session: the nodes are still there
            try:
                restored = self._restore_all()
            except (ConnectionLoss, SessionExpiredError):
                continue  # the next CONNECTED wakes us again
            except Exception:
                log.exception("restoring ephemeral nodes failed; retrying")
                timeout = _RETRY_AFTER_FAILURE
                continue
            timeout = self._retry_unwritten()
            self._session_id = session_id
            log.info("new ZooKeeper session 0x%x: re-created %d node(s)", session_id, restored)
            # A new session has none of the old one's watches: read the followed nodes again.
            self._changed.update(list(self._follow))
            self._adopt_changes()

    def _restore_all(self) -> int:
        restored = 0
        for path in list(self._nodes):
            with self._lock:
                data = self._nodes.get(path)
                if data is None or path in self._unwritten:
                    continue  # removed meanwhile, or retried on its own schedule
                try:
                    self._write(path, data, self._may_take_over.get(path))
                except LabelTaken as exc:
                    log.error("not re-creating %s after the session expired: %s", path, exc)
                    continue
                restored += 1
        return restored

    def _retry_unwritten(self) -> float | None:
        """Write the keep_trying nodes that failed; seconds until the next retry, if any."""
        with self._lock:
            for path in list(self._unwritten):
                self._try_write(path, self._nodes[path])
            return min(self._unwritten.values(), default=None)

    def _session(self) -> int:
        """The current session's id. kazoo clears it when the connection drops, which can
        happen between two requests of one write: then it is a ConnectionLoss like any other."""
        client_id = self._zk.client_id
        if client_id is None:
            raise ConnectionLoss()
        return client_id[0]

    def _write(
        self, path: str, data: bytes, may_take_over: Callable[[bytes], None] | None = None
    ) -> None:
        known = self._known(path)
        self._seen.pop(path, None)  # our own write changes the version: read it again
        if known is not None and known[0]:
            # Known to be ours at that version (a followed node, nothing heard since its
            # watch read it): one conditional set, the only write an update makes (the
            # create below would be a failed write first). A node changed or taken over
            # since is at another version (below _TRUSTED_VERSIONS a successor is always one
            # above; past it, it would need as many writes of its own while this set is in
            # flight): then the general path below, which reads who holds it.
            try:
                self._zk.set(path, data, version=known[1])
                return
            except (BadVersionError, NoNodeError):
                pass
        prepare = self._prepare.get(path)
        if prepare is not None:  # every write, a re-creation after an expiry too
            prepare()
        for _ in range(_WRITE_ATTEMPTS):
            try:
                self._zk.create(path, data, ephemeral=True)
                return
            except NodeExistsError:
                pass
            try:
                held, stat = self._zk.get(path)
            except NoNodeError:
                continue
            if stat.ephemeralOwner == self._session():
                try:
                    self._zk.set(path, data, version=stat.version)
                    return
                except (BadVersionError, NoNodeError):
                    continue
            if may_take_over is not None:
                may_take_over(held)
            log.warning("taking over %s from session 0x%x", path, stat.ephemeralOwner)
            transaction = self._zk.transaction()
            transaction.delete(path, version=stat.version)
            # Versions 1..v+1 by empty writes and the last one carrying the data (the
            # transaction stays one value's size); at and above the bound, version 0.
            steps = stat.version + 1 if stat.version < _TRUSTED_VERSIONS else 0
            transaction.create(path, b"" if steps else data, ephemeral=True)
            for step in range(steps):
                transaction.set_data(path, data if step == steps - 1 else b"")
            if first_failure(transaction.commit()) is None:
                return
        raise RegistryConflict(f"{path} kept changing during {_WRITE_ATTEMPTS} write attempts")


def _marked_delete(transaction: TransactionRequest, path: str, version: int, mark: str) -> None:
    """Add to ``transaction`` the ops of one marked deletion: ``mark`` created and deleted,
    then ``path`` deleted at ``version``. Watchers of the parent hear the mark's two events
    just before the node's deletion, in the same notification order, and no reader ever finds
    the mark (the transaction is atomic)."""
    transaction.create(mark, ephemeral=True)
    transaction.delete(mark)
    transaction.delete(path, version=version)
