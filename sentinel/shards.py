"""Shard maps: which partition holds a key, for the three kinds of ``/shard_info`` policy.

* ``directory``: explicit key → partition. Keys are grouped into a fixed number of hash buckets
  (``crc32(utf-8 key) % buckets``), one JSON map per bucket node, so that a cold load or a
  re-sync reads ``buckets`` nodes instead of one node per key (the paper's layout costs a round
  trip per key: over 20 s for 100,000 keys), and a single key change re-reads one bucket.
  Writers update a bucket with a versioned compare-and-set.
* ``range``: sorted lower bounds, each starting a partition; a key maps to the partition of
  the greatest bound not above it (bisect).
* ``hash``: jump consistent hash of the key over a list of partitions; growing the list moves
  only the keys the new partitions take.

This module holds the specs and their codecs, the client-side lookup structures and the writer
operations; the watch-driven cache keeps the lookup structures current.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import sys
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from sentinel.ephemeral import first_failure
from sentinel.errors import (
    DecodeError,
    PartitionNotFound,
    RegistryConflict,
    ShardPolicyExists,
    ShardPolicyNotFound,
    ValidationError,
    ValueTooLarge,
)
from sentinel.layout import SHARD_INFO, validate_name
from sentinel.records import MAX_VALUE_BYTES, decode, encode, fields_of
from sentinel.registry import pipelined_reads

KINDS = ("directory", "range", "hash")
DEFAULT_BUCKETS = 256
MAX_BUCKETS = 65536
MAX_KEY_LENGTH = 256
_CAS_ATTEMPTS = 10
# One transaction stays well under ZooKeeper's 1 MB request limit.
_TRANSACTION_BYTES = MAX_VALUE_BYTES

Key = str | int


def policy_path(policy: str) -> str:
    """The node holding a shard policy's spec (and, for directories, its buckets)."""
    return f"{SHARD_INFO}/{policy}"


def bucket_name(index: int) -> str:
    """The node name of bucket ``index`` (fixed width, so names sort in index order)."""
    return f"{index:04x}"


def bucket_path(policy: str, index: int) -> str:
    """The node of one directory bucket."""
    return f"{policy_path(policy)}/{bucket_name(index)}"


def bucket_of(key: str, buckets: int) -> int:
    """The bucket a directory key lives in; stable across processes and languages."""
    return zlib.crc32(key.encode("utf-8")) % buckets


def validate_key(key: object) -> str:
    """A shard key as stored: a non-empty string of at most 256 characters (ints accepted)."""
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH:
        raise ValidationError(
            f"shard key {key!r} must be a string (or int) of 1-{MAX_KEY_LENGTH} characters"
        )
    return key


def shard_key(service: str, policy: str, key: object) -> Key:
    """The one key rule of every map kind (directory, range, hash), checked before any map is
    consulted: a ``str`` or an ``int`` (not ``bool``). No key is :class:`PartitionNotFound`;
    a key of another type (``True``, ``3.5``, bytes, ...) is :class:`ValidationError`.
    """
    if isinstance(key, str) or (isinstance(key, int) and not isinstance(key, bool)):
        return key  # type: ignore[return-value]
    if key is None:
        raise PartitionNotFound(
            service, key, policy, f"sharded by policy {policy!r}: a key is required"
        )
    raise ValidationError(
        f"service {service!r}: shard key {key!r} must be a str or an int, not {type(key).__name__}"
    )


