"""Keeping the regions' replicas of a shard map equal: the placement daemon's keys copied to
the other regions (:class:`PlacementCopies`), and one region's map copied over another's
(:func:`copy_map`, ``sentinel shard sync``).

Shard maps are the same in every region (docs/decisions/shard-maps-replicated-per-region.md).
The shard manager's leader places a requested key in its own region; :class:`PlacementCopies`
then copies each placement to every other configured region with the same compare-and-set
(:func:`~sentinel.shards.placement.place_key`, which keeps an existing assignment and moves the
digest with the bucket). A placement stays pending for a region until that region holds it: a
region that is down or refuses is retried on every round of the daemon's loop, so it catches up
when it comes back, and a region that already holds the key in another partition is reported
(an ``alert``), never overwritten.

Each region's session is opened on the first placement to copy, and connects in the
background (kazoo retries by itself): a region that is down never blocks the daemon's loop or
the placements in its own region. Pending copies live in the leader's memory: a leader that
dies with some pending leaves those regions behind, which ``sentinel doctor --region all``
reports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from sentinel.errors import (
    DecodeError,
    RegistryConflict,
    SentinelError,
    ShardMapInvalid,
    ShardPolicyConflict,
    ShardPolicyNotFound,
)
from sentinel.events import Reporter
from sentinel.registry.reads import pipelined_reads
from sentinel.registry.records import MAX_VALUE_BYTES
from sentinel.shards.digest import MapDigest, digest_path
from sentinel.shards.placement import place_key
from sentinel.shards.spec import ShardPolicySpec, bucket_path, decode_bucket, encode_bucket
from sentinel.shards.store import create_policy, read_directory_spec, read_map_state, read_spec
from sentinel.zk.ephemeral import first_failure

log = logging.getLogger(__name__)


class PlacementCopies:
    """Copies of one policy's placements to other regions: ``regions`` maps each region's name
    to a function returning a (not yet started) kazoo client rooted at its namespace."""

    def __init__(
        self, policy: str, regions: Mapping[str, Callable[[], KazooClient]], report: Reporter
    ) -> None:
        self.policy = policy
        self._connect = dict(regions)
        self._report = report
        self._clients: dict[str, KazooClient] = {}
        self._pending: dict[str, dict[str, str]] = {name: {} for name in regions}
        self._behind: set[str] = set()  # regions reported behind, until they catch up

    def add(self, key: str, partition: str) -> None:
        """Copy ``key -> partition`` to every other region (on the next :meth:`flush`)."""
        for pending in self._pending.values():
            pending[key] = partition

    def pending(self) -> dict[str, int]:
        """How many placements each region still lacks."""
        return {region: len(keys) for region, keys in self._pending.items()}

    def flush(self) -> None:
        """Copy what each region lacks, region by region; a region that cannot be written now
        keeps its copies for the next call. Called from the daemon's loop, never from
        kazoo's thread."""
        for region, keys in self._pending.items():
            if not keys:
                continue
            zk = self._client(region)
            if not zk.connected:
                self._fell_behind(region, "not connected")
                continue
            try:
                spec = read_directory_spec(zk, self.policy)
                for key, partition in list(keys.items()):
                    held = place_key(zk, spec, key, partition)
                    del keys[key]
                    if held != partition:
                        self._report(
                            "alert",
                            {
                                "region": region,
                                "key": key,
                                "partition": partition,
                                "problem": f"region {region} holds the key in {held}",
                            },
                        )
                    else:
                        self._report(
                            "replicated", {"region": region, "key": key, "partition": partition}
                        )
            except (SentinelError, KazooException, KazooTimeoutError) as exc:
                self._fell_behind(region, str(exc) or type(exc).__name__)
                continue
            if region in self._behind:
                self._behind.discard(region)
                self._report("caught up", {"region": region})

    def _client(self, region: str) -> KazooClient:
        zk = self._clients.get(region)
        if zk is None:
            zk = self._clients[region] = self._connect[region]()
            zk.start_async()  # connects in the background, retrying until it does
        return zk

    def _fell_behind(self, region: str, why: str) -> None:
        if region not in self._behind:
            self._behind.add(region)
            log.warning("region %s is behind: %s", region, why)
            self._report(
                "behind", {"region": region, "pending": len(self._pending[region]), "why": why}
            )

    def close(self) -> None:
        """Close the regions' sessions (what is still pending is dropped: doctor reports it)."""
        for zk in self._clients.values():
            zk.stop()
            zk.close()
        self._clients.clear()


@dataclass(frozen=True)
class SourceMap:
    """A region's map read whole and checked, to be copied (:func:`read_source`)."""

    spec: ShardPolicySpec
    buckets: Mapping[int, Mapping[str, str]]

    @property
    def digest(self) -> MapDigest:
        """The digest of its keys."""
        return MapDigest.of(pair for keys in self.buckets.values() for pair in keys.items())


