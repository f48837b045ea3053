"""Fan-out: each change of the agent's session handed to every connection following it, and
the frames each connection is sent.

The cache's worker hands each change of a service to :meth:`Fanout.on_swap`, which encodes
its delta once and hands the same bytes to every connection following the service; a
connection keeps them in order, bounded per service (past the bound they collapse into the
service's whole state, built when sent), and its frames are built only once the last ones
were written, so a slow process costs the agent that bound and one batch of frames, and is
sent the latest state when it reads again. A service whose frame cannot be sent is an
``error`` frame naming it, the link kept. Frames are built on a few frame workers, never on
the loop; the loop (:class:`~sentinel.agent.connection.Server`) writes what the socket did
not take at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from sentinel import telemetry
from sentinel.agent import changes
from sentinel.agent.connection import LOGGER, Connection, Server, Workers
from sentinel.agentlink import protocol
from sentinel.agentlink.link import error_answer
from sentinel.cache.snapshot_file import policy_entry, service_entry
from sentinel.cache.views import ServiceSnapshot
from sentinel.errors import AgentServiceUnavailable
from sentinel.events import ChangeEvent, ConnectionChanged, ShardKeysChanged
from sentinel.registry.records import utf8_json
from sentinel.shards.maps import DirectoryMap
from sentinel.shards.spec import bucket_of, bucket_path, encode_bucket, policy_path

if TYPE_CHECKING:
    from sentinel.agent.admission import Admission
    from sentinel.agent.credentials import Credentials
    from sentinel.client import Sentinel

log = logging.getLogger(LOGGER)

# Threads building frames: a fixed few, whatever the connections.
FRAME_WORKERS = 2


class Fanout:
    """The changes of ``sentinel``'s session sent to ``admission``'s connections, and the
    frames built for each (its credential nodes as ``credentials`` read them), handed to
    ``server``'s loop to write. ``deltas``: a change sent as what changed (False: the
    service's whole state). ``max_frame_bytes``: the largest frame sent."""

    def __init__(
        self,
        sentinel: Sentinel,
        admission: Admission,
        credentials: Credentials,
        server: Server,
        *,
        deltas: bool,
        max_frame_bytes: int,
    ) -> None:
        self._sentinel = sentinel
        self._admission = admission
        self._credentials = credentials
        self._server = server
        self._deltas = deltas
        self._max_frame_bytes = max_frame_bytes
        # service -> (the number of its last change, the snapshot after it), as the cache's
        # worker swapped it in; and the JSON of the snapshot's nodes, encoded once for every
        # whole state sent of it. Under the admission's lock.
        self._published: dict[str, tuple[int, ServiceSnapshot]] = {}
        self._encoded: dict[str, tuple[ServiceSnapshot, bytes]] = {}
        self._frames = Workers(FRAME_WORKERS, "sentinel-agent-frames")

    def close(self) -> None:
        """Wait for the frames under way; build no more."""
        self._frames.shutdown()

    # --- changes (the agent cache's worker; kazoo's thread for credentials) ---------------------

    def on_change(self, event: ChangeEvent) -> None:
        """Mark a change of the session or of a shard map on every connection; a service's
        changes are :meth:`on_swap`'s. Nothing here waits."""
        connections = self._admission.connected()
        if isinstance(event, ConnectionChanged):
            for connection in connections:
                connection.mark(connection=True)
        elif isinstance(event, ShardKeysChanged):
            for connection in connections:
                connection.mark(policy=event.policy, keys=event.changes)

    def on_swap(
        self,
        service: str,
        old: ServiceSnapshot,
        new: ServiceSnapshot | None,
        names: Collection[str] | None,
    ) -> None:
        """A service's snapshot replaced in the agent's cache (None: dropped): number the
        change, encode what changed once, and hand the same frame to every connection
        following the service (the whole state when a delta cannot say it, or would be
        larger than a frame may be). On the cache's worker; nothing here waits."""
        fields = None
        if new is not None and self._deltas:
            try:
                fields = changes.delta(service, old, new, names)
            except Exception:  # the agent's own bug: its processes are sent the whole state
                log.exception("agent: the change of %s could not be told as a delta", service)
        with self._admission.lock:
            number = self._published.get(service, (0, old))[0] + (fields != {})
            if new is None:
                self._published.pop(service, None)
                self._encoded.pop(service, None)
            else:
                self._published[service] = (number, new)
            connections = list(self._admission.connections)
        if fields == {}:
            return  # nothing a process holds (the agent's own credential)
        change = None
        if fields is not None:
            frame = protocol.encode({"op": "delta", "service": service, "seq": number, **fields})
            change = None if len(frame) > self._max_frame_bytes else (number, frame)
        for connection in connections:
            connection.mark_service(service, change)

    # --- what a connection is sent, built on the frame workers ------------------------------

    def schedule(self, connection: Connection) -> None:
        """Have a frame worker build what is due, unless one is on it or the last frames
        are not written yet (then what is due waits, merged, for the process to read them).
        Deltas and credential frames alone are built already: written from here at once (the
        loop woken only for what the socket does not take), no worker between a change and
        its write."""
        with connection.due:
            if (
                connection.closed
                or connection.flushing
                or connection.out
                or not (connection.welcomed or connection.replies)  # the welcome goes first
                or not (
                    connection.replies
                    or connection.pending
                    or connection.keys
                    or connection.connection
                )
            ):
                return
            built = not (
                connection.replies
                or connection.pending.whole
                or connection.keys
                or connection.connection
            )
            if built:  # written from here as a frame worker writes them (see :meth:`_flush`)
                credentials, _, deltas = connection.pending.take()
                connection.sent_at = time.monotonic()  # the send timeout counts from now
                connection.out.extend(self._built_frames(connection, credentials, deltas))
                broken = connection.send_out()
                written = not connection.out
            else:
                connection.flushing = True
        if not built:
            self._frames.submit(self._flush, connection)
        elif broken:
            self._server.drop(connection, None)
        elif not written:
            self._server.call_loop(connection)

    def _built_frames(
        self,
        connection: Connection,
        credentials: dict[str, bytes],
        deltas: dict[str, list[tuple[int, bytes]]],
    ) -> list[bytes]:
        """The frames of changes encoded already (shared by the connections they go to), in
        the order they go: credential frames (a state built after them holds a credential at
        least as new), then each service's deltas newer than the whole state sent of it."""
        frames = [self._shared(frame, "auth") for frame in credentials.values()]
        for service, queued in deltas.items():
            sent = connection.numbers.get(service, 0)
            frames += [self._shared(f, "delta") for number, f in queued if number > sent]
        return frames

    def _flush(self, connection: Connection) -> None:
        """A frame worker's: build what is due, latest state first-come, and hand the frames
        to the loop; any failure drops this connection only."""
        with connection.due:
            if connection.closed:
                connection.flushing = False
                return
            replies, connection.replies = connection.replies, []
            credentials, services, deltas = connection.pending.take()
            keys, connection.keys = connection.keys, {}
            state, connection.connection = connection.connection, False
        frames: list[bytes] = []
        try:
            frames += self._built_frames(connection, credentials, {})  # see _built_frames
            for message in replies:
                if message["op"] == "service":
                    # Followed from here: a change after this marks it, and the state sent
                    # now holds every change before. No change frame of a service goes out
                    # before its answer.
                    with connection.due:
                        connection.followed.add(message["service"])
                    service, request = message["service"], message["id"]
                    frames.append(self._service_frame(connection, service, request))
                else:
                    frames.append(self._frame(message))
            for service in sorted(services):
                frames.append(self._service_frame(connection, service))
            frames += self._built_frames(connection, {}, deltas)  # after the states sent
            for policy, changed in keys.items():
                frames.append(self._frame(self._keys_message(connection, policy, changed)))
            if state:
                frames.append(self._frame(self.connection_message("connection")))
        except Exception:  # a bug of the agent's own: logged, and the process reconnects
            log.exception("agent: dropping pid %d: its frames could not be built", connection.pid)
            with connection.due:
                connection.flushing = False
            return self._server.drop(connection, "error")
        with connection.due:
            connection.flushing = False
            if connection.closed:
                return
            if not connection.out:
                connection.sent_at = time.monotonic()  # the send timeout counts from now
            connection.out.extend(frames)
            # Written from here what the socket takes now (a frame of a few KB: all of it),
            # the loop woken only for the rest: one thread's wake-up per change, not two.
            broken = connection.send_out()
            written = not connection.out
        if broken:
            return self._server.drop(connection, None)
        if written:
            self.schedule(connection)  # marked meanwhile
        else:
            self._server.call_loop(connection)

    def _service_frame(
        self, connection: Connection, service: str, request: int | None = None
    ) -> bytes:
        """The service's frame; when it cannot be sent (larger than ``max_frame_bytes``, or
        a node that does not encode), an error frame naming the service instead: the
        process serves what it has of it, marked stale, and the link goes on (the service
        stays followed, so its next change is tried again)."""
        sent_before = dict(connection.policies_sent)
        try:
            message, encoded = self._service_message(connection, service, request)
            frame = protocol.encode(message, encoded)
            if len(frame) > self._max_frame_bytes:
                raise ValueError(
                    f"its state is {len(frame)} bytes, more than the {self._max_frame_bytes} "
                    "a frame may hold"
                )
        except Exception as exc:
            connection.policies_sent = sent_before  # a shard map in it was not sent either
            telemetry.AGENT_UNSENT.inc()
            log.warning("agent: cannot send service %r to pid %d: %s", service, connection.pid, exc)
            error = AgentServiceUnavailable(
                f"the agent cannot send service {service!r}: {exc}", service
            )
            return self._frame(error_answer(request, error))
        telemetry.AGENT_SENT_BYTES.inc(len(frame))
        telemetry.AGENT_FRAMES.labels(message["op"]).inc()
        return frame

    def _frame(self, message: dict[str, Any]) -> bytes:
        return self._shared(protocol.encode(message), message["op"])

    def _shared(self, frame: bytes, op: str) -> bytes:
        """A frame about to be sent (built for this connection, or shared by several)."""
        telemetry.AGENT_SENT_BYTES.inc(len(frame))
        telemetry.AGENT_FRAMES.labels(op).inc()
        return frame

    def _service_message(
        self, connection: Connection, service: str, request: int | None = None
    ) -> tuple[dict[str, Any], dict[str, bytes]]:
        """The service's whole state now (``gone`` when the agent no longer holds it),
        numbered as its last change, with its shard map the first time and the process's
        sealed credential node; its nodes (``entry``) apart, encoded once per snapshot
        whatever the number of connections sent it."""
        with self._admission.lock:
            number, snapshot = self._published.get(service, (0, None))
            if snapshot is None:  # no change since the agent's cache loaded it
                snapshot = self._sentinel.session.cache.snapshots.get(service)
            auth = None
            if connection.auth_client is not None:
                auth = self._credentials.text(service, connection.auth_client)
        if snapshot is None:
            with connection.due:
                connection.followed.discard(service)
            return {"op": "gone", "id": request, "service": service}, {}
        message: dict[str, Any] = {
            "op": "service",
            "id": request,
            "service": service,
            "seq": number,
            "policies": {},
            "auth": auth,
        }
        policy = snapshot.spec.shard_policy
        if policy is not None and policy not in connection.policies_sent:
            message["policies"][policy] = self._policy_entry(connection, policy)
        connection.numbers[service] = number
        return message, {"entry": self._entry(service, snapshot)}

    def _entry(self, service: str, snapshot: ServiceSnapshot) -> bytes:
        """``snapshot``'s nodes in the snapshot file's form, as JSON, encoded once."""
        encoded = self._encoded.get(service)
        if encoded is None or encoded[0] is not snapshot:
            entry = {**service_entry(service, snapshot), "invalid": sorted(snapshot.invalid)}
            encoded = self._encoded[service] = (snapshot, utf8_json(entry))
        return encoded[1]

    def _keys_message(
        self, connection: Connection, policy: str, keys: set[str] | None
    ) -> dict[str, Any]:
        """The buckets of a directory map that hold ``keys``, or the whole map (another
        kind, another spec than the process has, or ``keys`` None)."""
        shard_map = self._sentinel.session.cache.shard_maps.get(policy)
        spec_text = None if shard_map is None else shard_map.spec.to_bytes(policy_path(policy))
        if (
            keys is None
            or not isinstance(shard_map, DirectoryMap)
            or connection.policies_sent.get(policy) != spec_text.decode()  # type: ignore[union-attr]
        ):
            return {
                "op": "policy",
                "policy": policy,
                "entry": self._policy_entry(connection, policy),
            }
        indexes = {bucket_of(key, shard_map.spec.buckets) for key in keys}
        return {
            "op": "buckets",
            "policy": policy,
            "buckets": {
                str(i): encode_bucket(bucket_path(policy, i), shard_map.bucket(i)).decode()
                for i in indexes
            },
        }

    def _policy_entry(self, connection: Connection, policy: str) -> dict[str, Any] | None:
        """A shard map in the snapshot file's form (None: the policy does not exist)."""
        shard_map = self._sentinel.session.cache.shard_maps.get(policy)
        entry = None if shard_map is None else policy_entry(policy, shard_map)
        connection.policies_sent[policy] = "" if entry is None else entry["spec"]
        return entry

    def connection_message(self, op: str) -> dict[str, Any]:
        state = self._sentinel.connection_state
        since = None if state == "connected" else time.time() - self._sentinel.staleness
        return {"op": op, "version": protocol.VERSION, "state": state, "since": since, "id": None}
