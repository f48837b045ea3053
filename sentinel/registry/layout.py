"""Where things live in ZooKeeper: the five sections, node names and their validation.

Every path here is relative to the namespace root, which the client applies as a kazoo chroot,
so ``/services/billing`` is ``/sentinel/services/billing`` on the server. ``docs/znodes.md``
describes the same layout for people; the two change together, with a schema version bump.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re

from sentinel.errors import InvalidName, ValidationError

# The namespace root a client uses when given none: several environments share an ensemble
# under roots of their own.
DEFAULT_NAMESPACE = "/sentinel"

SERVICES = "/services"
AUTH = "/auth"
SHARD_INFO = "/shard_info"
METRICS = "/metrics"
CLIENTS = "/clients"
SECTIONS = (SERVICES, AUTH, SHARD_INFO, METRICS, CLIENTS)
# Clients' public keys; '.keys' can never be a service name, so it cannot collide with one.
AUTH_KEYS = f"{AUTH}/.keys"

# The services the daemons announce themselves as (their cluster views, docs/topology.md): one
# per collector cluster and one per shard policy's manager. ``sentinel init --secure`` lets each
# daemon role write its own such services and no others (docs/auth.md).
COLLECTOR_SERVICE_PREFIX = "metric-collector-"
SHARD_MANAGER_SERVICE_PREFIX = "shard-manager-"
DEFAULT_COLLECTOR_CLUSTER = "default"

NAME_MAX_LENGTH = 128
# ':' separates partition and label in an instance node name, so it is not allowed in names.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*\Z")
_NAMESPACE = re.compile(r"(/[A-Za-z0-9_][A-Za-z0-9._-]*)+\Z")
INSTANCE_SEPARATOR = ":"


def validate_name(kind: str, value: object) -> str:
    """Return ``value`` if it is a valid node name, else raise :class:`InvalidName`.

    Names are 1-128 characters of ASCII letters, digits, ``.``, ``_`` and ``-``, and do not
    start with ``.`` or ``-``: safe as a znode name, a file name and a Prometheus label.
    """
    if not isinstance(value, str):
        raise InvalidName(f"{kind} name must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidName(f"{kind} name must not be empty")
    if len(value) > NAME_MAX_LENGTH:
        raise InvalidName(
            f"{kind} name is {len(value)} characters long; at most {NAME_MAX_LENGTH} are allowed"
        )
    if not _NAME.match(value):
        raise InvalidName(
            f"{kind} name {value!r} may only hold ASCII letters, digits, '.', '_' and '-', "
            "and must not start with '.' or '-'"
        )
    return value


def sanitize_name(raw: str) -> str:
    """Turn free text (a hostname, ``host:port``) into a valid name by replacing what is not."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", raw)[:NAME_MAX_LENGTH]
    return name if _NAME.match(name) else f"_{name[: NAME_MAX_LENGTH - 1]}"


MAX_HOST_LENGTH = 253
# RFC 1123: a label is 1-63 ASCII letters, digits and hyphens, not starting or ending with '-'.
_DNS_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\Z")
_DIGITS = re.compile(r"[0-9]+\Z")
# An IPv6 zone index (``fe80::1%eth0``): an interface name or number, nothing a label can't hold.
_ZONE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,15}\Z")


def _ip_literal(text: str) -> bool:
    """Whether ``text`` is an IPv4 address or an IPv6 address (with an optional zone index)."""
    address, percent, zone = text.partition("%")
    if percent and (":" not in address or not _ZONE.match(zone)):
        return False
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def validate_host(host: object) -> str:
    """Return ``host`` if it is an IP address or a DNS name, else raise :class:`ValidationError`.

    Accepted: an IPv4 address; an IPv6 address, bare or in brackets, with an optional zone
    index of letters, digits, '.' and '-' (``fe80::1%eth0``); a DNS name by RFC 1123: labels
    of 1-63 ASCII letters, digits and hyphens, not starting or ending with a hyphen, joined by
    single dots, at most 253 characters, and not all digits (``999.1.1.1`` is no address and
    no name). A trailing dot, ``..``, ``_``, spaces and anything else are refused.
    """
    if not isinstance(host, str):
        raise ValidationError(f"host must be a string, got {type(host).__name__}")
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if text is not host or ":" in text or "%" in text:
        valid = ":" in text and _ip_literal(text)
    else:
        labels = text.split(".")
        if all(_DIGITS.match(label) for label in labels):
            valid = _ip_literal(text)
        else:
            valid = all(_DNS_LABEL.match(label) for label in labels) and not _DIGITS.match(
                labels[-1]
            )
    if not valid or not 0 < len(host) <= MAX_HOST_LENGTH:
        raise ValidationError(
            f"host {host!r} must be an IPv4 or IPv6 address or a DNS name (RFC 1123: labels of "
            f"1-63 letters, digits and '-', joined by '.', at most {MAX_HOST_LENGTH} characters)"
        )
    return host


