"""A follower that takes a process's registry from its host agent instead of ZooKeeper.

With ``Sentinel(agent=...)`` (or ``$SENTINEL_AGENT``) the cache's one follower is an
:class:`AgentFollower`: a service's first load asks the agent to follow it
(:mod:`sentinel.agent.link`), and every change the agent sends is applied on the cache's
worker as the ZooKeeper followers apply theirs (``swap``, ``set_shard_map``,
``emit_keys``): lookups, listeners, ``explain`` and staleness cannot tell the two apart.

What the agent sends is read as what ZooKeeper holds: nodes in their stored form, decoded by
the registry's codecs (:func:`~sentinel.cache.snapshot_file.service_parts`), and the
process's credential node, sealed to its own key ring and opened here. A frame that does not
decode is logged and counted, and the state before it kept.

A service's frames coalesce as kazoo's events do in the persistent follower: each is the
service's whole state, and the worker applies the latest one once.
"""

from __future__ import annotations

import logging
from typing import Any

from sentinel.agent.link import AgentLink
from sentinel.auth.envelope import Credential
from sentinel.auth.reader import CredentialReader
from sentinel.cache.reads import open_credential
from sentinel.cache.snapshot_file import policy_map, service_parts
from sentinel.cache.source import FollowedCache
from sentinel.cache.views import ServiceSnapshot, directory_keys, key_changes
from sentinel.cache.worker import Task
from sentinel.errors import AgentServiceUnavailable, DecodeError, SentinelError, ServiceNotFound
from sentinel.shards.maps import DirectoryMap
from sentinel.shards.spec import bucket_of, bucket_path, decode_bucket

log = logging.getLogger(__name__)


class AgentFollower:
    """Feeds the cache from the host agent (see the module)."""

    persistent = True  # the agent's session keeps its watches; changes are pushed
    complete = True  # a service's state holds its Curator registry's instances too

    def __init__(
        self, cache: FollowedCache, link: AgentLink, credentials: CredentialReader | None
    ) -> None:
        self._cache = cache
        self._link = link
        self._credentials = credentials
        self._latest: dict[str, dict[str, Any]] = {}  # service -> its latest frame not applied
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
        return ServiceSnapshot.first(spec, endpoints, metrics, invalid, auth)

    def resync(self) -> None:
        """After (re)connecting: follow every service again and apply what the agent holds
        now (only real changes reach the listeners)."""
        for service in self._cache.native_services():
            try:
                answer = self._link.request({"op": "follow", "service": service})
            except ServiceNotFound:
                self._cache.drop(service)
                continue
            except AgentServiceUnavailable:
                continue  # served as it was, stale while the agent cannot send it (the link)
            self._latest[service] = answer
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
        """A change from the agent; applied on the worker, the latest of a service once."""
        op = message["op"]
        if op in ("service", "gone") and isinstance(message.get("service"), str):
            self._latest[message["service"]] = message
            self._cache.worker.merge(Task(self._apply, (message["service"],)))
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
        message = self._latest.pop(service, None)
        current = self._cache.snapshots.get(service)
        if message is None or current is None:
            return
        if message["op"] == "gone":
            self._cache.drop(service)
            return
        try:
            spec, endpoints, metrics, invalid, auth = self._decode(service, message, current)
        except DecodeError as exc:
            self._cache.stats.decode_errors += 1
            log.warning("skipping the agent's state of %s: %s", service, exc)
            return
        self._cache.swap(
            service,
            current.rebuilt(
                spec=spec, endpoints=endpoints, metrics=metrics, invalid=invalid, auth=auth
            ),
        )

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
            for policy, policy_entry in (message.get("policies") or {}).items():
                self._apply_policy(policy, policy_entry)
        except DecodeError:
            raise
        except Exception as exc:  # what the agent sent is data, not a crash
            raise DecodeError(f"agent:{service}", str(exc) or type(exc).__name__) from None
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

    def _apply_policy(self, policy: str, entry: object) -> None:
        """Serve a shard map the agent sent whole (None: the policy does not exist)."""
        if not isinstance(policy, str):
            raise TypeError("a policy name that is not a string")
        old = self._cache.shard_maps.get(policy)
        new = None if entry is None else policy_map(policy, entry)  # type: ignore[arg-type]
        self._buckets.pop(policy, None)
        changes = key_changes(directory_keys(old), directory_keys(new))
        self._cache.set_shard_map(policy, new, changes if policy in self._cache.shard_maps else {})

    def _apply_buckets(self, policy: str) -> None:
        """Buckets of a directory map that changed: replaced one by one, their keys told."""
        buckets = self._buckets.pop(policy, {})
        shard_map = self._cache.shard_maps.get(policy)
        if not isinstance(shard_map, DirectoryMap):
            return
        count = shard_map.spec.buckets
        for index_text, text in sorted(buckets.items()):
            try:
                index = int(index_text)
                path = bucket_path(policy, index)
                keys = decode_bucket(path, str(text).encode())
                if not 0 <= index < count or any(bucket_of(k, count) != index for k in keys):
                    raise DecodeError(path, "keys in the wrong bucket")
            except (ValueError, SentinelError) as exc:
                self._cache.stats.decode_errors += 1
                log.warning("skipping a bucket the agent sent: %s", exc)
                continue
            changes = shard_map.apply_bucket(index, keys)
            if changes:
                self._cache.emit_keys(policy, changes)