def jump_hash(key: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash of a 64-bit key into ``buckets``."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


def _key_hash64(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class ShardPolicySpec:
    """The spec of a shard policy: ``/shard_info/<policy>``.

    ``partitions`` is the declared set (required for ``hash``, optional for ``directory``: when
    given, assignments to other partitions are refused). ``boundaries`` are ``(lower bound,
    partition)`` pairs for ``range``; ``key_type`` says whether range keys compare as ``str`` or
    ``int``. ``buckets`` is the number of directory buckets, fixed at creation.
    """

    policy: str
    kind: str
    partitions: tuple[str, ...] | None = None
    boundaries: tuple[tuple[Key, str], ...] = ()
    key_type: str = "str"
    buckets: int = DEFAULT_BUCKETS

    def __post_init__(self) -> None:
        validate_name("shard policy", self.policy)
        if self.kind not in KINDS:
            raise ValidationError(f"shard policy kind {self.kind!r} is not one of {KINDS}")
        if self.partitions is not None:
            partitions = tuple(validate_name("partition", p) for p in self.partitions)
            if len(set(partitions)) != len(partitions):
                raise ValidationError("partitions must not repeat")
            object.__setattr__(self, "partitions", partitions)
        if self.key_type not in ("str", "int"):
            raise ValidationError(f"key_type {self.key_type!r} must be 'str' or 'int'")
        if self.kind == "hash" and not self.partitions:
            raise ValidationError("a hash policy needs a non-empty list of partitions")
        if self.kind == "range":
            object.__setattr__(self, "boundaries", self._checked_boundaries())
        elif self.boundaries:
            raise ValidationError("only range policies take boundaries")
        if self.kind == "directory" and (
            isinstance(self.buckets, bool)
            or not isinstance(self.buckets, int)
            or not 1 <= self.buckets <= MAX_BUCKETS
        ):
            raise ValidationError(f"buckets must be an integer from 1 to {MAX_BUCKETS}")

    def _checked_boundaries(self) -> tuple[tuple[Key, str], ...]:
        if not self.boundaries:
            raise ValidationError("a range policy needs at least one (lower bound, partition)")
        checked = []
        for entry in self.boundaries:
            if not isinstance(entry, list | tuple) or len(entry) != 2:
                raise ValidationError(f"boundary {entry!r} must be a (lower bound, partition) pair")
            bound, partition = entry
            bound = self.typed_key(bound)
            if self.partitions is not None and partition not in self.partitions:
                raise ValidationError(f"boundary partition {partition!r} is not declared")
            checked.append((bound, validate_name("partition", partition)))
        bounds = [bound for bound, _ in checked]
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            raise ValidationError("range boundaries must be strictly increasing")
        return tuple(checked)

    def typed_key(self, key: object) -> Key:
        """A key in the type range comparisons use; ValidationError if it does not convert."""
        if self.key_type == "int":
            try:
                if isinstance(key, bool):
                    raise ValueError
                return int(key)  # type: ignore[call-overload]
            except (TypeError, ValueError):
                raise ValidationError(f"key {key!r} is not an integer") from None
        return validate_key(key)

    def check_partition(self, partition: str) -> str:
        """Validate a partition an assignment names against the declared set."""
        validate_name("partition", partition)
        if self.partitions is not None and partition not in self.partitions:
            raise ValidationError(
                f"partition {partition!r} is not one of policy {self.policy!r}'s "
                f"partitions {list(self.partitions)}"
            )
        return partition

    def to_bytes(self, path: str) -> bytes:
        """The node's value."""
        document: dict[str, Any] = {"kind": self.kind, "partitions": self.partitions}
        if self.kind == "directory":
            document["buckets"] = self.buckets
        if self.kind == "range":
            document["boundaries"] = [list(pair) for pair in self.boundaries]
            document["key_type"] = self.key_type
        return encode(path, document)

    @classmethod
    def from_bytes(cls, policy: str, path: str, data: bytes | None) -> ShardPolicySpec:
        """Decode and validate a policy spec; raise DecodeError if it is not one."""
        document = decode(path, data)
        with fields_of(path):
            partitions = document.get("partitions")
            return cls(
                policy=policy,
                kind=document["kind"],
                partitions=tuple(partitions) if isinstance(partitions, list) else partitions,
                boundaries=tuple(document.get("boundaries") or ()),
                key_type=document.get("key_type", "str"),
                buckets=document.get("buckets", DEFAULT_BUCKETS),
            )


def encode_bucket(path: str, keys: Mapping[str, str]) -> bytes:
    """A directory bucket's value: keys grouped by partition; ValueTooLarge says to use more
    buckets.

    Grouping writes each partition name once per bucket instead of once per key, which makes
    the value smaller and spares readers a string object per key.
    """
    grouped: dict[str, list[str]] = {}
    for key, partition in keys.items():
        grouped.setdefault(partition, []).append(key)
    try:
        return encode(path, {"partitions": grouped})
    except ValueTooLarge as exc:
        raise ValueTooLarge(f"{exc}; create the policy with more buckets") from None


def decode_bucket(path: str, data: bytes | None) -> dict[str, str]:
    """A directory bucket's key → partition map; one invalid entry makes the node invalid."""
    grouped = decode(path, data).get("partitions")
    if not isinstance(grouped, dict):
        raise DecodeError(path, "'partitions' must be an object")
    keys: dict[str, str] = {}
    try:
        for partition, members in grouped.items():
            validate_name("partition", partition)
            if not isinstance(members, list):
                raise ValidationError(f"keys of partition {partition!r} must be a list")
            partition = sys.intern(partition)  # a million keys share a few partition names
            for key in members:
                keys[validate_key(key)] = partition
    except ValidationError as exc:
        raise DecodeError(path, str(exc)) from None
    return keys


class DirectoryMap:
    """Client-side lookup for a directory policy: one flat dict, updated a bucket at a time.

    The dict is changed in place (each key's assignment is one atomic store) rather than copied
    on every change: copying a map of a million keys costs tens of milliseconds per update, and
    no reader needs two keys to agree with each other.
    """

    def __init__(self, spec: ShardPolicySpec) -> None:
        self.spec = spec
        self.keys: dict[str, str] = {}
        self._bucket_keys: list[tuple[str, ...]] = [()] * spec.buckets
        # The lookup is the dict's own C method: no Python frame on the hot path. A key of
        # another type (an int) misses here and is normalised on the read-through path.
        self.lookup = self.keys.get

    def apply_bucket(self, index: int, mapping: Mapping[str, str]) -> dict[str, tuple[Any, Any]]:
        """Replace bucket ``index`` with ``mapping``; return ``{key: (old, new)}`` of changes."""
        changes: dict[str, tuple[Any, Any]] = {}
        keys = self.keys
        for key in self._bucket_keys[index]:
            if key not in mapping:
                changes[key] = (keys.pop(key, None), None)
        for key, partition in mapping.items():
            old = keys.get(key)
            if old != partition:
                keys[key] = partition
                changes[key] = (old, partition)
        self._bucket_keys[index] = tuple(mapping)
        return changes


class RangeMap:
    """Client-side lookup for a range policy (immutable)."""

    def __init__(self, spec: ShardPolicySpec) -> None:
        self.spec = spec
        self._bounds = [bound for bound, _ in spec.boundaries]
        self._partitions = [partition for _, partition in spec.boundaries]

    def lookup(self, key: Key) -> str | None:
        """The partition of the greatest lower bound not above ``key``; None below the first."""
        try:
            typed = self.spec.typed_key(key)
        except ValidationError:
            return None
        index = bisect.bisect_right(self._bounds, typed) - 1
        return self._partitions[index] if index >= 0 else None


class HashMap:
    """Client-side lookup for a hash policy (immutable but for a bounded memo of answers)."""

    MEMO_SIZE = 100_000

    def __init__(self, spec: ShardPolicySpec) -> None:
        self.spec = spec
        self._partitions = spec.partitions or ()
        self._memo: dict[Key, str] = {}

    def lookup(self, key: Key) -> str:
        """The partition ``key`` hashes to."""
        partition = self._memo.get(key)
        if partition is None:
            text = key if type(key) is str else str(key)
            partition = self._partitions[jump_hash(_key_hash64(text), len(self._partitions))]
            if len(self._memo) < self.MEMO_SIZE:  # stop memoising rather than evict
                self._memo[key] = partition
        return partition


ShardMap = DirectoryMap | RangeMap | HashMap


def new_map(spec: ShardPolicySpec) -> ShardMap:
    """The lookup structure for ``spec`` (empty for a directory; the cache fills it)."""
    return {"directory": DirectoryMap, "range": RangeMap, "hash": HashMap}[spec.kind](spec)


# --- writer operations ---------------------------------------------------------------------


def read_spec(zk: KazooClient, policy: str) -> ShardPolicySpec:
    """Read a policy's spec; ShardPolicyNotFound if it does not exist."""
    path = policy_path(validate_name("shard policy", policy))
    try:
        data, _ = zk.get(path)
    except NoNodeError:
        raise ShardPolicyNotFound(f"shard policy {policy!r} does not exist") from None
    return ShardPolicySpec.from_bytes(policy, path, data)


def create_policy(zk: KazooClient, spec: ShardPolicySpec) -> None:
    """Create the policy node and, for a directory, all its buckets, in one transaction."""
    path = policy_path(spec.policy)
    zk.ensure_path(SHARD_INFO)  # a namespace no client has started in yet lacks it
    transaction = zk.transaction()
    transaction.create(path, spec.to_bytes(path))
    if spec.kind == "directory":
        for index in range(spec.buckets):
            bucket = bucket_path(spec.policy, index)
            transaction.create(bucket, encode_bucket(bucket, {}))
    failure = first_failure(transaction.commit())
    if isinstance(failure, NodeExistsError):
        raise ShardPolicyExists(f"shard policy {spec.policy!r} already exists")
    if failure is not None:
        raise failure


def _directory_spec(zk: KazooClient, policy: str) -> ShardPolicySpec:
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
    spec = _directory_spec(zk, policy)
    by_bucket: dict[int, dict[str, str | None]] = {}
    for key, partition in changes.items():
        text = validate_key(key)
        target = None if partition is None else spec.check_partition(partition)
        by_bucket.setdefault(bucket_of(text, spec.buckets), {})[text] = target
    written = 0
    pending = by_bucket
    for _ in range(_CAS_ATTEMPTS):
        if not pending:
            return written
        conflicted = _write_buckets(zk, spec, pending)
        written += len(pending) - len(conflicted)
        pending = {index: by_bucket[index] for index in conflicted}
    raise RegistryConflict(f"buckets {sorted(pending)} of {policy!r} kept changing")


def _write_buckets(
    zk: KazooClient, spec: ShardPolicySpec, by_bucket: Mapping[int, Mapping[str, str | None]]
) -> set[int]:
    """One compare-and-set pass; returns the buckets that lost a race and need another."""
    batches: list[list[tuple[int, str, bytes, int]]] = [[]]
    size = 0
    for index, result in pipelined_reads(zk, by_bucket, lambda i: bucket_path(spec.policy, i)):
        path = bucket_path(spec.policy, index)
        data, stat = result.get()
        keys = decode_bucket(path, data)
        for key, partition in by_bucket[index].items():
            if partition is None:
                keys.pop(key, None)
            else:
                keys[key] = partition
        value = encode_bucket(path, keys)
        if size + len(value) > _TRANSACTION_BYTES and batches[-1]:
            batches.append([])
            size = 0
        batches[-1].append((index, path, value, stat.version))
        size += len(value)
    conflicted: set[int] = set()
    for batch in batches:
        transaction = zk.transaction()
        for _, path, value, version in batch:
            transaction.set_data(path, value, version=version)
        failure = first_failure(transaction.commit())
        if isinstance(failure, BadVersionError | NoNodeError):
            conflicted.update(index for index, *_ in batch)
        elif failure is not None:
            raise failure
    return conflicted


def read_key(zk: KazooClient, spec: ShardPolicySpec, key: Key) -> str | None:
    """Read one key's partition straight from ZooKeeper (the paper's Procedure 1)."""
    text = validate_key(key)
    path = bucket_path(spec.policy, bucket_of(text, spec.buckets))
    try:
        data, _ = zk.get(path)
    except NoNodeError:
        return None
    return decode_bucket(path, data).get(text)


def iter_assignments(zk: KazooClient, policy: str) -> Iterable[tuple[str, str]]:
    """Every ``(key, partition)`` of a directory policy, read bucket by bucket."""
    spec = _directory_spec(zk, policy)
    for index, result in pipelined_reads(zk, range(spec.buckets), lambda i: bucket_path(policy, i)):
        yield from decode_bucket(bucket_path(policy, index), result.get()[0]).items()


# --- placement requests (the shard manager daemon's queue) ---------------------------------

REQUESTS = "requests"


def requests_path(policy: str) -> str:
    """Where keys wait for the shard manager to place them (not a bucket name: not hex)."""
    return f"{policy_path(policy)}/{REQUESTS}"


def request_node(policy: str, key: str) -> str:
    """A key's request node; the name is the key's UTF-8 in hex, so any key is a valid name."""
    return f"{requests_path(policy)}/{key.encode('utf-8').hex()}"


def request_placement(zk: KazooClient, policy: str, key: Key) -> bool:
    """Ask the shard manager to place ``key``; False if it is already assigned.

    The request is a persistent node, so it survives until a leader has placed the key.
    """
    text = validate_key(key)
    spec = _directory_spec(zk, policy)
    if read_key(zk, spec, text) is not None:
        return False
    path = request_node(policy, text)
    with contextlib.suppress(NodeExistsError):  # already requested
        zk.create(path, encode(path, {"key": text}), makepath=True)
    return True


def place_key(zk: KazooClient, spec: ShardPolicySpec, key: str, partition: str) -> str:
    """Assign ``key`` to ``partition`` unless it already has one; return the one it has.

    The check and the write are one compare-and-set on the key's bucket, so two managers
    racing (a leader that has not noticed it was replaced) still place a key only once.
    """
    path = bucket_path(spec.policy, bucket_of(key, spec.buckets))
    for _ in range(_CAS_ATTEMPTS):
        data, stat = zk.get(path)
        keys = decode_bucket(path, data)
        if key in keys:
            return keys[key]
        keys[key] = spec.check_partition(partition)
        try:
            zk.set(path, encode_bucket(path, keys), version=stat.version)
            return partition
        except BadVersionError:
            continue
    raise RegistryConflict(f"bucket {path} kept changing while placing {key!r}")