def host_key(host: str) -> str:
    """The canonical form of a valid host, for telling instances apart: an IP address in its
    compressed form (no brackets, zone index kept), a DNS name in lower case."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(text).compressed
    except ValueError:
        return text.lower()


def default_label(host: str, port: int) -> str:
    """The label an instance gets when none is given: a different one for every endpoint.

    - a DNS name or an IPv4 address: ``<host>_<port>`` (``db-1.example.com_5432``): a host
      holds no ``_``, so the label splits back at its last ``_``;
    - an IPv6 address: ``_6_<address, ':' as '-'>[_<zone>]_<port>`` (``_6_--1_8080`` for
      ``::1``): '-' is not in an address and '_' not in its parts, so it reads back too;
    - a label that would pass 128 characters (a host name over about 120):
      ``_h_<start of the host>_<port>_<20 hex of SHA-256 of the host and port>``.

    Each form starts differently (a letter or digit, ``_6_``, ``_h_``), so no two collide; the
    host is taken in its :func:`host_key` form, so one endpoint spelt two ways (``::1`` and
    ``0::1``, ``DB`` and ``db``) is one label.
    """
    key = host_key(validate_host(host))
    if isinstance(port, bool) or not isinstance(port, int):
        raise ValidationError(f"port must be an integer, got {type(port).__name__}")
    if ":" in key:
        address, _, zone = key.partition("%")
        label = f"_6_{address.replace(':', '-')}{f'_{zone}' if zone else ''}_{port}"
    else:
        label = f"{key}_{port}"
    if len(label) > NAME_MAX_LENGTH:
        digest = hashlib.sha256(f"{key}_{port}".encode()).hexdigest()[:20]
        start = key[: NAME_MAX_LENGTH - len(f"_h___{port}") - len(digest)].rstrip(".-")
        label = f"_h_{start}_{port}_{digest}"
    return validate_name("label", label)


def validate_namespace(namespace: object) -> str:
    """Return the namespace root (``/sentinel`` style) or raise :class:`InvalidName`."""
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
        raise InvalidName(
            f"namespace {namespace!r} must be an absolute path such as '/sentinel', made of "
            "valid names and without a trailing '/'"
        )
    return namespace


def validate_base_path(path: object, what: str) -> str:
    """``path`` if it is an absolute ZooKeeper path of valid names (``/services``), else
    :class:`~sentinel.errors.ValidationError` naming ``what``: a Curator base path."""
    try:
        return validate_namespace(path)
    except ValidationError:
        raise ValidationError(
            f"{what} {path!r} is not an absolute ZooKeeper path of valid names such as '/services'"
        ) from None


def service_path(service: str) -> str:
    """The persistent node holding a service's spec."""
    return f"{SERVICES}/{service}"


def instance_name(partition: str, label: str) -> str:
    """The node name of one instance, shared by ``/services`` and ``/metrics``."""
    return f"{partition}{INSTANCE_SEPARATOR}{label}"


def parse_instance_name(name: str) -> tuple[str, str]:
    """Split an instance node name into ``(partition, label)``; raise InvalidName if malformed."""
    partition, sep, label = name.partition(INSTANCE_SEPARATOR)
    if not sep:
        raise InvalidName(f"instance node name {name!r} has no '{INSTANCE_SEPARATOR}'")
    return validate_name("partition", partition), validate_name("label", label)


def instance_path(service: str, partition: str, label: str) -> str:
    """The ephemeral node of one live instance."""
    return f"{SERVICES}/{service}/{instance_name(partition, label)}"


# The departure mark's suffix: a label holds no ':', so no instance node is ever named so.
_DEPARTURE = f"{INSTANCE_SEPARATOR}left"


def departure_path(path: str) -> str:
    """The departure mark of the instance node at ``path``: created and deleted in the
    transaction that deletes the node, so a cache watching the service hears that the owner
    removed it (a session expiry deletes it unmarked); no listing ever shows it
    (docs/decisions/deregistration-marks-its-delete.md)."""
    return f"{path}{_DEPARTURE}"


def departed_instance(path: str) -> str | None:
    """The instance node whose departure mark ``path`` is, or None if it is none."""
    if not path.endswith(_DEPARTURE) or not path.startswith(f"{SERVICES}/"):
        return None
    return path[: -len(_DEPARTURE)]


def metrics_path(service: str, partition: str, label: str) -> str:
    """The persistent node of one instance's metrics."""
    return f"{METRICS}/{service}/{instance_name(partition, label)}"


def auth_path(service: str, client: str) -> str:
    """The persistent node holding a client's encrypted credentials for a service."""
    return f"{AUTH}/{service}/{client}"


def auth_keys_path(client: str) -> str:
    """The persistent node holding a client's public keys."""
    return f"{AUTH_KEYS}/{client}"


def client_path(service: str, client: str) -> str:
    """The ephemeral node of a client using a service (with the auth version it applied)."""
    return f"{CLIENTS}/{service}/{client}"
