"""Shard policies in ZooKeeper: read a spec, create a policy, write keys to its buckets, and
read what an ensemble holds of a policy (:func:`read_map_state`).

A directory's buckets are written with versioned compare-and-set, several per transaction: a
bucket another writer changed meanwhile is re-read and written again, so that concurrent
writers never lose each other's keys.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.interfaces import IAsyncResult

from sentinel.errors import (
    DecodeError,
    RegistryConflict,
    ShardPolicyExists,
    ShardPolicyNotFound,
    ValidationError,
)
from sentinel.registry.layout import SHARD_INFO, validate_name
from sentinel.registry.reads import pipelined_reads
from sentinel.registry.records import MAX_VALUE_BYTES
from sentinel.shards.digest import MapDigest, digest_path
from sentinel.shards.spec import (
    Key,
    ShardPolicySpec,
    bucket_of,
    bucket_path,
    decode_bucket,
    encode_bucket,
    policy_path,
    validate_key,
)
from sentinel.suggestions import close_matches, did_you_mean
from sentinel.zk.ephemeral import first_failure

log = logging.getLogger(__name__)

# A bucket that loses this many races in a row is contended: say so rather than spin.
CAS_ATTEMPTS = 10
# One transaction stays well under ZooKeeper's 1 MB request limit.
_TRANSACTION_BYTES = MAX_VALUE_BYTES


def read_spec(zk: KazooClient, policy: str) -> ShardPolicySpec:
    """Read a policy's spec; ShardPolicyNotFound if it does not exist, naming the policies
    closest to it when there are."""
    path = policy_path(validate_name("shard policy", policy))
    try:
        data, _ = zk.get(path)
    except NoNodeError:
        hint = did_you_mean(close_matches(policy, existing_policies(zk)))
        message = f"shard policy {policy!r} does not exist" + (f"; {hint}" if hint else "")
        raise ShardPolicyNotFound(message) from None
    return ShardPolicySpec.from_bytes(policy, path, data)


def existing_policies(zk: KazooClient) -> list[str]:
    """The names of the shard policies there are (for an error's suggestions); none when they
    cannot be listed."""
    try:
        return zk.get_children(SHARD_INFO)
    except KazooException:
        return []


def create_policy(zk: KazooClient, spec: ShardPolicySpec) -> None:
    """Create the policy node and, for a directory, all its buckets and its (empty) digest, in
    one transaction."""
    path = policy_path(spec.policy)
    zk.ensure_path(SHARD_INFO)  # a namespace no client has started in yet lacks it
    transaction = zk.transaction()
    transaction.create(path, spec.to_bytes(path))
    if spec.kind == "directory":
        for index in range(spec.buckets):
            bucket = bucket_path(spec.policy, index)
            transaction.create(bucket, encode_bucket(bucket, {}))
        transaction.create(digest_path(spec.policy), MapDigest().to_bytes(digest_path(spec.policy)))
    failure = first_failure(transaction.commit())
    if isinstance(failure, NodeExistsError):
        raise ShardPolicyExists(f"shard policy {spec.policy!r} already exists")
    if failure is not None:
        raise failure


def read_directory_spec(zk: KazooClient, policy: str) -> ShardPolicySpec:
    """Read a policy's spec; ValidationError unless it is a directory (which takes keys)."""
    spec = read_spec(zk, policy)
    if spec.kind != "directory":
        raise ValidationError(
            f"shard policy {policy!r} is a {spec.kind} policy: keys follow from its "
            f"{'boundaries' if spec.kind == 'range' else 'partitions'}, not assignments"
        )
    return spec


def update_keys(zk: KazooClient, policy: str, changes: Mapping[Key, str | None]) -> int:
    """Assign keys to partitions (``None`` removes a key) in a directory policy.

    Buckets are updated with versioned compare-and-set, several per transaction and each
    transaction under the size limit; a bucket another writer changed meanwhile is re-read and
    retried. Everything is validated before the first write. Returns the number of buckets
    written.
    """
    spec = read_directory_spec(zk, policy)
    by_bucket: dict[int, dict[str, str | None]] = {}
    for key, partition in changes.items():
        text = validate_key(key)
        target = None if partition is None else spec.check_partition(partition)
        by_bucket.setdefault(bucket_of(text, spec.buckets), {})[text] = target
    written = 0
    pending = by_bucket
    for _ in range(CAS_ATTEMPTS):
        if not pending:
            return written
        conflicted = _write_buckets(zk, spec, pending)
        written += len(pending) - len(conflicted)
        pending = {index: by_bucket[index] for index in conflicted}
    raise RegistryConflict(f"buckets {sorted(pending)} of {policy!r} kept changing")


class DigestWriter:
    """A directory's digest (:mod:`sentinel.shards.digest`) as one writer moves it along its
    transactions. Its read is sent when the writer is made and awaited at the first
    :meth:`add`, so that it travels with the writer's own bucket reads rather than costing a
    round trip of its own. A policy without one (older than digests), or holding one that does
    not decode (doctor reports it), is written without: the writer leaves it as it is."""

    def __init__(self, zk: KazooClient, policy: str) -> None:
        self.path = digest_path(policy)
        self._policy = policy
        self._read: IAsyncResult | None = zk.get_async(self.path)
        self._current: tuple[MapDigest, int] | None = None

    @property
    def current(self) -> tuple[MapDigest, int] | None:
        """The digest and its version as this writer last wrote or read it (None: none)."""
        if self._read is not None:
            read, self._read = self._read, None
            try:
                data, stat = read.get()
                self._current = MapDigest.from_bytes(self.path, data)[0], stat.version
            except NoNodeError:
                pass
            except DecodeError as exc:
                log.warning("not updating the digest of shard policy %r: %s", self._policy, exc)
        return self._current

    def add(
        self, transaction: TransactionRequest, before: Mapping[str, str], after: Mapping[str, str]
    ) -> MapDigest | None:
        """Add the digest's compare-and-set to ``transaction``; returns the digest it writes."""
        current = self.current
        if current is None:
            return None
        digest, version = current
        moved = digest.changed(before, after)
        transaction.set_data(self.path, moved.to_bytes(self.path), version=version)
        return moved

    def committed(self, moved: MapDigest | None) -> None:
        """The transaction that wrote ``moved`` committed: the next one starts from it."""
        current = self.current
        if moved is not None and current is not None:
            self._current = moved, current[1] + 1


def _write_buckets(
    zk: KazooClient, spec: ShardPolicySpec, by_bucket: Mapping[int, Mapping[str, str | None]]
) -> set[int]:
    """One compare-and-set pass; returns the buckets that lost a race and need another."""
    digest = DigestWriter(zk, spec.policy)
    batches: list[list[tuple[int, str, dict[str, str], dict[str, str], bytes, int]]] = [[]]
    size = 0
    for index, result in pipelined_reads(zk, by_bucket, lambda i: bucket_path(spec.policy, i)):
        path = bucket_path(spec.policy, index)
        data, stat = result.get()
        before = decode_bucket(spec, index, data)
        keys = dict(before)
        for key, partition in by_bucket[index].items():
            if partition is None:
                keys.pop(key, None)
            else:
                keys[key] = partition
        value = encode_bucket(path, keys)
        if size + len(value) > _TRANSACTION_BYTES and batches[-1]:
            batches.append([])
            size = 0
        batches[-1].append((index, path, before, keys, value, stat.version))
        size += len(value)
    conflicted: set[int] = set()
    for batch in batches:
        transaction = zk.transaction()
        before_all: dict[str, str] = {}
        after_all: dict[str, str] = {}
        for _, path, before, after, value, version in batch:
            transaction.set_data(path, value, version=version)
            before_all.update(before)  # a key lives in one bucket: no overlap
            after_all.update(after)
        moved = digest.add(transaction, before_all, after_all)
        failure = first_failure(transaction.commit())
        if isinstance(failure, BadVersionError | NoNodeError):
            conflicted.update(index for index, *_ in batch)
        elif failure is not None:
            raise failure
        else:
            digest.committed(moved)
    return conflicted


def read_key(zk: KazooClient, spec: ShardPolicySpec, key: Key) -> str | None:
    """Read one key's partition straight from ZooKeeper (the paper's Procedure 1)."""
    text = validate_key(key)
    index = bucket_of(text, spec.buckets)
    try:
        data, _ = zk.get(bucket_path(spec.policy, index))
    except NoNodeError:
        return None
    return decode_bucket(spec, index, data).get(text)


def iter_assignments(zk: KazooClient, policy: str) -> Iterable[tuple[str, str]]:
    """Every ``(key, partition)`` of a directory policy, read bucket by bucket."""
    spec = read_directory_spec(zk, policy)
    for index, result in pipelined_reads(zk, range(spec.buckets), lambda i: bucket_path(policy, i)):
        yield from decode_bucket(spec, index, result.get()[0]).items()


@dataclass(frozen=True)
class MapState:
    """What one ensemble holds of a policy, for comparing it with its digest and with the
    other regions' replicas (``sentinel doctor``).

    ``content``: the digest of the keys the buckets hold (None for a range or hash policy,
    whose spec is its whole map). ``stored``: the digest node's, and ``stored_at`` when it was
    written; None when the policy has none (created before digests), ``stored_error`` saying
    why when it does not decode.
    """

    spec: ShardPolicySpec
    content: MapDigest | None = None
    stored: MapDigest | None = None
    stored_at: float | None = None
    stored_error: str | None = None

    @property
    def digest_problem(self) -> str | None:
        """What the digest tells is wrong with this replica (None: nothing): a digest that
        does not decode, or buckets that do not add up to it (written behind the writers'
        back). The buckets themselves were checked as they were read
        (:func:`~sentinel.shards.spec.decode_bucket`)."""
        if self.stored_error is not None:
            return f"its digest does not decode ({self.stored_error})"
        content, stored = self.content, self.stored
        if content is not None and stored is not None and content != stored:
            return (
                f"its buckets hold {content.keys} key(s) that do not add up to the digest its "
                f"writers keep ({stored.keys} key(s)): written behind the shard manager's back"
            )
        return None


def read_map_state(zk: KazooClient, policy: str) -> MapState:
    """Read a policy's spec, every bucket and its digest. Raises ShardPolicyNotFound, or
    DecodeError when the spec or a bucket cannot be read (a bucket missing included), and
    ShardMapInvalid for a bucket that contradicts the spec: a registry that lies is
    reported, never trusted, whatever its digest says."""
    spec = read_spec(zk, policy)
    if spec.kind != "directory":
        return MapState(spec)
    try:
        content = MapDigest.of(iter_assignments(zk, policy))
    except NoNodeError:
        raise DecodeError(policy_path(policy), "a bucket is missing") from None
    path = digest_path(policy)
    try:
        data, _ = zk.get(path)
        stored, at = MapDigest.from_bytes(path, data)
    except NoNodeError:
        return MapState(spec, content)
    except DecodeError as exc:
        return MapState(spec, content, stored_error=str(exc))
    return MapState(spec, content, stored, at)
