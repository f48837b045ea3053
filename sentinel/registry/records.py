"""The records stored in ZooKeeper and their JSON codecs.

Every value is a UTF-8 JSON object with a ``"v"`` schema version. Records validate themselves on
construction, so the same checks guard what a publisher writes and what a client reads: a reader
turns a failed check into :class:`~sentinel.errors.DecodeError` and skips the node.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from sentinel.errors import DecodeError, PersistentInstance, ValidationError, ValueTooLarge
from sentinel.registry.failover import Failover
from sentinel.registry.layout import (
    parse_instance_name,
    validate_base_path,
    validate_host,
    validate_name,
)

SCHEMA_VERSION = 1
# ZooKeeper's jute.maxbuffer is 1 MB and a larger write makes the server drop the connection;
# half of it leaves room for the request framing and for multi-op transactions.
MAX_VALUE_BYTES = 512 * 1024
MAX_PROPERTY_KEY_LENGTH = 128
STATUSES = frozenset({"up", "down", "starting", "draining"})
# An instance's health source: any short one is accepted, not only the ones this version
# knows, so that instances a newer publisher checks some other way stay visible to older readers.
MAX_HEALTH_SOURCE = 32
# A readiness check's name and last result, as published with the status it set: what
# `doctor`, `resolve` and the errors show of a failing instance; longer text is cut there.
MAX_CHECK_TEXT = 240
#: The result a passing check publishes (a failing one publishes why it failed).
CHECK_PASSING = "passing"

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]{0,31}\Z")


# Bounds every reader and writer applies before trusting a JSON value (docs/reliability.md).
# Records are flat; properties and defaults may nest a little. A deeper value is hostile, and
# Python's parser would raise RecursionError (or exhaust the C stack) on it.
MAX_JSON_DEPTH = 64
# 10**300 still converts to a float; a longer literal is refused before int() builds it.
MAX_INT_DIGITS = 300
# The highest credential version (the largest integer every JSON reader keeps exact). Only the
# manager issues versions, one at a time; a bigger one in a node is another program's.
MAX_AUTH_VERSION = 2**53 - 1

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS = re.compile(r"[\[\]{}]")


class _OutOfBounds(ValueError):
    """A JSON value over the nesting or number bounds."""


def _json_depth(text: str) -> int:
    """The deepest bracket nesting of ``text`` (JSON), found without recursion.

    Counting the brackets is enough for nearly every value; only when there are more than the
    limit are strings removed and the nesting followed.
    """
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return 0
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRING.sub("", text)):
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _bounded_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise _OutOfBounds(f"an integer of {len(literal)} digits (at most {MAX_INT_DIGITS})")
    return int(literal)


def _finite_float(literal: str) -> float:
    number = float(literal)
    if not math.isfinite(number):
        raise _OutOfBounds("a number out of float range")
    return number


def _no_constant(name: str) -> Any:
    raise _OutOfBounds(f"{name} is not a number JSON allows")


def parse_json(path: str, data: bytes | str, *, max_bytes: int | None = MAX_VALUE_BYTES) -> Any:
    """Parse untrusted JSON within the bounds; any failure is :class:`DecodeError` for ``path``.

    Nesting deeper than :data:`MAX_JSON_DEPTH` is refused before parsing; integers longer than
    :data:`MAX_INT_DIGITS` digits, floats out of range, ``NaN`` and ``Infinity`` while parsing.
    This is the one place where a value read from ZooKeeper (or a snapshot file) becomes Python
    objects, so no reader sees ``RecursionError``, ``OverflowError`` or ``MemoryError``.
    """
    if max_bytes is not None and len(data) > max_bytes:
        raise DecodeError(path, f"value of {len(data)} bytes is over the limit of {max_bytes}")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        depth = _json_depth(text)
        if depth > MAX_JSON_DEPTH:
            raise _OutOfBounds(f"nesting of {depth} levels (at most {MAX_JSON_DEPTH})")
        return json.loads(
            text,
            parse_int=_bounded_int,
            parse_float=_finite_float,
            parse_constant=_no_constant,
        )
    except _OutOfBounds as exc:
        raise DecodeError(path, str(exc)) from None
    except Exception as exc:  # whatever the parser raises, the node is skipped
        raise DecodeError(path, f"not UTF-8 JSON ({exc.__class__.__name__})") from None


def utf8_json(value: Any) -> bytes:
    """``value`` as compact JSON in UTF-8, characters outside ASCII as they are (escaped, a
    character would cost up to three times its bytes: a value near the size limit read and
    written again would no longer fit), escaped only for a string UTF-8 cannot hold (a lone
    surrogate, which JSON text may carry). TypeError or ValueError for what is not JSON."""
    text = json.dumps(
        value, separators=(",", ":"), allow_nan=False, ensure_ascii=False, default=_plain
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":"), allow_nan=False, default=_plain).encode()


def _plain(value: object) -> dict[str, Any]:
    """Let ``json`` write the read-only mappings records hold."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def to_json(path: str, value: Any) -> str:
    """``value`` as compact JSON that :func:`parse_json` accepts, or ValidationError.

    Writers use the readers' bounds: what a reader would skip is never written.
    """
    return _round_trip(path, value)[0]


