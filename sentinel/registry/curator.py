"""Apache Curator's x-discovery format: the registries of JVM shops, read as Sentinel endpoints.

Curator's ``ServiceDiscovery``, Spring Cloud Zookeeper and Apache Dubbo 3's application-level
discovery keep one node per instance at ``<basePath>/<service>/<instance id>``, holding
Curator's ``ServiceInstance`` as JSON::

    {"name": "orders", "id": "b2f...", "address": "10.0.0.1", "port": 8080, "sslPort": null,
     "payload": {"@class": "...", ...}, "registrationTimeUTC": 1795576186745,
     "serviceType": "DYNAMIC", "uriSpec": {"parts": [{"value": "scheme", "variable": true}, ...]},
     "enabled": true}

:class:`CuratorInstance` decodes one such node, as untrusted as any other (a node that is not
one is a :class:`~sentinel.errors.DecodeError` for its path, never a crash), and makes the
:class:`~sentinel.registry.endpoint.Endpoint` a lookup returns. The mapping, in the words of
``docs/interop.md``:

* ``address`` is the host; with an ``sslPort`` the endpoint is ``https`` on it, else ``http``
  on ``port`` (Curator's own rule for its ``{scheme}`` field);
* ``uriSpec`` is rendered as Curator's ``UriSpec.build(instance)`` renders it, into ``uri``;
* ``payload`` (without Jackson's ``@class``) is ``properties["payload"]``; ``id``, ``port``,
  ``sslPort``, ``serviceType``, ``registrationTimeUTC``, the payload's class and any field this
  version does not know are ``properties["curator"]``;
* ``enabled: false`` is status ``down``: Curator's ``ServiceProvider`` leaves such instances
  out (``EnabledInstanceFilter``), and so does every Sentinel lookup; so is a Spring Cloud
  payload whose ``metadata.instance_status`` is not ``UP`` (Spring's load balancer's rule);
* the id is the label (made a valid name: Dubbo's ``host:port`` ids become ``host_port``);
  the partition is the one a namespace spec's :class:`~sentinel.registry.records.CuratorSource`
  finds in the properties, else :data:`CURATOR_PARTITION` for every instance.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

if TYPE_CHECKING:
    from sentinel.zk.watches import PersistentWatches

from sentinel.errors import DecodeError, ValidationError
from sentinel.registry.endpoint import Endpoint, format_uri
from sentinel.registry.layout import sanitize_name, validate_host
from sentinel.registry.records import (
    MAX_VALUE_BYTES,
    CuratorSource,
    InstanceRecord,
    ServiceSpec,
    check_ephemeral,
    fields_of,
    parse_json,
    utf8_json,
)

# The one partition of a service read from a Curator registry: Curator has no partitions.
CURATOR_PARTITION = "curator"
# ServiceType's names; Jackson refuses any other, and so does this decoder.
SERVICE_TYPES = frozenset({"DYNAMIC", "DYNAMIC_SEQUENTIAL", "STATIC", "PERMANENT"})
# The types Curator registers as persistent nodes (ServiceDiscoveryImpl: the others are
# ephemeral, DYNAMIC_SEQUENTIAL ephemeral and sequential).
PERSISTENT_TYPES = frozenset({"STATIC", "PERMANENT"})
_KNOWN_FIELDS = frozenset(
    {
        "name",
        "id",
        "address",
        "port",
        "sslPort",
        "payload",
        "registrationTimeUTC",
        "serviceType",
        "uriSpec",
        "enabled",
    }
)
# The variables of UriSpec.build(instance) that are not the instance's own fields.
_BRACES = {"[": "{", "]": "}"}


@dataclass(frozen=True, slots=True)
class UriPart:
    """One token of a Curator ``uriSpec``: literal text, or the name of a variable."""

    value: str
    variable: bool


@dataclass(frozen=True)
class CuratorInstance:
    """One decoded Curator ``ServiceInstance`` (see the module's mapping)."""

    name: str
    id: str
    address: str
    port: int | None
    ssl_port: int | None
    payload: Any = None
    registration_time_utc: int | None = None
    service_type: str = "DYNAMIC"
    uri_spec: tuple[UriPart, ...] | None = None
    enabled: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Refuse what Curator could not read (ValidationError), whether decoded or built."""
        _text("name", self.name)
        _text("id", self.id)
        validate_host(self.address)
        _port("port", self.port)
        _port("sslPort", self.ssl_port)
        if self.port is None and self.ssl_port is None:
            raise ValidationError(
                "neither port nor sslPort is set (an instance needs a port, an ssl port or both)"
            )
        _timestamp(self.registration_time_utc)
        _service_type(self.service_type)
        _flag("enabled", self.enabled)

    @classmethod
    def from_bytes(cls, path: str, data: bytes | None) -> CuratorInstance:
        """Decode the node at ``path``; :class:`~sentinel.errors.DecodeError` if it is not a
        ``ServiceInstance`` Curator could read, or if its id is not the node's name (a value
        copied to another node would otherwise be served under another identity)."""
        if not data:
            raise DecodeError(path, "empty value")
        document = parse_json(path, data)
        if not isinstance(document, dict):
            raise DecodeError(path, f"expected a JSON object, got {type(document).__name__}")
        with fields_of(path):
            instance = cls(
                name=document["name"],
                id=document["id"],
                address=document["address"],
                port=document.get("port"),
                ssl_port=document.get("sslPort"),
                payload=document.get("payload"),
                registration_time_utc=document.get("registrationTimeUTC"),
                service_type=document.get("serviceType", "DYNAMIC"),
                uri_spec=_uri_spec(document.get("uriSpec")),
                enabled=document.get("enabled", True),
                extra={k: v for k, v in document.items() if k not in _KNOWN_FIELDS},
            )
        node = path.rsplit("/", 1)[-1]
        if instance.id != node:
            raise DecodeError(path, f"id {instance.id!r} is not the node's name {node!r}")
        return instance

    @property
    def scheme(self) -> str:
        """``https`` when the instance has an ``sslPort``, as Curator's ``{scheme}`` says."""
        return "https" if self.ssl_port is not None else "http"

    def render_uri(self) -> str | None:
        """The ``uriSpec`` rendered as Curator's ``UriSpec.build(instance)`` renders it (a
        variable it does not know is left out), or None without one."""
        if self.uri_spec is None:
            return None
        variables = {
            **_BRACES,
            "scheme": self.scheme,
            "name": self.name,
            "id": self.id,
            "address": self.address,
            "port": _java_text(self.port),
            "ssl-port": _java_text(self.ssl_port),
            "registration-time-utc": _java_text(self.registration_time_utc),
            "service-type": self.service_type.lower(),
        }
        return "".join(
            variables.get(part.value, "") if part.variable else part.value for part in self.uri_spec
        )

    def endpoint(self, spec: ServiceSpec, joined: int = 0) -> Endpoint:
        """The endpoint a lookup of ``spec``'s service returns for this instance.

        The scheme and port are Curator's (``https`` on an ``sslPort``, else ``http``) unless
        the spec names another scheme (a database's ``postgresql``), which is served on
        ``port`` (else the ``sslPort``). The partition is the one ``spec.curator`` finds in
        the properties (:meth:`~sentinel.registry.records.CuratorSource.partition_of`), else
        :data:`CURATOR_PARTITION`.
        """
        scheme, ports = self.scheme, (self.ssl_port, self.port)
        if spec.scheme != "http":  # the spec's own scheme, as for a native instance
            scheme, ports = spec.scheme, (self.port, self.ssl_port)
        port = ports[0] if ports[0] is not None else ports[1]
        assert port is not None  # from_bytes refuses an instance with neither
        payload = self.payload
        payload_class = None
        if isinstance(payload, dict) and isinstance(payload.get("@class"), str):
            payload = {k: v for k, v in payload.items() if k != "@class"}
            payload_class = self.payload["@class"]
        curator = {
            "id": self.id,
            "port": self.port,
            "sslPort": self.ssl_port,
            "serviceType": self.service_type,
            "registrationTimeUTC": self.registration_time_utc,
            "payloadClass": payload_class,
            **self.extra,
        }
        properties = {"payload": payload, "curator": curator}
        partition = None if spec.curator is None else spec.curator.partition_of(properties)
        record = InstanceRecord(
            spec.service,
            partition or CURATOR_PARTITION,
            sanitize_name(self.id),
            self.address,
            port,
            scheme=scheme,
            status="up" if self.enabled and _spring_status_up(payload) else "down",
            properties=properties,
            registered_at=(self.registration_time_utc or 0) / 1000,
        )
        endpoint = Endpoint.from_record(record, joined=joined)
        uri = self.render_uri()
        if uri is None or uri == format_uri(record.scheme, record.host, record.port):
            return endpoint
        return replace(endpoint, uri=uri)


