"""The reads a cache makes of the registry, written once for every way of following it.

Every node is untrusted: a node that fails to decode is logged, counted and skipped, and a
service already served keeps its last readable spec. What differs between the watch modes is
passed in, not asked about: the watch a read sets (kazoo's one-shot watch, or none under a
recursive one), how many nodes are read at once, and what is done about a node that is absent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import WatchedEvent, ZnodeStat

from sentinel.auth.envelope import Credential
from sentinel.auth.reader import CredentialReader
from sentinel.cache.stats import CacheStats
from sentinel.cache.views import ServiceSnapshot
from sentinel.errors import DecodeError, ServiceNotFound
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.layout import METRICS, auth_path, service_path
from sentinel.registry.reads import ReadBudget, Reads, decode_children
from sentinel.registry.records import (
    InstanceRecord,
    MetricsRecord,
    ServiceSpec,
    check_ephemeral,
    fields_of,
)
from sentinel.shards.spec import ShardPolicySpec, bucket_path, decode_bucket, policy_path
from sentinel.telemetry import observe_propagation

log = logging.getLogger(__name__)

# What a follower reads of one section of a service (its instances, or its metrics), at most.
# Registries hold thousands of instances per service (10,000 measured in the benchmarks), each
# node well under a KB; past these bounds a writer is flooding the section, and reading all of
# it would stall every new client's first lookup. The excess is skipped, counted and logged.
MAX_SECTION_NODES = 20_000
MAX_SECTION_BYTES = 32 * 1024 * 1024

Watch = Callable[[WatchedEvent], None]
Decoder = Callable[[str, str, bytes, ZnodeStat], Any]
_UNREAD = object()  # no reply read ahead for a node


class Reply:
    """One node's reply already in (a multi-read's, or read ahead), with a kazoo async
    result's ``get``."""

    __slots__ = ("reply",)

    def __init__(self, reply: Any) -> None:
        self.reply = reply  # (data, stat), or the exception of that node

    def get(self) -> Any:
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


class ServiceState(NamedTuple):
    """Everything read of one service: what a :class:`ServiceSnapshot` is built from."""

    spec: ServiceSpec
    endpoints: dict[str, Endpoint]
    metrics: dict[str, MetricsRecord]
    invalid: frozenset[str]
    auth: Credential | None


class Section(NamedTuple):
    """Where one section of a service lives, which snapshot field holds it, how it decodes."""

    parent: str
    field: str
    decode: Decoder


# The snapshot field each section's children are held in.
FIELD_OF = {"instances": "endpoints", "metrics": "metrics"}


def section_of(section: str, service: str, *, ephemeral_only: bool = False) -> Section:
    """``instances`` (``/services/<service>``, as Endpoints) or ``metrics``
    (``/metrics/<service>``, as MetricsRecords). ``ephemeral_only``: a persistent instance
    node is a :class:`DecodeError` (a secured namespace's rule:
    :func:`~sentinel.registry.records.check_ephemeral`)."""
    if section == "instances":

        def instance(name: str, path: str, data: bytes, stat: ZnodeStat) -> Endpoint:
            if ephemeral_only:
                check_ephemeral(path, stat.ephemeralOwner)
            record = InstanceRecord.from_bytes(service, name, path, data)
            return Endpoint.from_record(record, joined=stat.czxid)

        return Section(service_path(service), FIELD_OF[section], instance)
    return Section(
        f"{METRICS}/{service}",
        FIELD_OF[section],
        lambda name, path, data, _: MetricsRecord.from_bytes(service, name, path, data),
    )