def _round_trip(path: str, value: Any) -> tuple[str, Any]:
    """``value`` as compact JSON and that JSON parsed back within the bounds, or
    ValidationError."""
    try:
        text = utf8_json(value).decode("utf-8")
    except Exception as exc:  # RecursionError, ValueError, TypeError...
        raise ValidationError(
            f"value for {path} is not JSON-serialisable ({exc.__class__.__name__})"
        ) from None
    try:
        return text, parse_json(path, text, max_bytes=None)
    except DecodeError as exc:
        raise ValidationError(f"value for {path} is out of bounds: {exc.reason}") from None


def encode(path: str, document: Mapping[str, Any]) -> bytes:
    """Encode ``document`` (with its ``"v"``) as compact JSON; refuse values over the limits."""
    data = to_json(path, {"v": SCHEMA_VERSION, **document}).encode("utf-8")
    if len(data) > MAX_VALUE_BYTES:
        raise ValueTooLarge(
            f"value for {path} is {len(data)} bytes encoded; at most {MAX_VALUE_BYTES} are allowed"
        )
    return data


def decode(path: str, data: bytes | None) -> dict[str, Any]:
    """Decode a JSON object written by :func:`encode`; raise DecodeError on anything else."""
    if not data:
        raise DecodeError(path, "empty value")
    document = parse_json(path, data)
    if not isinstance(document, dict):
        raise DecodeError(path, f"expected a JSON object, got {type(document).__name__}")
    version = document.pop("v", None)
    if version != SCHEMA_VERSION:
        raise DecodeError(path, f"schema version {version!r} is not {SCHEMA_VERSION}")
    return document


@contextmanager
def fields_of(path: str) -> Iterator[None]:
    """Turn a missing field, a wrong type, a failed check or any other failure while building a
    record from a decoded document into :class:`DecodeError` for ``path``: what another program
    wrote is data, not a crash."""
    try:
        yield
    except DecodeError:
        raise
    except KeyError as exc:
        raise DecodeError(path, f"missing field {exc.args[0]!r}") from None
    except Exception as exc:  # ValidationError, TypeError, OverflowError...
        raise DecodeError(path, str(exc) or exc.__class__.__name__) from None


def check_ephemeral(path: str, owner: int, why: str = "") -> None:
    """:class:`~sentinel.errors.PersistentInstance` unless the instance node at ``path`` is
    ephemeral (``owner``: its stat's ``ephemeralOwner``, 0 for a persistent node).
    Publishers register instances as ephemeral nodes, which live with their session and
    cannot have children; a persistent one was planted (before the namespace was secured,
    or where anyone may write) and may be pinned by a child nobody else may delete, so a
    secured namespace does not serve it. ``why`` is added to the reason."""
    if not owner:
        raise PersistentInstance(
            path,
            "a persistent instance node, not served in a secured namespace: instances are "
            f"ephemeral, so it was planted{why} ('sentinel doctor' names it)",
        )