def _spring_status_up(payload: object) -> bool:
    """Spring Cloud Zookeeper's own status, in its payload's ``metadata``: an instance whose
    ``instance_status`` is set and not ``UP`` (``OUT_OF_SERVICE``, set through Spring's
    service-registry endpoint) is left out by Spring's load balancer
    (``ZookeeperServiceInstanceListSupplier``), and by every Sentinel lookup. Dubbo's payload
    is the same shape."""
    metadata = payload.get("metadata") if isinstance(payload, dict) else None
    status = metadata.get("instance_status") if isinstance(metadata, dict) else None
    return not isinstance(status, str) or not status.strip() or status.upper() == "UP"


def _text(what: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValidationError(f"{what} must be a non-empty string")


def _port(what: str, value: object) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535
    ):
        raise ValidationError(f"{what} must be a port number (1-65535) or null, got {value!r}")


def _timestamp(value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValidationError("registrationTimeUTC must be milliseconds since 1970")


def _service_type(value: object) -> None:
    if not isinstance(value, str) or value not in SERVICE_TYPES:
        raise ValidationError(f"serviceType {value!r} is not one of {sorted(SERVICE_TYPES)}")


def _flag(what: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValidationError(f"{what} must be true or false")


def _uri_spec(value: object) -> tuple[UriPart, ...] | None:
    if value is None:
        return None
    parts = value.get("parts") if isinstance(value, dict) else None
    if not isinstance(parts, Sequence) or isinstance(parts, str):
        raise ValidationError("uriSpec must be an object with a list of parts")
    decoded = []
    for part in parts:
        if not isinstance(part, dict) or not isinstance(part.get("value"), str):
            raise ValidationError("each part of uriSpec needs a string value")
        variable = part.get("variable", False)
        _flag("variable", variable)
        decoded.append(UriPart(part["value"], variable))
    return tuple(decoded)


def _java_text(value: int | None) -> str:
    """What Java's ``StringBuilder.append`` writes of a boxed number, "" for null (UriSpec's
    ``nullCheck``)."""
    return "" if value is None else str(value)


def decode_endpoint(
    spec: ServiceSpec, path: str, data: bytes | None, joined: int, owner: int | None = None
) -> Endpoint:
    """The endpoint of the Curator node at ``path`` (:meth:`CuratorInstance.endpoint`), or
    :class:`~sentinel.errors.DecodeError` naming the node: not an instance, or no partition
    where ``spec.curator`` says to find one.

    ``owner`` (a secured namespace's reader: the node's ``ephemeralOwner``, 0 when it is
    persistent; None: not checked) refuses a persistent node with
    :class:`~sentinel.errors.PersistentInstance`, unless the spec opts in
    (``CuratorSource(static_instances=True)``) and the instance is of a type Curator writes
    persistent (``STATIC``, ``PERMANENT``): a ``DYNAMIC`` one is always ephemeral.
    """
    if owner is not None and not _opted_in(spec):
        check_ephemeral(path, owner, " (a STATIC one is served where its spec opts in)")
    instance = CuratorInstance.from_bytes(path, data)
    if owner is not None and instance.service_type not in PERSISTENT_TYPES:
        check_ephemeral(path, owner, f" (Curator writes a {instance.service_type} one ephemeral)")
    with fields_of(path):
        return instance.endpoint(spec, joined)


def _opted_in(spec: ServiceSpec) -> bool:
    return spec.curator is not None and spec.curator.static_instances


def read_instances(
    zk: KazooClient, base_path: str, service: str
) -> tuple[tuple[Endpoint, ...], tuple[DecodeError, ...]]:
    """Read ``service``'s instances under the Curator ``base_path`` straight from ZooKeeper
    (``zk`` is a client without a chroot, or rooted where the base path is given from): the
    endpoints, by label, and the nodes skipped as undecodable. No watch is set."""
    return read_registry(zk, ServiceSpec(service, curator=CuratorSource(base_path)))


def read_registry(
    zk: KazooClient, spec: ServiceSpec
) -> tuple[tuple[Endpoint, ...], tuple[DecodeError, ...]]:
    """:func:`read_instances` of a service whose spec names a Curator registry: its instances
    as the spec decodes them (partitions from ``partition_from``, the spec's scheme)."""
    found = survey_registry(zk, spec)
    return found.endpoints, found.skipped


class RegistrySurvey(NamedTuple):
    """Everything one direct read of a Curator service found: its endpoints, by label; the
    nodes skipped as undecodable; the decodable ones whose node is persistent (Curator
    writes only ``STATIC`` and ``PERMANENT`` instances so; a secured namespace serves them
    only where a spec opts in)."""

    endpoints: tuple[Endpoint, ...]
    skipped: tuple[DecodeError, ...]
    persistent_nodes: tuple[str, ...]


def survey_registry(zk: KazooClient, spec: ServiceSpec) -> RegistrySurvey:
    """:func:`read_registry`, and which decodable instance nodes are persistent (what
    ``sentinel doctor --curator-path`` names). Every node is read: an operator's tool."""
    assert spec.curator is not None
    parent = spec.curator.parent(spec.service)
    endpoints, skipped, persistent = [], [], []
    try:
        children = zk.get_children(parent)
    except NoNodeError:
        return RegistrySurvey((), (), ())
    for child in sorted(children):
        path = f"{parent}/{child}"
        try:
            data, stat = zk.get(path)
        except NoNodeError:
            continue  # gone between the listing and the read
        try:
            endpoints.append(decode_endpoint(spec, path, data, stat.czxid))
        except DecodeError as exc:
            skipped.append(exc)
            continue
        if not stat.ephemeralOwner:
            persistent.append(path)
    ordered = tuple(sorted(endpoints, key=lambda e: (e.partition, e.label)))
    return RegistrySurvey(ordered, tuple(skipped), tuple(persistent))


def holds_instance(
    watches: PersistentWatches, spec: ServiceSpec, partition: str, label: str
) -> bool:
    """Whether the Curator registry ``spec`` names holds a readable instance of its service
    served as ``partition`` and ``label`` (two requests, from the server's root)."""
    assert spec.curator is not None
    parent = spec.curator.parent(spec.service)
    listed = watches.get_many(children=[parent], absolute=True).children[parent]
    if isinstance(listed, NoNodeError):
        return False
    if isinstance(listed, Exception):
        raise listed
    paths = [f"{parent}/{child}" for child in listed if sanitize_name(child) == label]
    for path, found in watches.get_many(data=paths, absolute=True).data.items():
        if isinstance(found, NoNodeError):
            continue
        if isinstance(found, Exception):
            raise found
        data, stat = found
        try:
            if decode_endpoint(spec, path, data, stat.czxid).partition == partition:
                return True
        except DecodeError:
            continue  # unreadable: no lookup serves it either
    return False


# Jackson's class of a payload mapping that names none (encode_instance): any ServiceDiscovery
# typed on Map or Object reads it.
MAP_PAYLOAD_CLASS = "java.util.LinkedHashMap"
# How many instances a publisher reads to learn the payload class a base path's readers expect.
_PAYLOAD_SAMPLE = 8


def payload_class(payload: object) -> str | None:
    """The Java class Jackson builds a payload as: a mapping's ``@class`` (a mapping without one
    is written as :data:`MAP_PAYLOAD_CLASS`); None for no payload, or one that is no object."""
    if not isinstance(payload, Mapping):
        return None
    named = payload.get("@class")
    return named if isinstance(named, str) else MAP_PAYLOAD_CLASS


def payload_classes(zk: KazooClient, base_path: str, service: str) -> frozenset[str]:
    """The payload classes the instances under ``base_path`` carry, read from a few of them:
    ``service``'s own first, else one of each of a few other services (a JVM reader is typed
    to one class for its whole base path). Undecodable nodes are passed over; a few listings
    and at most 2 x ``_PAYLOAD_SAMPLE`` reads whatever the base path holds."""
    base = base_path.rstrip("/")
    try:
        services = zk.get_children(base)
    except NoNodeError:
        return frozenset()
    others = sorted(s for s in services if s != service)[:_PAYLOAD_SAMPLE]
    found: set[str] = set()
    for name in ([service] if service in services else []) + others:
        parent = f"{base}/{name}"
        try:
            children = zk.get_children(parent)[: _PAYLOAD_SAMPLE if name == service else 1]
        except NoNodeError:
            continue
        reads = [(f"{parent}/{c}", zk.get_async(f"{parent}/{c}")) for c in children]
        for path, result in reads:
            try:
                instance = CuratorInstance.from_bytes(path, result.get()[0])
            except (NoNodeError, DecodeError):
                continue
            named = payload_class(instance.payload)
            if named is not None:
                found.add(named)
        if found and name == service:
            break  # the service's own instances say it
    return frozenset(found)


def parse_uri_spec(raw: str) -> tuple[UriPart, ...]:
    """A ``uriSpec`` string (``"{scheme}://{address}:{port}/api"``) as Curator's ``UriSpec``
    constructor splits it: ``{name}`` a variable (its name trimmed), the rest literal text;
    :class:`~sentinel.errors.ValidationError` where Curator's constructor throws."""
    if not isinstance(raw, str):
        raise ValidationError(f"uri_spec must be a string, got {type(raw).__name__}")
    parts: list[UriPart] = []
    inside = False
    for token in re.split(r"([{}])", raw):
        if token == "{":
            if inside:
                raise ValidationError("uri_spec: '{' is not allowed inside a variable")
            inside = True
        elif token == "}":
            if not inside:
                raise ValidationError("uri_spec: '}' must follow a '{'")
            inside = False
        elif token:
            parts.append(UriPart(token.strip() if inside else token, inside))
    if inside:
        raise ValidationError("uri_spec: the last variable is not closed with '}'")
    return tuple(parts)


def encode_instance(instance: CuratorInstance) -> bytes:
    """The node's value as Curator 5's ``JsonInstanceSerializer`` writes it (with upstream's
    ``enabled``; Curator ignores fields it does not know). A payload object without Jackson's
    ``@class`` is written as a ``java.util.LinkedHashMap``, which any ``ServiceDiscovery``
    typed on ``Map`` or ``Object`` reads."""
    payload = instance.payload
    if isinstance(payload, Mapping) and "@class" not in payload:
        payload = {"@class": MAP_PAYLOAD_CLASS, **payload}
    document = {
        "name": instance.name,
        "id": instance.id,
        "address": instance.address,
        "port": instance.port,
        "sslPort": instance.ssl_port,
        "payload": payload,
        "registrationTimeUTC": instance.registration_time_utc,
        "serviceType": instance.service_type,
        "uriSpec": None
        if instance.uri_spec is None
        else {"parts": [{"value": p.value, "variable": p.variable} for p in instance.uri_spec]},
        "enabled": instance.enabled,
    }
    try:
        data = utf8_json(document)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"the payload is not JSON: {exc}") from None
    if len(data) > MAX_VALUE_BYTES:
        raise ValidationError(f"the instance is {len(data)} bytes, over {MAX_VALUE_BYTES}")
    return data
