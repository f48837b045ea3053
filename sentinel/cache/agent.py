"""A follower that takes a process's registry from its host agent instead of ZooKeeper.

With ``Sentinel(agent=...)`` (or ``$SENTINEL_AGENT``) the cache's one follower is an
:class:`AgentFollower`: a service's first load asks the agent to follow it, through the
:class:`AgentChannel` the session gives the cache (:class:`sentinel.agentlink.link.AgentLink`),
and every change the agent sends is applied on the cache's
worker as the ZooKeeper followers apply theirs (``swap``, ``update``, ``set_shard_map``,
``emit_keys``): lookups, listeners, ``explain`` and staleness cannot tell the two apart.

What the agent sends is read as what ZooKeeper holds: nodes in their stored form, decoded by
the registry's codecs (:mod:`sentinel.cache.snapshot_file`), and the process's credential
node, sealed to its own key ring and opened here. A frame that does not decode is logged and
counted, and the state before it kept.

A service's state comes whole (its first follow, every reconnection, a spec change), then as
deltas: the nodes one change touched, numbered in the service's sequence
(:mod:`sentinel.agentlink.protocol`). A delta is applied through the same incremental update as a
ZooKeeper event (:meth:`~sentinel.cache.views.ServiceSnapshot.updated`) only when it follows
the state held: one whose number skips, or that does not decode, is skipped and the whole
state asked again (``follow``), the state before it served meanwhile. A service's frames are
applied in the order they came, on the worker; what the worker has not applied yet is bounded,
past which it asks for the whole state instead.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from sentinel.auth.envelope import Credential
from sentinel.auth.reader import CredentialReader
from sentinel.cache.reads import open_credential
from sentinel.cache.snapshot_file import instance_of, metrics_of, policy_map, service_parts
from sentinel.cache.source import FollowedCache, load_each
from sentinel.cache.views import ServiceSnapshot, directory_keys, key_changes
from sentinel.cache.worker import Task
from sentinel.errors import AgentServiceUnavailable, DecodeError, SentinelError, ServiceNotFound
from sentinel.shards.maps import DirectoryMap
from sentinel.shards.spec import ShardPolicySpec, decode_bucket

log = logging.getLogger(__name__)

# Frames of one service the worker may have left unapplied: a worker that far behind is sent
# the whole state once rather than working through a backlog.
MAX_QUEUED_FRAMES = 4096
# The frames of a service, applied in order on the worker.
_SERVICE_FRAMES = frozenset({"service", "gone", "delta", "auth", "error"})
# A queued entry that asks for the whole state (the queue overflowed).
_ASK = None


class AgentChannel(Protocol):
    """What the cache needs of its connection to the host agent.

    :class:`sentinel.agentlink.link.AgentLink` is one; the session makes it and gives it to the
    cache. A protocol, so that the cache, a floor below the roles, names what it uses of the
    agent's link rather than importing the agent's package (``docs/overview.md``, the floors).
    """

    #: Called on the link's reader thread with each change the agent sends.
    on_frame: Callable[[dict[str, Any]], None]
    #: Called with the agent's state (a ``KazooState`` name) and since when it is stale.
    on_state: Callable[[str, float | None], None]
    #: Connections made to the agent so far (one more per reconnection).
    connections: int

    @property
    def connected(self) -> bool:
        """Whether the link is connected to the agent now."""
        ...

    def start(self) -> None:
        """Connect in the background (unless started already)."""
        ...

    def request(self, message: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send ``message`` and wait for its answer; raises what the agent answered."""
        ...

    def send(self, message: dict[str, Any]) -> bool:
        """Send ``message`` without waiting for an answer; False when it could not be sent."""
        ...