def finite_number(what: str, value: object, minimum: float | None = None) -> float | int:
    """``value`` if it is an int or float (not bool) within float range and >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(f"{what} must be a number, got {type(value).__name__}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int past float range
        raise ValidationError(f"{what} is an integer too large for a float") from None
    if not finite or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise ValidationError(f"{what} {value!r} must be a finite number{bound}")
    return value


def _scheme(value: object) -> str:
    if not isinstance(value, str) or not _SCHEME.match(value):
        raise ValidationError(f"scheme {value!r} must look like 'http', 'postgresql' or 'grpc+tls'")
    return value


def _or_empty(value: object) -> object:
    """A stored mapping field: None (absent or null) reads as empty; anything else is left
    for :func:`_properties` to validate (``value or {}`` let ``[]``, ``0`` and ``""`` pass)."""
    return {} if value is None else value


def _properties(value: object) -> Mapping[str, Any]:
    """A read-only deep copy of JSON-able properties with string keys (empty ones shared:
    most instances have none, and a cache holds one record per instance)."""
    if value is None or (isinstance(value, Mapping) and not value):
        return NO_PROPERTIES
    if not isinstance(value, Mapping):
        raise ValidationError(f"properties must be a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str) or not 0 < len(key) <= MAX_PROPERTY_KEY_LENGTH:
            raise ValidationError(
                f"property key {key!r} must be a string of 1-{MAX_PROPERTY_KEY_LENGTH} characters"
            )
    # The bounded round trip copies deeply and refuses what a reader would refuse.
    return MappingProxyType(_round_trip("properties", dict(value))[1])


NO_PROPERTIES: Mapping[str, Any] = MappingProxyType({})


# A partition_from path: keys of an instance's properties, joined by dots.
_PROPERTY_PATH = re.compile(r"[^.\s]{1,128}(\.[^.\s]{1,128}){0,7}\Z")


@dataclass(frozen=True)
class CuratorSource:
    """Where the instances of a service kept in a Curator registry live, and how each one's
    partition is found: the ``curator`` field of a :class:`ServiceSpec`.

    The service's instances are the Curator nodes ``<base_path>/<service>/<id>``; everything
    else (spec, shard policy, metrics, credentials, ``/clients``) stays in the namespace.
    ``partition_from`` is a dotted path into an instance's
    :attr:`~sentinel.registry.endpoint.Endpoint.properties` (``payload.metadata.shard``: the
    ``shard`` entry of a Spring Cloud instance's metadata); an instance without a partition
    name there is skipped and counted. ``None`` puts every instance in one partition,
    ``curator``.

    ``static_instances``: in a secured namespace, serve this service's persistent instance
    nodes of Curator's ``STATIC`` and ``PERMANENT`` types too (Curator writes those
    persistent; a secured namespace serves only ephemeral instances unless the spec, which
    only the namespace's publishers and admin write, says so).
    """

    base_path: str
    partition_from: str | None = None
    static_instances: bool = False

    def __post_init__(self) -> None:
        validate_base_path(self.base_path, "curator base_path")
        if self.partition_from is not None and not (
            isinstance(self.partition_from, str) and _PROPERTY_PATH.match(self.partition_from)
        ):
            raise ValidationError(
                f"partition_from {self.partition_from!r} must be property keys joined by dots, "
                "such as 'payload.metadata.shard' (at most 8 keys)"
            )
        if not isinstance(self.static_instances, bool):
            raise ValidationError("static_instances must be true or false")

    def parent(self, service: str) -> str:
        """The server path of ``service``'s instances (outside any namespace)."""
        return f"{self.base_path.rstrip('/')}/{service}"

    def partition_of(self, properties: Mapping[str, Any]) -> str | None:
        """The partition named at ``partition_from`` in ``properties`` (None when there is no
        such path); :class:`~sentinel.errors.ValidationError` when it names none."""
        if self.partition_from is None:
            return None
        value: Any = properties
        for key in self.partition_from.split("."):
            if not isinstance(value, Mapping) or key not in value:
                raise ValidationError(f"has no partition at {self.partition_from}")
            value = value[key]
        return validate_name("partition", value)

    def to_document(self) -> dict[str, Any]:
        """The spec's ``curator`` field (``static_instances`` only when set: a spec without
        it is written as before)."""
        document: dict[str, Any] = {
            "base_path": self.base_path,
            "partition_from": self.partition_from,
        }
        if self.static_instances:
            document["static_instances"] = True
        return document

    @classmethod
    def from_document(cls, document: object) -> CuratorSource | None:
        """The spec's ``curator`` field decoded (None: the instances are the namespace's)."""
        if document is None:
            return None
        if not isinstance(document, Mapping):
            raise ValidationError(f"curator must be an object, got {type(document).__name__}")
        return cls(
            document["base_path"],
            document.get("partition_from"),
            document.get("static_instances", False),
        )


@dataclass(frozen=True)
class ServiceSpec:
    """The persistent spec of a service: ``/services/<service>``.

    ``shard_policy`` names the ``/shard_info`` policy the service is partitioned by; ``None``
    means the service is not sharded and every instance serves every key. ``curator``: the
    service's instances are a Curator registry's (:class:`CuratorSource`), not the node's
    children. ``mark_departures``: its publishers delete an instance with a departure mark
    (:func:`~sentinel.registry.layout.departure_path`), so that caches protecting from mass
    loss tell a deregistration from a session's expiry (:mod:`sentinel.cache.protection`);
    off, a deregistration is one plain delete and no cache protects the service.
    ``failover``: where its lookups go when the local region has no eligible instance
    (:class:`~sentinel.registry.failover.Failover`); None: the local region only.
    """

    service: str
    scheme: str = "http"
    shard_policy: str | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict, hash=False)
    curator: CuratorSource | None = None
    mark_departures: bool = False
    failover: Failover | None = None

    def __post_init__(self) -> None:
        validate_name("service", self.service)
        if self.failover is not None and not isinstance(self.failover, Failover):
            raise ValidationError("failover must be a Failover")
        _scheme(self.scheme)
        if self.shard_policy is not None:
            validate_name("shard policy", self.shard_policy)
        if self.curator is not None and not isinstance(self.curator, CuratorSource):
            raise ValidationError("curator must be a CuratorSource")
        if not isinstance(self.mark_departures, bool):
            raise ValidationError("mark_departures must be true or false")
        object.__setattr__(self, "defaults", _properties(self.defaults))

    def to_bytes(self, path: str) -> bytes:
        """The node's value (``curator``, ``mark_departures`` and ``failover`` only when set:
        a spec without them is written as before)."""
        document: dict[str, Any] = {
            "scheme": self.scheme,
            "shard_policy": self.shard_policy,
            "defaults": self.defaults,
        }
        if self.curator is not None:
            document["curator"] = self.curator.to_document()
        if self.mark_departures:
            document["mark_departures"] = True
        if self.failover is not None:
            document["failover"] = self.failover.to_document()
        return encode(path, document)

    @classmethod
    def from_bytes(cls, service: str, path: str, data: bytes | None) -> ServiceSpec:
        """Decode and validate a spec read from ``path``; raise DecodeError if it is not one."""
        document = decode(path, data)
        with fields_of(path):
            return cls(
                service=service,
                scheme=document["scheme"],
                shard_policy=document.get("shard_policy"),
                defaults=_or_empty(document.get("defaults")),
                curator=CuratorSource.from_document(document.get("curator")),
                mark_departures=document.get("mark_departures", False),
                failover=Failover.from_document(document.get("failover")),
            )


