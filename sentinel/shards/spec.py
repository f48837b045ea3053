"""A shard policy's spec, the layout of its nodes, and the codecs of the spec and its buckets.

A policy lives at ``/shard_info/<policy>``; a ``directory`` policy's keys live in a fixed number
of bucket nodes under it (``crc32(utf-8 key) % buckets``, one JSON map per bucket), so that a
cold load or a re-sync reads ``buckets`` nodes instead of one node per key (the paper's layout
costs a round trip per key: over 20 s for 100,000 keys), and a single key change re-reads one
bucket. Everything here is pure: no ZooKeeper, no I/O.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sentinel.errors import DecodeError, ShardMapInvalid, ValidationError, ValueTooLarge
from sentinel.registry.layout import SHARD_INFO, validate_name
from sentinel.registry.records import decode, encode, fields_of

KINDS = ("directory", "range", "hash")
DEFAULT_BUCKETS = 256
MAX_BUCKETS = 65536
MAX_KEY_LENGTH = 256

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

    @property
    def declared(self) -> tuple[str, ...] | None:
        """The partitions keys can map to: ``partitions``, else a range's boundaries' ones;
        None when any partition can (a directory without declared partitions)."""
        if self.partitions is None and self.kind == "range":
            return tuple(dict.fromkeys(partition for _, partition in self.boundaries))
        return self.partitions

    def check_partition(self, partition: str) -> str:
        """Validate a partition an assignment (or a registration) names against the declared
        set."""
        validate_name("partition", partition)
        declared = self.declared
        if declared is not None and partition not in declared:
            raise ValidationError(
                f"partition {partition!r} is not one of policy {self.policy!r}'s "
                f"partitions {list(declared)}"
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


def decode_bucket(spec: ShardPolicySpec, index: int, data: bytes | None) -> dict[str, str]:
    """Bucket ``index`` of a directory policy as its key → partition map: the one check of a
    bucket every reader makes (the cache, the host agent's processes, the snapshot file, the
    writers, ``sentinel shard sync`` and ``sentinel doctor``).

    One invalid entry makes the node invalid: :class:`DecodeError` for one that does not
    decode, :class:`ShardMapInvalid` for one that decodes but contradicts ``spec`` (a bucket
    number it does not have, a key whose own bucket is another, a partition it does not
    declare), naming the key, the bucket and the partition. Such a bucket would send a key to
    a partition no writer put it in, whatever the digest says (whoever writes the buckets can
    write the digest to match)."""
    path = bucket_path(spec.policy, index)
    if not 0 <= index < spec.buckets:
        raise ShardMapInvalid(
            path,
            f"policy {spec.policy!r} has {spec.buckets} bucket(s), not a bucket {index}",
            policy=spec.policy,
            bucket=index,
        )
    grouped = decode(path, data).get("partitions")
    if not isinstance(grouped, dict):
        raise DecodeError(path, "'partitions' must be an object")
    declared = spec.declared
    keys: dict[str, str] = {}
    try:
        for partition, members in grouped.items():
            validate_name("partition", partition)
            if not isinstance(members, list):
                raise ValidationError(f"keys of partition {partition!r} must be a list")
            partition = sys.intern(partition)  # a million keys share a few partition names
            for key in members:
                keys[validate_key(key)] = partition
            if members and declared is not None and partition not in declared:
                raise ShardMapInvalid(
                    path,
                    f"key {validate_key(members[0])!r} is assigned to partition {partition!r}, "
                    f"which policy {spec.policy!r} does not declare ({', '.join(declared)})",
                    policy=spec.policy,
                    bucket=index,
                    key=validate_key(members[0]),
                    partition=partition,
                )
    except ValidationError as exc:
        raise DecodeError(path, str(exc)) from None
    crc32, count = zlib.crc32, spec.buckets  # bucket_of, inlined: a cold load runs it per key
    stray = next((key for key in keys if crc32(key.encode("utf-8")) % count != index), None)
    if stray is not None:
        raise ShardMapInvalid(
            path,
            f"key {stray!r} (partition {keys[stray]!r}) belongs in bucket "
            f"{bucket_of(stray, count)}, not {index}",
            policy=spec.policy,
            bucket=index,
            key=stray,
            partition=keys[stray],
        )
    return keys
