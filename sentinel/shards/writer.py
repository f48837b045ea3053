"""The shard maps' writer API: policies and key assignments, bound to a client.

A client exposes it as ``client.shard_maps`` (kazoo binds its recipes to its client the same
way), so the writes of the shard manager's role live apart from lookups and publishing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kazoo.client import KazooClient

from sentinel.errors import ShardPolicyConflict, ShardPolicyExists
from sentinel.registry.records import decode
from sentinel.shards.placement import request_placement
from sentinel.shards.spec import DEFAULT_BUCKETS, ShardPolicySpec, policy_path
from sentinel.shards.store import create_policy, read_spec, update_keys
from sentinel.zk.errors import translate_zk_errors

Partitions = list[str] | tuple[str, ...] | None
Boundaries = list[tuple[object, str]] | tuple[tuple[object, str], ...] | None


class ShardMapWriter:
    """Creates shard policies and assigns their keys, through one client's session.

    ``session`` returns the client's current kazoo client (a forked child gets its own) and
    ``writable`` runs before every write (the client started, the namespace's sections made).
    """

    def __init__(self, session: Callable[[], KazooClient], writable: Callable[[], None]) -> None:
        self._session = session
        self._writable = writable

    @translate_zk_errors
    def create(
        self,
        policy: str,
        kind: str = "directory",
        partitions: Partitions = None,
        boundaries: Boundaries = None,
        *,
        key_type: str = "str",
        buckets: int = DEFAULT_BUCKETS,
    ) -> ShardPolicySpec:
        """Create shard policy ``policy`` of ``kind`` ``directory``, ``range`` or ``hash``.

        ``directory``: explicit assignments, optionally restricted to ``partitions``; keys are
        stored in ``buckets`` hash buckets. ``range``: ``boundaries`` as ``(lower bound,
        partition)`` pairs, compared as ``key_type``. ``hash``: ``partitions`` by jump hash.
        Raises :class:`~sentinel.errors.ShardPolicyExists` if it exists (see :meth:`ensure`
        for the idempotent form).
        """
        self._writable()
        spec = _spec(policy, kind, partitions, boundaries, key_type, buckets)
        create_policy(self._session(), spec)
        return spec

    @translate_zk_errors
    def ensure(
        self,
        policy: str,
        kind: str = "directory",
        partitions: Partitions = None,
        boundaries: Boundaries = None,
        *,
        key_type: str = "str",
        buckets: int = DEFAULT_BUCKETS,
    ) -> ShardPolicySpec:
        """Create shard policy ``policy`` unless it exists; return the stored spec.

        The idempotent twin of :meth:`create` (same arguments), as ``ensure_service`` is for
        services: set-up code that runs on every start calls this. Raises
        :class:`~sentinel.errors.ShardPolicyConflict` (a
        :class:`~sentinel.errors.ShardPolicyExists`) if the policy exists with another spec,
        and then writes nothing; its keys are never touched.
        """
        self._writable()
        spec = _spec(policy, kind, partitions, boundaries, key_type, buckets)
        zk = self._session()
        try:
            create_policy(zk, spec)
        except ShardPolicyExists:
            stored = read_spec(zk, spec.policy)
            conflict = _conflict(stored, spec)
            if conflict:
                raise ShardPolicyConflict(
                    f"shard policy {spec.policy!r} exists with other settings: {conflict}"
                ) from None
            return stored
        return spec

    @translate_zk_errors
    def assign(self, policy: str, key: object, partition: str) -> None:
        """Assign ``key`` to ``partition`` in directory policy ``policy``."""
        self._writable()
        update_keys(self._session(), policy, {key: partition})  # type: ignore[dict-item]

    @translate_zk_errors
    def unassign(self, policy: str, key: object) -> None:
        """Remove ``key`` from directory policy ``policy`` (nothing if it is not there)."""
        self._writable()
        update_keys(self._session(), policy, {key: None})  # type: ignore[dict-item]

    @translate_zk_errors
    def assign_many(self, policy: str, mapping: Mapping[object, str | None]) -> int:
        """Assign (or, with None, remove) many keys at once; returns the buckets written.

        Everything is validated before the first write; buckets are written in multi-op
        transactions under the size limit, each with a compare-and-set on its version.
        """
        self._writable()
        return update_keys(self._session(), policy, mapping)  # type: ignore[arg-type]

    @translate_zk_errors
    def request_placement(self, policy: str, key: object) -> bool:
        """Ask the shard manager (``sentinel shard serve``) to place ``key``.

        Returns False if the key already has a partition. Once the leader has placed it, the
        bucket's watch brings it to every client.
        """
        self._writable()
        return request_placement(self._session(), policy, key)  # type: ignore[arg-type]


def _spec(
    policy: str,
    kind: str,
    partitions: Partitions,
    boundaries: Boundaries,
    key_type: str,
    buckets: int,
) -> ShardPolicySpec:
    """The spec :meth:`ShardMapWriter.create`'s arguments describe (validated)."""
    return ShardPolicySpec(
        policy=policy,
        kind=kind,
        partitions=None if partitions is None else tuple(partitions),
        boundaries=tuple(boundaries or ()),
        key_type=key_type,
        buckets=buckets,
    )


def _conflict(stored: ShardPolicySpec, asked: ShardPolicySpec) -> str:
    """How ``asked`` differs from ``stored`` as the node holds them (``kind='range'``, asked
    ``'hash'``; ...), empty when they are the same. Compared in stored form, so settings a kind
    does not keep (the buckets of a hash policy) never conflict."""
    path = policy_path(stored.policy)
    have, want = (decode(path, spec.to_bytes(path)) for spec in (stored, asked))
    return "; ".join(
        f"{name}={have.get(name)!r}, asked {want.get(name)!r}"
        for name in sorted(have.keys() | want.keys())
        if have.get(name) != want.get(name)
    )