@dataclass(frozen=True)
class InstanceRecord:
    """One live instance of a service: the ephemeral node ``/services/<service>/<p>:<label>``."""

    service: str
    partition: str
    label: str
    host: str
    port: int
    scheme: str = "http"
    status: str = "up"
    weight: float = 1
    zone: str | None = None
    properties: Mapping[str, Any] = field(default_factory=dict, hash=False)
    registered_at: float = field(default_factory=time.time, compare=False)
    # What decides the status besides the session, when not only that: a readiness check's
    # source (``check:http``, ``check:tcp``, ``check:grpc``, ``check:call``, see
    # sentinel.health).
    health: str | None = None
    # That check's name (``GET /ready``) and its result when the status was last written
    # (``passing``, or why it failed): published with the status, never more often.
    check_name: str | None = None
    check_result: str | None = None

    def __post_init__(self) -> None:
        validate_name("service", self.service)
        validate_name("partition", self.partition)
        validate_name("label", self.label)
        validate_host(self.host)
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise ValidationError(f"port must be an integer, got {type(self.port).__name__}")
        if not 1 <= self.port <= 65535:
            raise ValidationError(f"port {self.port} is outside 1-65535")
        _scheme(self.scheme)
        if not isinstance(self.status, str) or self.status not in STATUSES:
            raise ValidationError(f"status {self.status!r} is not one of {sorted(STATUSES)}")
        finite_number("weight", self.weight, minimum=0)
        finite_number("registered_at", self.registered_at)
        if self.zone is not None:
            validate_name("zone", self.zone)
        object.__setattr__(self, "properties", _properties(self.properties))
        if self.health is not None:
            if not isinstance(self.health, str):
                raise ValidationError(f"health must be a string, not {type(self.health).__name__}")
            if (
                not 0 < len(self.health) <= MAX_HEALTH_SOURCE
                or not self.health.isascii()
                or not self.health.isprintable()
                or " " in self.health
            ):
                raise ValidationError(
                    f"health {self.health[:MAX_HEALTH_SOURCE]!r} is not a health source (e.g. "
                    f"'check:http': printable ASCII, no spaces, {MAX_HEALTH_SOURCE} characters "
                    "at most)"
                )
        for name in ("check_name", "check_result"):
            _check_text(name, getattr(self, name))
        # The values many instances repeat, one string each in a cache of any size.
        for name in ("partition", "scheme", "status", "zone"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, sys.intern(value))

    def to_bytes(self, path: str) -> bytes:
        """The node's value (``health`` only when there is one: the node of an instance
        without a check is what it was before checks existed)."""
        return encode(
            path,
            {
                "partition": self.partition,
                "label": self.label,
                "host": self.host,
                "port": self.port,
                "scheme": self.scheme,
                "status": self.status,
                "weight": self.weight,
                "zone": self.zone,
                "properties": self.properties,
                "registered_at": self.registered_at,
                **({"health": self.health} if self.health is not None else {}),
                **{
                    name: getattr(self, name)
                    for name in ("check_name", "check_result")
                    if getattr(self, name) is not None
                },
            },
        )

    @classmethod
    def from_bytes(cls, service: str, name: str, path: str, data: bytes | None) -> InstanceRecord:
        """Decode and validate the instance node ``name``; raise DecodeError if it is not one.

        The partition and label in the value must agree with the node name, so a value copied
        to another node is caught rather than served under the wrong identity.
        """
        document = decode(path, data)
        with fields_of(path):
            partition, label = parse_instance_name(name)
            if (document.get("partition"), document.get("label")) != (partition, label):
                raise DecodeError(path, "partition and label do not match the node name")
            registered_at = finite_number("registered_at", document.get("registered_at", 0.0))
            return cls(
                service=service,
                partition=partition,
                label=label,
                host=document["host"],
                port=document["port"],
                scheme=document["scheme"],
                status=document.get("status", "up"),
                weight=document.get("weight", 1),
                zone=document.get("zone"),
                # Absent or null is none; any other non-mapping ([] included) is refused.
                properties=_or_empty(document.get("properties")),
                registered_at=float(registered_at),
                health=document.get("health"),
                check_name=document.get("check_name"),
                check_result=document.get("check_result"),
            )