class AgentFollower:
    """Feeds the cache from the host agent (see the module)."""

    persistent = True  # the agent's session keeps its watches; changes are pushed
    complete = True  # a service's state holds its Curator registry's instances too

    def __init__(
        self, cache: FollowedCache, link: AgentChannel, credentials: CredentialReader | None
    ) -> None:
        self._cache = cache
        self._link = link
        self._credentials = credentials
        self._lock = threading.Lock()  # the queues, between the link's reader and the worker
        # service -> (the link's connection it came on, frame) not applied yet, in order
        self._queued: dict[str, list[tuple[int, dict[str, Any] | None]]] = {}
        # service -> (connection, number) of the state served: the next delta is number + 1
        self._held: dict[str, tuple[int, int] | None] = {}
        self._asked: dict[str, int] = {}  # service -> the request id of the whole state asked
        self._ask_ids = itertools.count(-1, -1)  # the link's own requests count up from 1
        self._buckets: dict[str, dict[str, str]] = {}  # policy -> bucket frames not applied
        self._auth_text: dict[str, str | None] = {}  # service -> credential node opened last
        link.on_frame = self.receive

    def load_service(self, service: str) -> ServiceSnapshot:
        """Ask the agent to follow ``service``; its first snapshot. Raises what the agent met
        (:class:`~sentinel.errors.ServiceNotFound`...)."""
        answer = self._link.request({"op": "follow", "service": service})
        if answer["op"] == "gone":
            raise ServiceNotFound(service)
        spec, endpoints, metrics, invalid, auth = self._decode(service, answer)
        self._held[service] = _number(answer, self._link.connections)
        return ServiceSnapshot.first(spec, endpoints, metrics, invalid, auth)

    def load_services(self, services: Sequence[str]) -> Iterator[ServiceSnapshot | Exception]:
        """:meth:`load_service` of each, one at a time (the agent answers them in order)."""
        return load_each(self.load_service, services)

    def resync(self) -> None:
        """After (re)connecting: follow every service again and apply what the agent holds
        now (only real changes reach the listeners). A service followed on this connection
        already (loaded since it was made: the first connection's re-sync) is current, its
        changes on their way in order, and is not asked again."""
        connection = self._link.connections
        for service in self._cache.native_services():
            held = self._held.get(service)
            if held is not None and held[0] == connection:
                continue
            try:
                answer = self._link.request({"op": "follow", "service": service})
            except ServiceNotFound:
                self._forget(service)
                self._cache.drop(service)
                continue
            except AgentServiceUnavailable:
                continue  # served as it was, stale while the agent cannot send it (the link)
            connection = self._link.connections  # the one the answer came on
            with self._lock:
                # On a new connection nothing of a service comes before its follow's answer:
                # what is queued of this connection came after it; the rest is the old one's.
                later = [item for item in self._queued.get(service, ()) if item[0] == connection]
                self._queued[service] = [(connection, answer), *later]
            self._apply(service)

    def partition(self, service: str, policy: str, key: object) -> str:
        """A key the process's map does not hold, read through by the agent (Procedure 1,
        rate-limited there for the whole host)."""
        wire_key = key if isinstance(key, int) else str(key)
        answer = self._link.request({"op": "partition", "service": service, "key": wire_key})
        partition = answer.get("partition")
        if not isinstance(partition, str):
            raise DecodeError(f"agent:{service}", "a partition answer without a partition")
        return partition

    # --- the link's reader thread: note and queue, nothing more --------------------------------

    def receive(self, message: dict[str, Any]) -> None:
        """A frame from the agent; queued for the worker (a service's in order)."""
        op = message["op"]
        service = message.get("service")
        if op == "error":  # only a whole state this follower asked has no waiting request
            service = next((s for s, i in self._asked.items() if i == message.get("id")), None)
        if op in _SERVICE_FRAMES and isinstance(service, str):
            connection = self._link.connections
            with self._lock:
                queued = self._queued.setdefault(service, [])
                if op in ("service", "gone"):
                    queued.clear()  # what came before is in it
                elif len(queued) >= MAX_QUEUED_FRAMES:
                    queued[:] = [(connection, _ASK)]
                    return
                queued.append((connection, message))
            self._cache.worker.merge(Task(self._apply, (service,)))
        elif op == "buckets" and isinstance(message.get("policy"), str):
            buckets = message.get("buckets")
            if isinstance(buckets, dict):
                self._buckets.setdefault(message["policy"], {}).update(buckets)
                self._cache.worker.merge(Task(self._apply_buckets, (message["policy"],)))
        elif op == "policy" and isinstance(message.get("policy"), str):
            self._cache.worker.merge(
                Task(self._apply_policy, (message["policy"], message.get("entry")))
            )

    # --- the worker -----------------------------------------------------------------------------

    def _apply(self, service: str) -> None:
        """Apply what came of ``service``, in order; frames of a connection gone are skipped
        (the re-sync after the new one follows the service again)."""
        with self._lock:
            queued = self._queued.pop(service, [])
        connection = self._link.connections
        for came_on, message in queued:
            current = self._cache.snapshots.get(service)
            if current is None:
                return
            if came_on != connection:
                continue
            if message is _ASK:
                self._held[service] = None
                self._ask(service)
                continue
            op = message["op"]
            if op == "gone":
                self._forget(service)
                self._cache.drop(service)
                return
            if op == "error":  # the whole state asked could not be had
                self._asked.pop(service, None)
                if message.get("type") == ServiceNotFound.__name__:
                    self._forget(service)
                    self._cache.drop(service)
                    return
            elif op == "service":
                self._apply_whole(service, current, message, came_on)
            elif op == "auth":
                auth = self._auth(service, message.get("auth"), current)
                if auth != current.auth:
                    self._cache.swap(service, current.rebuilt(auth=auth))
            else:
                self._apply_delta(service, current, message, came_on)

    def _apply_whole(
        self, service: str, current: ServiceSnapshot, message: dict[str, Any], connection: int
    ) -> None:
        """Serve a service's whole state (the listeners hear a diff of the whole service)."""
        self._asked.pop(service, None)
        try:
            spec, endpoints, metrics, invalid, auth = self._decode(service, message, current)
        except DecodeError as exc:
            self._cache.stats.decode_errors += 1
            self._held[service] = None  # no delta can follow it: the next asks for the state
            log.warning("skipping the agent's state of %s: %s", service, exc)
            return
        self._held[service] = _number(message, connection)
        self._cache.swap(
            service,
            current.rebuilt(
                spec=spec, endpoints=endpoints, metrics=metrics, invalid=invalid, auth=auth
            ),
        )

    def _apply_delta(
        self, service: str, current: ServiceSnapshot, message: dict[str, Any], connection: int
    ) -> None:
        """Apply one change of a service when it follows the state held, else ask for the
        whole state: its instances, then its metrics, each as a ZooKeeper event is."""
        held = self._held.get(service)
        number = message.get("seq")
        if held is not None and held[0] == connection and type(number) is int:
            if number <= held[1]:
                return  # the state held has it already (sent whole since)
            if number == held[1] + 1:
                try:
                    endpoints, metrics, invalid = _changes(service, current, message)
                except Exception as exc:  # what the agent sent is data, not a crash
                    self._cache.stats.decode_errors += 1
                    log.warning("skipping the agent's change of %s: %s", service, exc)
                else:
                    self._held[service] = (connection, number)
                    if endpoints or not metrics:
                        self._cache.update(service, current, "endpoints", endpoints, invalid)
                    if metrics:
                        current = self._cache.snapshots[service]
                        self._cache.update(service, current, "metrics", metrics, invalid)
                    return
        self._held[service] = None
        self._ask(service)

    def _ask(self, service: str) -> None:
        """Ask the agent for the whole state of ``service``, once until it comes: its answer
        is queued in order with the service's other frames."""
        if service in self._asked:
            return
        request = next(self._ask_ids)
        self._asked[service] = request
        self._cache.stats.agent_whole_states_asked += 1
        if not self._link.send({"op": "follow", "service": service, "id": request}):
            self._asked.pop(service, None)  # not connected: the re-sync follows it again

    def forget(self, service: str) -> None:
        """Stop applying ``service`` (the cache drops it): frames the agent still sends of it
        are skipped (nothing held), at the cost of a socket read, not of ZooKeeper's."""
        self._forget(service)

    def _forget(self, service: str) -> None:
        self._held.pop(service, None)
        self._asked.pop(service, None)
        with self._lock:
            self._queued.pop(service, None)

    def _decode(
        self, service: str, message: dict[str, Any], current: ServiceSnapshot | None = None
    ) -> tuple[Any, ...]:
        """A ``service`` frame decoded: spec, endpoints, metrics, invalid nodes, credential;
        its shard map served first, when it brings one. DecodeError for anything else."""
        try:
            entry = message["entry"]
            spec, endpoints, metrics = service_parts(service, entry)
            invalid = frozenset(entry.get("invalid") or ())
            if not all(isinstance(path, str) for path in invalid):
                raise TypeError("invalid nodes that are not paths")
            policies = message.get("policies") or {}
            if not isinstance(policies, dict):
                raise TypeError("policies that are not an object")
        except DecodeError:
            raise
        except Exception as exc:  # what the agent sent is data, not a crash
            raise DecodeError(f"agent:{service}", str(exc) or type(exc).__name__) from None
        for policy, policy_entry in policies.items():
            # A map that does not decode costs the map (the one held kept), not the service.
            self._apply_policy(policy, policy_entry)
        if spec.shard_policy is not None:
            self._cache.add_policy_user(spec.shard_policy, service)
        auth = self._auth(service, message.get("auth"), current)
        return spec, endpoints, metrics, invalid, auth

    def _auth(
        self, service: str, text: object, current: ServiceSnapshot | None
    ) -> Credential | None:
        """The process's credential, opened here from its sealed node (again only when the
        node changed)."""
        if self._credentials is None:
            return None
        text = text if isinstance(text, str) else None
        if current is not None and self._auth_text.get(service) == text:
            return current.auth
        self._auth_text[service] = text
        if text is None:
            self._credentials.forget(service)
            return None
        return open_credential(self._credentials, self._cache.stats, service, text.encode())

    def _apply_policy(self, policy: object, entry: object) -> None:
        """Serve a shard map the agent sent whole (None: the policy does not exist). One
        that does not decode is counted and the map held kept; a bucket that is not valid is
        counted and the one held kept in its place (same spec), as from ZooKeeper."""
        if not isinstance(policy, str):
            self._skip_map(policy, "a policy name that is not a string")
            return
        old = self._cache.shard_maps.get(policy)

        def held(spec: ShardPolicySpec, index: int, exc: DecodeError) -> dict[str, str]:
            self._skip_map(policy, exc)
            if isinstance(old, DirectoryMap) and old.spec == spec and 0 <= index < spec.buckets:
                return old.bucket(index)
            return {}

        try:
            new = None if entry is None else policy_map(policy, entry, held)  # type: ignore[arg-type]
        except Exception as exc:  # what the agent sent is data, not a crash
            self._skip_map(policy, exc)
            return
        self._buckets.pop(policy, None)
        changes = key_changes(directory_keys(old), directory_keys(new))
        self._cache.set_shard_map(policy, new, changes if policy in self._cache.shard_maps else {})

    def _skip_map(self, policy: object, why: object) -> None:
        self._cache.stats.decode_errors += 1
        log.warning("skipping a shard map the agent sent (policy %r): %s", policy, why)

    def _apply_buckets(self, policy: str) -> None:
        """Buckets of a directory map that changed: replaced one by one, their keys told; one
        that is not valid is counted and skipped (the one held kept)."""
        buckets = self._buckets.pop(policy, {})
        shard_map = self._cache.shard_maps.get(policy)
        if not isinstance(shard_map, DirectoryMap):
            return
        for index_text, text in sorted(buckets.items()):
            try:
                index = int(index_text)
                keys = decode_bucket(shard_map.spec, index, str(text).encode())
            except (ValueError, SentinelError) as exc:
                self._skip_map(policy, exc)
                continue
            changes = shard_map.apply_bucket(index, keys)
            if changes:
                self._cache.emit_keys(policy, changes)


def _number(message: dict[str, Any], connection: int) -> tuple[int, int] | None:
    """A whole state's place in its service's sequence on ``connection`` (None: it has none,
    and the next delta asks for the state again)."""
    number = message.get("seq")
    return (connection, number) if type(number) is int else None


def _changes(
    service: str, current: ServiceSnapshot, message: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], frozenset[str]]:
    """A delta decoded by the registry's codecs: the instances and metrics nodes it sets
    (None: removed) and the unreadable nodes after it. Raises on anything else."""
    instances = message.get("instances") or {}
    metrics = message.get("metrics") or {}
    added, removed = message.get("invalid") or [], message.get("valid") or []
    if not isinstance(instances, dict) or not isinstance(metrics, dict):
        raise TypeError("instances or metrics that are not objects")
    if not all(isinstance(path, str) for path in [*added, *removed]):
        raise TypeError("invalid nodes that are not paths")
    endpoints = {
        name: None if entry is None else instance_of(service, name, entry)
        for name, entry in instances.items()
    }
    records = {
        name: None if text is None else metrics_of(service, name, text)
        for name, text in metrics.items()
    }
    return endpoints, records, (current.invalid | frozenset(added)) - frozenset(removed)
