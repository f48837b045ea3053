"""What ``ls`` and ``doctor`` show of Curator x-discovery base paths (``--curator-path``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from sentinel.auth.acl import world_writable
from sentinel.cli.common import connect
from sentinel.errors import DecodeError
from sentinel.registry.curator import read_registry, survey_registry
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.layout import validate_base_path
from sentinel.registry.reads import ServiceListing
from sentinel.registry.records import CuratorSource, InstanceRecord, ServiceSpec


@dataclass(frozen=True)
class CuratorService:
    """One service under a base path: its endpoints and the nodes that did not decode."""

    base_path: str
    service: str
    endpoints: tuple[Endpoint, ...]
    skipped: tuple[DecodeError, ...]
    persistent_nodes: tuple[str, ...] = ()  # decodable instance nodes that are persistent
    world_writable: tuple[str, ...] = ()  # the base path and service node, where anyone writes

    @property
    def source(self) -> str:
        """Where it came from, as ``ls`` shows it: ``curator:<base path>``."""
        return f"curator:{self.base_path}"


def base_paths(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``--curator-path`` options, each an absolute path (ValidationError otherwise)."""
    paths = tuple(getattr(args, "curator_path", ()))
    for path in paths:
        validate_base_path(path, "--curator-path")
    return paths


def curator_services(
    args: argparse.Namespace, only: str | None = None
) -> Iterator[CuratorService | str]:
    """Every service under each base path (or ``only`` that one), read directly; a base path
    that does not exist is yielded as itself (a string)."""
    paths = base_paths(args)
    if not paths:
        return
    with connect(args, chroot=False) as zk:
        for base in paths:
            try:
                services = [only] if only is not None else sorted(zk.get_children(base))
            except NoNodeError:
                yield base
                continue
            for service in services:
                yield _read(zk, base, service)


def _read(zk: KazooClient, base: str, service: str) -> CuratorService:
    found = survey_registry(zk, ServiceSpec(service, curator=CuratorSource(base)))
    writable = []
    for path in (base, f"{base.rstrip('/')}/{service}"):
        try:
            if world_writable(zk.get_acls(path)[0]):
                writable.append(path)
        except NoNodeError:
            continue
    return CuratorService(
        base, service, found.endpoints, found.skipped, found.persistent_nodes, tuple(writable)
    )


def registry_service(args: argparse.Namespace, spec: ServiceSpec) -> CuratorService:
    """The instances of a namespace service whose spec names a Curator registry, read there
    (on a connection of its own at the server's root: the registry is outside the chroot)."""
    assert spec.curator is not None
    with connect(args, chroot=False) as zk:
        endpoints, skipped = read_registry(zk, spec)
    return CuratorService(spec.curator.base_path, spec.service, endpoints, skipped)


def instances_of(args: argparse.Namespace, listing: ServiceListing) -> ServiceInstances:
    """A namespace service's instances wherever they live: its own children, or the Curator
    registry its spec names (what ``ls``, ``doctor`` and ``prune`` count its metrics against)."""
    if listing.spec.curator is None:
        return ServiceInstances("namespace", listing.instances, listing.skipped)
    found = registry_service(args, listing.spec)
    return ServiceInstances(found.source, found.endpoints, len(found.skipped))


class ServiceInstances(NamedTuple):
    """Where a service's instances live (``namespace``, or ``curator:<base path>``), the
    decodable ones, and how many nodes were skipped."""

    source: str
    instances: tuple[InstanceRecord | Endpoint, ...]
    skipped: int

    @property
    def names(self) -> set[str]:
        """The instance names their metrics nodes are kept under."""
        return {f"{i.partition}:{i.label}" for i in self.instances}