def _check_text(what: str, value: object) -> None:
    """A check's name or result: None, or printable text of MAX_CHECK_TEXT characters at most."""
    if value is None:
        return
    if not isinstance(value, str) or not value.isprintable() or len(value) > MAX_CHECK_TEXT:
        raise ValidationError(
            f"{what} must be printable text of {MAX_CHECK_TEXT} characters at most"
        )


MAX_METRICS = 256
MAX_METRIC_TEXT = 256
MetricValue = float | int | str


def _metric_values(values: object) -> Mapping[str, MetricValue]:
    """Validated metrics: names as node names, values finite numbers or short strings."""
    if not isinstance(values, Mapping):
        raise ValidationError(f"metrics must be a mapping, got {type(values).__name__}")
    if len(values) > MAX_METRICS:
        raise ValidationError(f"{len(values)} metrics given; at most {MAX_METRICS} are allowed")
    checked: dict[str, MetricValue] = {}
    for name, value in values.items():
        validate_name("metric", name)
        if isinstance(value, str):
            if len(value) > MAX_METRIC_TEXT:
                raise ValidationError(
                    f"metric {name!r} is a string of {len(value)} characters; "
                    f"at most {MAX_METRIC_TEXT} are allowed"
                )
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ValidationError(
                f"metric {name!r} must be a number or a string, got {type(value).__name__}"
            )
        else:
            finite_number(f"metric {name!r}", value)
        checked[name] = value
    return MappingProxyType(checked)


@dataclass(frozen=True)
class MetricsRecord:
    """An instance's run-time metrics: ``/metrics/<service>/<partition>:<label>``.

    ``measured_at`` is when the values were measured (Unix seconds), so that a policy can
    tell fresh values from stale ones.
    """

    service: str
    partition: str
    label: str
    values: Mapping[str, MetricValue]
    measured_at: float

    def __post_init__(self) -> None:
        validate_name("service", self.service)
        validate_name("partition", self.partition)
        validate_name("label", self.label)
        object.__setattr__(self, "values", _metric_values(self.values))
        finite_number("measured_at", self.measured_at)

    def to_bytes(self, path: str) -> bytes:
        """The node's value."""
        return encode(path, {"measured_at": self.measured_at, "metrics": self.values})

    @classmethod
    def from_bytes(cls, service: str, name: str, path: str, data: bytes | None) -> MetricsRecord:
        """Decode and validate the metrics node ``name``; raise DecodeError if it is not one."""
        document = decode(path, data)
        with fields_of(path):
            partition, label = parse_instance_name(name)
            return cls(
                service=service,
                partition=partition,
                label=label,
                values=document["metrics"],
                measured_at=document["measured_at"],
            )


