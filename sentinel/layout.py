"""Where things live in ZooKeeper: the five sections, node names and their validation.

Every path here is relative to the namespace root, which the client applies as a kazoo chroot,
so ``/services/billing`` is ``/sentinel/services/billing`` on the server. ``docs/znodes.md``
describes the same layout for people; the two change together, with a schema version bump.
"""

from __future__ import annotations

import re

from sentinel.errors import InvalidName

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


def validate_namespace(namespace: object) -> str:
    """Return the namespace root (``/sentinel`` style) or raise :class:`InvalidName`."""
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
        raise InvalidName(
            f"namespace {namespace!r} must be an absolute path such as '/sentinel', made of "
            "valid names and without a trailing '/'"
        )
    return namespace


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