def read_source(zk: KazooClient, policy: str) -> SourceMap:
    """Read a region's map to copy it (``sentinel shard sync --from``), trusting it only whole:
    a spec, bucket or digest that does not decode, or buckets that do not add up to the digest,
    raise DecodeError, and a bucket that contradicts the spec (a key in another bucket than its
    own, a partition not declared) ShardMapInvalid, whatever the digest says: a region that
    lies is never copied."""
    try:
        state = read_map_state(zk, policy)
        problem = state.digest_problem
        if problem is not None:
            raise DecodeError(digest_path(policy), problem)
        buckets = _buckets(zk, state.spec) if state.spec.kind == "directory" else {}
    except ShardMapInvalid as exc:
        raise ShardMapInvalid(
            exc.path,
            f"{exc.reason}; {_NOT_COPIED}",
            policy=exc.policy,
            bucket=exc.bucket,
            key=exc.key,
            partition=exc.partition,
        ) from None
    except DecodeError as exc:
        raise DecodeError(exc.path, f"{exc.reason}; {_NOT_COPIED}") from None
    return SourceMap(state.spec, buckets)


_NOT_COPIED = "this map will not be copied"


def copy_map(
    source: SourceMap, target: KazooClient, policy: str, *, dry_run: bool = False
) -> dict[str, Any]:
    """Make ``target``'s replica of a policy equal to ``source`` (:func:`read_source`; ``sentinel
    shard sync``): the repair of a region that missed changes, was written behind the manager's
    back or holds a bucket or digest that does not decode. Returns ``{"buckets": N, "digest":
    bool}``: the buckets that differed and whether the digest did (written unless
    ``dry_run``).

    The target's policy is created when it has none; a target whose spec differs (another
    kind, partitions, bucket count) is refused (ShardPolicyConflict): its keys would not be
    comparable bucket by bucket. Differing buckets are written whole, compare-and-set on the
    versions read, several per transaction, each transaction also setting the digest to what
    the target holds once it commits; a target changed meanwhile is RegistryConflict (run it
    again).
    """
    spec = source.spec
    try:
        held = read_spec(target, policy)
    except ShardPolicyNotFound:
        if not dry_run:
            create_policy(target, spec)
        held = spec
    if held != spec:
        raise ShardPolicyConflict(
            f"shard policy {policy!r} has another spec in the target ({held}) than in the "
            f"source ({spec}): re-create it there before copying"
        )
    if spec.kind != "directory":
        return {"buckets": 0, "digest": False}  # the spec is the whole map
    current: dict[int, tuple[dict[str, str] | None, int]] = {}
    reads = pipelined_reads(target, range(spec.buckets), lambda i: bucket_path(policy, i))
    for index, result in reads:
        try:
            data, stat = result.get()
        except NoNodeError:
            current[index] = None, -1
            continue
        try:
            current[index] = decode_bucket(spec, index, data), stat.version
        except DecodeError:
            current[index] = None, stat.version  # overwritten whole below
    differing = [i for i in range(spec.buckets) if current[i][0] != source.buckets[i]]
    path = digest_path(policy)
    try:
        data, digest_stat = target.get(path)
        digest_differs = MapDigest.from_bytes(path, data)[0] != source.digest
    except NoNodeError:
        digest_stat, digest_differs = None, True
    except DecodeError:
        digest_differs = True
    report = {"buckets": len(differing), "digest": digest_differs}
    if dry_run or not (differing or digest_differs):
        return report
    held_maps = {i: current[i][0] or {} for i in range(spec.buckets)}
    encoded = {i: encode_bucket(bucket_path(policy, i), source.buckets[i]) for i in differing}
    batches: list[list[int]] = [[]]
    size = 0
    for index in differing:
        if size + len(encoded[index]) > MAX_VALUE_BYTES and batches[-1]:
            batches.append([])
            size = 0
        batches[-1].append(index)
        size += len(encoded[index])
    for batch in batches:
        transaction = target.transaction()
        for index in batch:
            bucket = bucket_path(policy, index)
            if current[index][1] < 0:
                transaction.create(bucket, encoded[index])
            else:
                transaction.set_data(bucket, encoded[index], version=current[index][1])
            held_maps[index] = dict(source.buckets[index])
        digest = MapDigest.of(pair for keys in held_maps.values() for pair in keys.items())
        if digest_stat is None:
            transaction.create(path, digest.to_bytes(path))
        else:
            transaction.set_data(path, digest.to_bytes(path), version=digest_stat.version)
        failure = first_failure(transaction.commit())
        if isinstance(failure, BadVersionError | NoNodeError | NodeExistsError):
            raise RegistryConflict(
                f"shard policy {policy!r} changed in the target during the copy; run it again"
            )
        if failure is not None:
            raise failure
        digest_stat = target.exists(path)
    return report


def _buckets(zk: KazooClient, spec: ShardPolicySpec) -> dict[int, dict[str, str]]:
    """Every bucket of a directory policy, decoded (DecodeError if one does not decode)."""
    return {
        index: decode_bucket(spec, index, result.get()[0])
        for index, result in pipelined_reads(
            zk, range(spec.buckets), lambda i: bucket_path(spec.policy, i)
        )
    }