class ServiceReads:
    """The decoding reads of services, credentials and shard policies.

    ``watch`` is set by every read (None: none); ``reads`` reads many nodes at once;
    ``watch_absent(path)`` learns when an absent node appears and says whether it exists
    already (created between two reads); ``ephemeral_instances``: serve only ephemeral
    instance nodes (a secured namespace's rule,
    :func:`~sentinel.registry.records.check_ephemeral`).
    """

    def __init__(
        self,
        zk: KazooClient,
        stats: CacheStats,
        credentials: CredentialReader | None,
        *,
        watch: Watch | None,
        reads: Reads,
        watch_absent: Callable[[str], bool],
        ephemeral_instances: bool = False,
    ) -> None:
        self._zk = zk
        self._ephemeral_instances = ephemeral_instances
        self._stats = stats
        self._credentials = credentials
        self._watch = watch
        self._reads = reads
        self._watch_absent = watch_absent
        self._over_limit: set[str] = set()  # sections reported past the bounds
        # Replies read ahead for the reads below, by ("data" or "children", path): each
        # answers one read, in place of a request (see reading_ahead).
        self._ahead: dict[tuple[str, str], Any] = {}

    def first_paths(self, service: str) -> tuple[list[str], list[str]]:
        """The nodes :meth:`service`'s first read of ``service`` reads, before its children:
        the paths whose data it reads, and those whose children it lists."""
        data = [service_path(service)]
        if self._credentials is not None:
            data.append(auth_path(service, self._credentials.client))
        listed = [self._section_of(section, service).parent for section in FIELD_OF]
        return data, listed

    @contextlib.contextmanager
    def reading_ahead(self, replies: Mapping[tuple[str, str], Any]) -> Iterator[None]:
        """Within the block, a read of a node in ``replies`` (by ``("data", path)`` or
        ``("children", path)``: the reply, or the error of that read) is answered from there,
        once, instead of sent: replies many services' reads asked for together (requests in
        flight at once, sent after the watches that report later changes). Replies not used by
        the end of the block are dropped."""
        self._ahead = dict(replies)
        try:
            yield
        finally:
            self._ahead = {}

    def _answer(self, kind: str, path: str, read: Callable[..., Any]) -> Any:
        """A node's data or children: read ahead, or read now."""
        reply = self._ahead.pop((kind, path), _UNREAD) if self._ahead else _UNREAD
        if reply is _UNREAD:
            return read(path, watch=self._watch)
        return Reply(reply).get()

    def _read_children(
        self, names: Iterable[str], path_of: Callable[[str], str]
    ) -> Iterator[tuple[str, Any]]:
        """The follower's ``reads``, but for the nodes read ahead (see :meth:`reading_ahead`)."""
        unread = []
        for name in names:
            reply = self._ahead.pop(("data", path_of(name)), _UNREAD) if self._ahead else _UNREAD
            if reply is _UNREAD:
                unread.append(name)
            else:
                yield name, Reply(reply)
        if unread:
            yield from self._reads(unread, path_of)

    def service(self, service: str, last_good: ServiceSpec | None = None) -> ServiceState:
        """The spec, instances, metrics and this client's credential of ``service`` (no
        instances when the spec names a Curator registry: they are read there).

        Raises :class:`ServiceNotFound` when its node is gone (or, never served, unreadable).
        """
        spec = self.spec(service, last_good)
        endpoints: dict[str, Endpoint] = {}
        bad_instances: set[str] = set()
        if spec.curator is None:  # else a Curator registry's (sentinel.cache.curator)
            endpoints, bad_instances = self.section("instances", service)
        metrics, bad_metrics = self.section("metrics", service, first=endpoints)
        invalid = frozenset(bad_instances | bad_metrics)
        return ServiceState(spec, endpoints, metrics, invalid, self.auth(service))

    def spec(self, service: str, last_good: ServiceSpec | None = None) -> ServiceSpec:
        """The service's spec. An unreadable one is skipped: a service already served keeps
        its ``last_good`` spec (one bad write must not unlist it everywhere)."""
        path = service_path(service)
        try:
            data, _ = self._answer("data", path, self._zk.get)
        except NoNodeError:
            raise ServiceNotFound(service) from None
        try:
            return ServiceSpec.from_bytes(service, path, data)
        except DecodeError as exc:
            self.skip(exc)
            if last_good is not None:
                return last_good
            raise ServiceNotFound(service, f"has an unreadable spec: {exc}") from None

    def section(
        self,
        section: str,
        service: str,
        known: ServiceSnapshot | None = None,
        first: Iterable[str] = (),
    ) -> tuple[dict[str, Any], set[str]]:
        """Decode the children of one section of ``service`` (see :func:`section_of`).

        With ``known`` (a children event while watches are in place) only new children are
        read: the others' data watches report their own changes. A known name may be a new
        node (deleted and created again); its old node's watch fired with the deletion, and
        that event's task reads the new one. Returns the decoded children by name and the
        paths that failed. At most MAX_SECTION_NODES children and MAX_SECTION_BYTES of data
        are read (``first`` before the others: a metrics read takes the instances' own nodes
        first), the rest skipped and counted.
        """
        parent, field, decode = self._section_of(section, service)
        try:
            names = self._answer("children", parent, self._zk.get_children)
        except NoNodeError:
            if section == "instances":
                raise ServiceNotFound(service) from None
            if self._watch_absent(parent):  # created between the two reads: list it again
                return self.section(section, service, known)
            return {}, set()
        decoded: dict[str, Any] = {}
        invalid: set[str] = set()
        unread = names
        if known is not None:
            current = getattr(known, field)
            decoded = {n: current[n] for n in names if n in current}
            invalid = {f"{parent}/{n}" for n in names if f"{parent}/{n}" in known.invalid}
            unread = [n for n in names if n not in decoded and f"{parent}/{n}" not in invalid]
            decode = _timed(section, decode)  # new children of a live service: a change
        preferred = set(first)
        if preferred:  # the preferred names first, the rest in their order
            unread = sorted(unread, key=lambda name: name not in preferred)
        room = max(MAX_SECTION_NODES - len(decoded) - len(invalid), 0)
        budget = ReadBudget(MAX_SECTION_BYTES, skipped=len(unread) - min(room, len(unread)))
        fresh, failed = decode_children(
            self._zk, parent, unread[:room], decode, reads=self._read_children, budget=budget
        )
        if budget.skipped:
            self._stats.over_limit += budget.skipped
        if budget.skipped and parent not in self._over_limit:  # once, not per event
            self._over_limit.add(parent)
            log.warning(
                "%s has more than a follower reads (%d nodes, %d MiB): %d left unread; "
                "'sentinel doctor' names what is flooding it",
                parent,
                MAX_SECTION_NODES,
                MAX_SECTION_BYTES >> 20,
                budget.skipped,
            )
        for exc in failed.values():
            self.skip(exc)
        decoded.update(fresh)
        invalid.update(f"{parent}/{n}" for n in failed)
        return decoded, invalid

    def _section_of(self, section: str, service: str) -> Section:
        return section_of(section, service, ephemeral_only=self._ephemeral_instances)

    @staticmethod
    def has_room(section: str, known: ServiceSnapshot, name: str) -> bool:
        """Whether child ``name`` of a section of ``known`` is read: one it holds, or a
        newcomer while the section is under MAX_SECTION_NODES."""
        held = getattr(known, FIELD_OF[section])
        return name in held or len(held) < MAX_SECTION_NODES

    def child(
        self, section: str, known: ServiceSnapshot, service: str, name: str, read: Any = None
    ) -> tuple[Any, bool] | None:
        """One child of a section read again: ``(value, unreadable)``, value None when it is
        gone or unreadable; None when it is a newcomer to a section past MAX_SECTION_NODES
        (left unread, counted). ``read``: the node's read already sent (an async result)."""
        parent, _, decode = self._section_of(section, service)
        if not self.has_room(section, known, name):
            self._stats.over_limit += 1
            return None
        path = f"{parent}/{name}"
        try:
            data, stat = self._zk.get(path, watch=self._watch) if read is None else read.get()
        except NoNodeError:
            return None, False
        observe_propagation(section, stat)
        try:
            with fields_of(path):
                value = decode(name, path, data, stat)
        except DecodeError as exc:
            self.skip(exc)
            return None, True
        return value, False

    def auth(self, service: str) -> Credential | None:
        """This client's newest readable credential for ``service``.

        Never one older than a credential applied before (see :mod:`sentinel.auth.reader`):
        a replayed old version is logged, counted in ``auth_errors``, and the applied one kept.
        """
        if self._credentials is None:
            return None
        path = auth_path(service, self._credentials.client)
        try:
            data, stat = self._answer("data", path, self._zk.get)
        except NoNodeError:
            self._watch_absent(path)
            self._credentials.forget(service)
            return None
        observe_propagation("auth", stat)
        return open_credential(self._credentials, self._stats, service, data)

    def forget_auth(self, service: str) -> None:
        """This client's credential node for ``service`` is gone."""
        if self._credentials is not None:
            self._credentials.forget(service)

    def policy(self, policy: str) -> ShardPolicySpec | None:
        """A shard policy's spec, None when it does not exist. An unreadable one is counted
        and its :class:`DecodeError` raised: the caller keeps what it had."""
        path = policy_path(policy)
        try:
            data, _ = self._zk.get(path, watch=self._watch)
        except NoNodeError:
            self._watch_absent(path)
            return None
        try:
            return ShardPolicySpec.from_bytes(policy, path, data)
        except DecodeError as exc:
            self.skip(exc)
            raise

    def buckets(self, spec: ShardPolicySpec) -> Iterator[tuple[int, dict[str, str] | None]]:
        """``(index, keys)`` of each bucket of a directory policy; keys None for a bucket
        that is not valid (:func:`~sentinel.shards.spec.decode_bucket`; counted): the caller
        keeps what it held of it."""
        policy = spec.policy
        for index, result in self._reads(range(spec.buckets), lambda i: bucket_path(policy, i)):
            yield index, self._bucket_keys(spec, index, result)

    def bucket(self, spec: ShardPolicySpec, index: int) -> dict[str, str] | None:
        """The keys of one bucket, read again after an event (None: not valid, counted)."""
        result = self._zk.get_async(bucket_path(spec.policy, index), watch=self._watch)
        keys = self._bucket_keys(spec, index, result)
        if result.successful():
            observe_propagation("shard_info", result.value[1])
        return keys

    def skip(self, exc: DecodeError) -> None:
        """Count and log a node that could not be decoded."""
        self._stats.decode_errors += 1
        log.warning("skipping %s", exc)

    def _bucket_keys(self, spec: ShardPolicySpec, index: int, result: Any) -> dict[str, str] | None:
        try:
            data, _ = result.get()
            return decode_bucket(spec, index, data)
        except NoNodeError:
            return {}
        except DecodeError as exc:
            self.skip(exc)
            return None


def open_credential(
    credentials: CredentialReader, stats: CacheStats, service: str, data: bytes
) -> Credential | None:
    """This client's newest readable credential in ``service``'s credential node ``data``
    (as read from ZooKeeper, or as the host agent forwarded it); each envelope that does not
    open is logged and counted in ``auth_errors``."""
    path = auth_path(service, credentials.client)
    try:
        credential, errors = credentials.newest(service, path, data)
    except DecodeError as exc:
        credential, errors = None, [exc]
    for error in errors:
        stats.auth_errors += 1
        log.warning("skipping a credential: %s", error)  # messages hold no secrets
    return credential


def _timed(section: str, decode: Decoder) -> Decoder:
    """``decode``, observing each node's propagation delay first."""

    def timed(name: str, path: str, data: bytes, stat: Any) -> Any:
        observe_propagation(section, stat)
        return decode(name, path, data, stat)

    return timed
