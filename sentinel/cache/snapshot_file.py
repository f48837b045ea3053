"""The last-known-good snapshot: the client's cache on disk, for starting without ZooKeeper.

With ``CacheConfig(snapshot_path=...)`` a :class:`SnapshotWriter` thread writes the cache to a
file after it changes, at most once per ``min_interval`` seconds, atomically and readable by
its owner only (:func:`~sentinel.private_files.write_private`: a temporary file made with
``mkstemp`` in the same directory, fsynced, then renamed over the old one), so a crash
mid-write leaves the previous snapshot. A file owned by another user or open to group or
others is refused on load like a corrupt one. When no server answers at start,
:func:`load_snapshot` restores it and the client serves it, marked stale
(``connection_state == "snapshot"``, ``staleness`` counted from when it was written), until the
connection comes and the re-sync replaces it.

The file is JSON: ``format``, ``version``, the namespace and a fingerprint of the ensemble's
hosts (a snapshot of another environment is refused, not served), and every node in the form
ZooKeeper held it, so it is decoded by the same codecs and trusted no more than ZooKeeper is.
Decrypted credentials are never written: the encrypted envelope each credential was opened
from is, and a client restoring the snapshot opens it again with its key ring. The highest
credential version the client applied per service is kept too (``auth_version``) and restored
as the client's floor, so a restart from the snapshot cannot be rolled back to an older
credential (see :mod:`sentinel.auth.reader`). A file that
fails any check is rejected with one log line naming the reason, and the client starts as it
would without one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sentinel.auth.reader import CredentialReader
from sentinel.auth.store import AuthRecord
from sentinel.cache.views import ServiceSnapshot
from sentinel.errors import DecodeError, SnapshotRejected, ValidationError
from sentinel.private_files import read_private, write_private
from sentinel.registry.endpoint import Endpoint, format_uri
from sentinel.registry.layout import METRICS, auth_path, service_path
from sentinel.registry.records import InstanceRecord, MetricsRecord, ServiceSpec, parse_json
from sentinel.shards.maps import DirectoryMap, ShardMap, new_map
from sentinel.shards.spec import (
    ShardPolicySpec,
    bucket_path,
    decode_bucket,
    encode_bucket,
    policy_path,
)
from sentinel.strategies import RoundRobin
from sentinel.telemetry import LookupCounts

log = logging.getLogger(__name__)

FORMAT = "sentinel-snapshot"
# A URI a Curator uriSpec rendered, at most: the registry's values are bounded alike.
_MAX_URI = 4096
VERSION = 1


def hosts_fingerprint(hosts: str) -> str:
    """A short digest of the ensemble's members, in any order."""
    members = sorted(h.strip() for h in hosts.split(",") if h.strip())
    return hashlib.sha256(",".join(members).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Restored:
    """A snapshot read back: what the cache serves until it connects."""

    snapshots: Mapping[str, ServiceSnapshot]
    shard_maps: Mapping[str, ShardMap | None]
    written_at: float


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def dump_snapshot(
    snapshots: Mapping[str, ServiceSnapshot],
    shard_maps: Mapping[str, ShardMap | None],
    namespace: str,
    hosts: str,
    auth_versions: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The document for the cache's current state (call with copies of the two dicts);
    ``auth_versions`` are the highest credential versions applied, per service."""
    auth_versions = auth_versions or {}
    services = {
        name: _stored_service(name, snapshot, auth_versions.get(name))
        for name, snapshot in snapshots.items()
    }
    return {**_header(namespace, hosts), "services": services, "shard_maps": _policies(shard_maps)}


def _header(namespace: str, hosts: str) -> dict[str, Any]:
    """The document's fields other than its services and shard maps."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "namespace": namespace,
        "hosts": hosts_fingerprint(hosts),
        "written_at": time.time(),
    }


def _stored_service(
    name: str, snapshot: ServiceSnapshot, auth_version: int | None
) -> dict[str, Any]:
    """One service as the file holds it: :func:`service_entry`, the encrypted envelope the
    credential was opened from (never the credential) and the credential version applied."""
    return {
        **service_entry(name, snapshot),
        "auth": _envelope(snapshot),
        "auth_version": auth_version,
    }


def _policies(shard_maps: Mapping[str, ShardMap | None]) -> dict[str, Any]:
    return {
        policy: policy_entry(policy, shard_map)
        for policy, shard_map in shard_maps.items()
        if shard_map is not None
    }


def service_entry(service: str, snapshot: ServiceSnapshot) -> dict[str, Any]:
    """One service's nodes as ZooKeeper holds them (its spec, each instance with the zxid it
    joined at and, when its URI is not the default one, that URI, and its metrics nodes): the
    snapshot file's form, and the host agent's (:mod:`sentinel.agentlink.protocol`)."""
    return {
        "spec": _text(snapshot.spec.to_bytes(service_path(service))),
        "instances": {node: instance_entry(node, e) for node, e in snapshot.endpoints.items()},
        "metrics": {node: metrics_entry(node, r) for node, r in snapshot.metrics.items()},
    }


def instance_entry(node: str, endpoint: Endpoint) -> list[Any]:
    """One instance as :func:`service_entry` holds it: the zxid it joined at, its node's data
    and, when its URI is not the default one (a Curator uriSpec's), that URI."""
    record = endpoint.record()
    entry: list[Any] = [endpoint.joined, _text(record.to_bytes(node))]
    if endpoint.uri != format_uri(record.scheme, record.host, record.port):
        entry.append(endpoint.uri)
    return entry


def metrics_entry(node: str, record: MetricsRecord) -> str:
    """One metrics node as :func:`service_entry` holds it: its data."""
    return _text(record.to_bytes(node))


def policy_entry(policy: str, shard_map: ShardMap) -> dict[str, Any]:
    """A shard map's nodes as ZooKeeper holds them: its spec and, for a directory, each
    bucket that holds keys (the snapshot file's form, and the host agent's)."""
    entry: dict[str, Any] = {"spec": _text(shard_map.spec.to_bytes(policy_path(policy)))}
    if isinstance(shard_map, DirectoryMap):
        buckets = ((i, shard_map.bucket(i)) for i in range(shard_map.spec.buckets))
        entry["buckets"] = {
            str(i): _text(encode_bucket(bucket_path(policy, i), keys))
            for i, keys in buckets
            if keys
        }
    return entry


def service_parts(
    service: str, entry: Mapping[str, Any]
) -> tuple[ServiceSpec, dict[str, Endpoint], dict[str, MetricsRecord]]:
    """A :func:`service_entry` decoded by the registry's own codecs: the spec, the endpoints
    and the metrics records by node name. Raises on anything that is not one."""
    spec = ServiceSpec.from_bytes(service, service_path(service), entry["spec"].encode())
    endpoints = {node: instance_of(service, node, e) for node, e in entry["instances"].items()}
    metrics = {node: metrics_of(service, node, text) for node, text in entry["metrics"].items()}
    return spec, endpoints, metrics


def instance_of(service: str, node: str, entry: Any) -> Endpoint:
    """An :func:`instance_entry` decoded by the registry's codec (bare: no metrics, no
    credential). Raises on anything that is not one."""
    joined, text, *uri = entry
    path = f"{service_path(service)}/{node}"
    record = InstanceRecord.from_bytes(service, node, path, text.encode())
    endpoint = Endpoint.from_record(record, joined=int(joined))
    if uri:
        if not isinstance(uri[0], str) or len(uri) > 1 or len(uri[0]) > _MAX_URI:
            raise DecodeError(path, "the instance's URI is not a string of a URI's length")
        endpoint = replace(endpoint, uri=uri[0])
    return endpoint


def metrics_of(service: str, node: str, text: Any) -> MetricsRecord:
    """A :func:`metrics_entry` decoded by the registry's codec. Raises on anything else."""
    return MetricsRecord.from_bytes(service, node, f"{METRICS}/{service}/{node}", text.encode())


def load_snapshot(
    path: Path, namespace: str, hosts: str, credentials: CredentialReader | None = None
) -> Restored:
    """Read and check a snapshot; :class:`SnapshotRejected` says why it cannot be served.

    With ``credentials`` (the client's key ring) each service's stored envelope is opened
    again, so endpoints carry ``auth`` while the snapshot is served; one that does not open is
    left out (logged), as it would be from ZooKeeper. The stored highest versions become the
    reader's floors first.
    """
    try:
        # The registry's bounded parser; the file holds many nodes, so no size limit.
        data = read_private(path, "snapshot", SnapshotRejected)
        document = parse_json(str(path), data, max_bytes=None)
    except FileNotFoundError:
        raise SnapshotRejected(f"snapshot {path} does not exist") from None
    except (OSError, DecodeError) as exc:
        raise SnapshotRejected(f"snapshot {path} is unreadable: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise SnapshotRejected(f"{path} is not a Sentinel snapshot")
    if document.get("version") != VERSION:
        raise SnapshotRejected(
            f"snapshot {path} has version {document.get('version')!r}, not {VERSION}"
        )
    if document.get("namespace") != namespace or document.get("hosts") != hosts_fingerprint(hosts):
        raise SnapshotRejected(
            f"snapshot {path} belongs to namespace {document.get('namespace')!r} on another "
            f"ensemble or namespace than {namespace!r} on {hosts}"
        )
    try:
        written_at = float(document["written_at"])
        if credentials is not None:
            credentials.restore_highest(
                {
                    name: _auth_version(entry.get("auth_version"))
                    for name, entry in document["services"].items()
                }
            )
        shard_maps = {
            policy: policy_map(policy, entry) for policy, entry in document["shard_maps"].items()
        }
        snapshots = {
            name: _restore_service(name, entry, credentials)
            for name, entry in document["services"].items()
        }
    except Exception as exc:  # any failure rejects the whole file: ZooKeeper is the truth
        raise SnapshotRejected(f"snapshot {path} is corrupt: {exc!r}") from None
    return Restored(snapshots, shard_maps, written_at)


def _restore_service(
    service: str, entry: Mapping[str, Any], credentials: CredentialReader | None
) -> ServiceSnapshot:
    spec, endpoints, metrics = service_parts(service, entry)
    auth = None
    envelope = entry.get("auth")
    if credentials is not None and envelope is not None:
        path = auth_path(service, credentials.client)
        try:
            record = AuthRecord(service, credentials.client, (envelope,))
            auth, errors = credentials.newest(service, path, record.to_bytes(path))
        except (DecodeError, ValidationError, TypeError) as exc:
            auth, errors = None, [exc]
        for error in errors:
            log.warning("snapshot: skipping a credential: %s", error)
    return ServiceSnapshot.build(
        spec, endpoints, metrics, frozenset(), RoundRobin(), LookupCounts(), auth
    )


def _auth_version(value: object) -> int:
    """A stored ``auth_version``: a non-negative integer, 0 when absent (older snapshots)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError("auth_version is not a non-negative integer")
    return value


def _envelope(snapshot: ServiceSnapshot) -> dict[str, Any] | None:
    auth = snapshot.auth
    return None if auth is None or auth.envelope is None else dict(auth.envelope)


def policy_map(
    policy: str,
    entry: Mapping[str, Any],
    skip: Callable[[ShardPolicySpec, int, DecodeError], Mapping[str, str]] | None = None,
) -> ShardMap:
    """A :func:`policy_entry` decoded by the registry's own codecs, each bucket checked against
    the spec (:func:`~sentinel.shards.spec.decode_bucket`). A spec that does not decode raises;
    so does a bucket that is not valid, unless ``skip`` is given: ``skip(spec, index, error)`` then
    returns the keys to hold in its place (the snapshot file is refused whole, the host agent's
    frame keeps the process's previous bucket, or none for a bucket number the spec lacks)."""
    spec = ShardPolicySpec.from_bytes(policy, policy_path(policy), entry["spec"].encode())
    shard_map = new_map(spec)
    if isinstance(shard_map, DirectoryMap):
        for index_text, text in entry.get("buckets", {}).items():
            index = int(index_text)
            try:
                keys: Mapping[str, str] = decode_bucket(spec, index, text.encode())
            except DecodeError as exc:
                if skip is None:
                    raise
                keys = skip(spec, index, exc)
            if keys:  # a fresh map's buckets start empty (and a bad number has none)
                shard_map.apply_bucket(index, keys)
    return shard_map


class SnapshotWriter:
    """Writes the cache to ``path`` after changes, at most once per ``min_interval`` seconds.

    :meth:`mark_dirty` only sets a flag (the cache's worker calls it after every change); the
    writing happens on this class's own thread, off both kazoo's thread and the cache's. A
    write that would not change the file's contents is skipped. ``auth_versions`` returns the
    highest credential version applied per service (the client's credential reader);
    ``skip`` the services left out (read from Curator base paths: a start from the file serves
    the namespace's services only).

    A write encodes only the services whose snapshot changed since the last one: snapshots are
    immutable, so each service's encoded entry is kept with the snapshot it was encoded from
    and reused while the cache holds that same object (and the same credential version). The
    rest of a write is joining those bytes and writing the file, whole, as before: a change
    costs the CPU of encoding its service, not the cache (the ladder in ``docs/scale.md``).
    """

    def __init__(
        self,
        path: Path,
        snapshots: Mapping[str, ServiceSnapshot],
        shard_maps: Mapping[str, ShardMap | None],
        namespace: str,
        hosts: str,
        min_interval: float = 1.0,
        auth_versions: Callable[[], Mapping[str, int]] | None = None,
        skip: Callable[[], AbstractSet[str]] = frozenset,
    ) -> None:
        self.path = path
        self._skip = skip
        self._auth_versions = auth_versions
        self._snapshots = snapshots
        self._shard_maps = shard_maps
        self._namespace = namespace
        self._hosts = hosts
        self._min_interval = min_interval
        self._dirty = threading.Event()
        self._stop = threading.Event()
        # Per service: the snapshot and credential version its entry was encoded from, and
        # the entry (``"name":{...}``); the writer thread's alone.
        self._encoded: dict[str, tuple[ServiceSnapshot, int | None, bytes]] = {}
        # What the file holds: its shard maps' and services' encodings (None: nothing yet).
        self._last: tuple[bytes, dict[str, bytes]] | None = None
        self.writes = 0
        self.encodes = 0  # services encoded, over all writes
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the writer thread."""
        self._thread = threading.Thread(target=self._run, name="sentinel-snapshot", daemon=True)
        self._thread.start()

    def mark_dirty(self) -> None:
        """The cache changed: write a new snapshot soon."""
        self._dirty.set()

    def close(self) -> None:
        """Write what is pending, then stop."""
        self._stop.set()
        self._dirty.set()
        if self._thread is not None:
            self._thread.join()

    def forget(self) -> None:
        """Drop every service's kept encoding: the next write encodes the whole cache and
        writes the file even if nothing changed (what a first write costs; the ladder times it)."""
        self._encoded = {}
        self._last = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self._dirty.wait()
            self._dirty.clear()
            self.write_now()
            self._stop.wait(self._min_interval)  # the rate limit: changes meanwhile share a write
        self.write_now()

    def write_now(self) -> None:
        """Write the snapshot if the cache holds something new; errors are logged, not raised."""
        try:
            skip = self._skip()
            versions = {} if self._auth_versions is None else self._auth_versions()
            encoded = {}
            for name, snapshot in list(self._snapshots.items()):
                if name not in skip:
                    encoded[name] = self._encoding(name, snapshot, versions.get(name))
            self._encoded = encoded
            services = {name: entry for name, (_, _, entry) in encoded.items()}
            policies = _compact(_policies(dict(self._shard_maps)))
            if (policies, services) == self._last or not services:
                return  # the same bytes objects compare by identity: no content compared
            header = _compact(_header(self._namespace, self._hosts))[:-1]  # without its "}"
            body = b",".join(services.values())
            document = b"".join(
                (header, b',"shard_maps":', policies, b',"services":{', body, b"}}")
            )
            write_private(self.path, document)
            self._last = (policies, services)
            self.writes += 1
        except Exception:
            log.exception("writing the snapshot %s failed; the previous one stays", self.path)

    def _encoding(
        self, name: str, snapshot: ServiceSnapshot, version: int | None
    ) -> tuple[ServiceSnapshot, int | None, bytes]:
        """The kept encoding of ``name`` if it was made from this very snapshot and version,
        else a new one."""
        kept = self._encoded.get(name)
        if kept is not None and kept[0] is snapshot and kept[1] == version:
            return kept
        self.encodes += 1
        entry = _compact(name) + b":" + _compact(_stored_service(name, snapshot, version))
        if kept is not None and kept[2] == entry:
            entry = kept[2]  # an equal rebuild: the same object, so the write is skipped
        return snapshot, version, entry


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
