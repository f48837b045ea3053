"""``sentinel drain`` and ``sentinel undrain``: take one live instance out of rotation and back.

The instance keeps its registration (its process, its node, its metrics); only its status
changes, to ``draining`` and back to ``up``, and clients stop or start choosing it as soon as
their cache sees the change. The process that registered the instance keeps the status it finds
(:meth:`sentinel.zk.ephemeral.EphemeralNodes.follow`): its later updates and the re-creation of its
node after a session expiry do not undo an operator's drain.
"""

from __future__ import annotations

import argparse
import dataclasses

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from sentinel.cli.common import (
    connect,
    print_json,
)
from sentinel.cli.options import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    fail,
)
from sentinel.errors import RegistryConflict, ValidationError
from sentinel.registry.layout import (
    INSTANCE_SEPARATOR,
    instance_name,
    instance_path,
    parse_instance_name,
    service_path,
    validate_name,
)
from sentinel.registry.records import InstanceRecord

_ATTEMPTS = 5


def _find(zk: KazooClient, service: str, instance: str) -> tuple[str, str] | str:
    """``(partition, label)`` of ``instance`` (``PARTITION:LABEL``, or a label that one
    partition holds), or the reason it names no live instance."""
    if INSTANCE_SEPARATOR in instance:
        return parse_instance_name(instance)
    label = validate_name("label", instance)
    try:
        names = zk.get_children(service_path(service))
    except NoNodeError:
        return f"service {service!r} is not registered"
    matches = sorted(n for n in names if n.endswith(f"{INSTANCE_SEPARATOR}{label}"))
    if len(matches) > 1:
        raise ValidationError(
            f"label {label!r} is in several partitions of {service!r} ({', '.join(matches)}): "
            "give PARTITION:LABEL"
        )
    if not matches:
        return f"service {service!r} has no live instance labelled {label!r}"
    return parse_instance_name(matches[0])


def set_status(zk: KazooClient, service: str, instance: str, status: str) -> tuple[str, str] | str:
    """Set the status of ``service``'s live ``instance`` (``PARTITION:LABEL`` or a label) to
    ``status``: ``(instance name, status before)``, or why it names no live instance. The
    write is conditional on the node's version, read again when its owner wrote meanwhile
    (RegistryConflict after a few attempts). ``sentinel drain`` and the dashboard's."""
    service = validate_name("service", service)
    found = _find(zk, service, instance)
    if isinstance(found, str):
        return found
    partition, label = found
    name, path = instance_name(partition, label), instance_path(service, partition, label)
    for _ in range(_ATTEMPTS):
        try:
            data, stat = zk.get(path)
        except NoNodeError:
            return f"service {service!r} has no live instance {name}"
        record = InstanceRecord.from_bytes(service, name, path, data)
        before = record.status
        if before != status:
            updated = dataclasses.replace(record, status=status)
            try:  # conditional: a write in between (its owner's update) is read again
                zk.set(path, updated.to_bytes(path), version=stat.version)
            except (BadVersionError, NoNodeError):
                continue
        return name, before
    raise RegistryConflict(f"{path} kept changing during {_ATTEMPTS} attempts")


def _set_status(args: argparse.Namespace, status: str) -> int:
    service = validate_name("service", args.service)
    with connect(args) as zk:
        done = set_status(zk, service, args.instance, status)
    if isinstance(done, str):
        return fail(done, EXIT_NOT_FOUND)
    name, before = done
    if args.json:
        print_json({"service": service, "instance": name, "old": before, "new": status})
    elif before == status:
        print(f"{service} {name} is {status} already")
    else:
        back = f"sentinel {'undrain' if status == 'draining' else 'drain'} {service} {name}"
        print(f"{service} {name}: {before} -> {status} (`{back}` undoes it)")
    return EXIT_OK


def _drain(args: argparse.Namespace) -> int:
    return _set_status(args, "draining")


def _undrain(args: argparse.Namespace) -> int:
    return _set_status(args, "up")