MAX_CLIENT_TEXT = 256


def _check_optional_text(what: str, value: object) -> None:
    """None, or a string of at most :data:`MAX_CLIENT_TEXT` characters."""
    if value is not None and (not isinstance(value, str) or len(value) > MAX_CLIENT_TEXT):
        raise ValidationError(f"{what} must be a string of at most {MAX_CLIENT_TEXT} characters")


def _check_optional_count(
    what: str, value: object, minimum: int, maximum: int | None = None
) -> None:
    """None, or an integer (not bool) of at least ``minimum`` (and at most ``maximum``)."""
    if value is not None and (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        big = isinstance(value, int) and len(str(abs(value))) > 20
        shown = f"an integer of {len(str(abs(value)))} digits" if big else repr(value)
        raise ValidationError(f"{what} must be an integer {bound}, got {shown}")


# Fields of a client node written only when they hold something.
_ABSENT_UNLESS_SET = frozenset({"left", "protecting", "protecting_since"})
# No service has this many instances: a larger count is garbage, not a state.
MAX_PROTECTING = 1_000_000


@dataclass(frozen=True)
class ClientRecord:
    """A process that uses a service: the ephemeral node ``/clients/<service>/<client_id>``.

    The client writes it on its first lookup of the service and again each time it applies a
    new credential. Rotations read ``auth_client`` and ``auth_version`` (Procedure 2 waits for
    every node of the client to confirm), ``sentinel deps`` reads ``app``. The node name is the
    identity; every other field may be absent (None) in what older clients or other programs
    wrote, and a present field that fails its check makes the node undecodable.
    """

    service: str
    client_id: str
    app: str | None = None
    host: str | None = None
    pid: int | None = None
    started: float | None = None
    sentinel_version: str | None = None
    auth_client: str | None = None
    auth_version: int | None = None
    #: When the process left (a host agent marks the entry of a process that disconnected,
    #: when it may not delete it): such an entry is no live process's and counts for nobody.
    left: float | None = None
    #: Instances of the service this client serves although the registry no longer lists
    #: them (protection from mass loss, ``docs/health.md``), and since when; None while it
    #: serves none. What ``sentinel ls`` and ``sentinel doctor`` show of it.
    protecting: int | None = None
    protecting_since: float | None = None

    def __post_init__(self) -> None:
        validate_name("service", self.service)
        validate_name("client", self.client_id)
        for what, name in (("app", self.app), ("auth client", self.auth_client)):
            if name is not None:
                validate_name(what, name)
        _check_optional_text("host", self.host)
        _check_optional_text("sentinel_version", self.sentinel_version)
        _check_optional_count("pid", self.pid, minimum=1)
        _check_optional_count("auth_version", self.auth_version, 0, MAX_AUTH_VERSION)
        _check_optional_count("protecting", self.protecting, 1, MAX_PROTECTING)
        for what, when in (
            ("started", self.started),
            ("left", self.left),
            ("protecting_since", self.protecting_since),
        ):
            if when is not None:
                finite_number(what, when)

    @property
    def confirms_for(self) -> str:
        """The auth client this node speaks for in a rotation: ``auth_client``, else the
        node's own name (nodes of older clients name none)."""
        return self.auth_client or self.client_id

    def to_bytes(self, path: str) -> bytes:
        """The node's value."""
        return encode(
            path,
            {
                f.name: getattr(self, f.name)
                for f in fields(self)
                # `left` only in a marked entry, `protecting*` only while protecting: an
                # entry reads as it always did otherwise
                if f.name != "service"
                and (f.name not in _ABSENT_UNLESS_SET or getattr(self, f.name) is not None)
            },
        )

    @classmethod
    def from_bytes(cls, service: str, name: str, path: str, data: bytes | None) -> ClientRecord:
        """Decode and validate the client node ``name``; raise DecodeError if it is not one.

        The node name is the client id: a ``client_id`` in the value is not trusted over it.
        """
        document = decode(path, data)
        with fields_of(path):
            described = {
                f.name: document.get(f.name)
                for f in fields(cls)
                if f.name not in ("service", "client_id")
            }
            return cls(service=service, client_id=name, **described)
