"""What ``ls`` and ``doctor`` show of Curator x-discovery base paths (``--curator-path``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from sentinel.cli.common import connect
from sentinel.errors import DecodeError
from sentinel.registry.curator import read_instances, validate_base_path
from sentinel.registry.endpoint import Endpoint


@dataclass(frozen=True)
class CuratorService:
    """One service under a base path: its endpoints and the nodes that did not decode."""

    base_path: str
    service: str
    endpoints: tuple[Endpoint, ...]
    skipped: tuple[DecodeError, ...]

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
    endpoints, skipped = read_instances(zk, base, service)
    return CuratorService(base, service, endpoints, skipped)
