"""One command run in several regions: the shard manager's writes, ``doctor --region all``.

Each region is reached with its own connection settings (its entry in the regions
configuration: ensemble, namespace, TLS, identity), one region after the other; a region that
fails (unreachable, refused) is reported and the others still run. Which regions a command
runs in (:func:`targets`): with no regions configured (or only this client's region named,
without entries), the one ensemble given, as before;
``--region NAME``, that region alone; otherwise every configured region for a command that
writes what is global (the shard maps, docs/decisions/shard-maps-replicated-per-region.md), or
with ``--region all``.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from sentinel.cli.regions import ALL
from sentinel.errors import RegionsFailed, SentinelError
from sentinel.zk.errors import translate


@dataclass(frozen=True)
class Target:
    """A region a command runs in: its name (None: no regions configured) and the command's
    arguments pointed at its ensemble."""

    region: str | None
    args: argparse.Namespace


@dataclass(frozen=True)
class Outcome:
    """What a command did in one region: its result, or the error that stopped it there."""

    region: str | None
    result: Any = None
    error: SentinelError | None = None


def targets(args: argparse.Namespace, *, replicated: bool = False) -> list[Target]:
    """The regions a command runs in: every configured region when ``replicated`` (a write of
    what every region holds) or ``--region all``, unless ``--region NAME`` names one; else the
    region the arguments already point at."""
    regions = getattr(args, "regions_config", None)
    if regions is None or not regions.regions:  # no regions, or only this one's name
        return [Target(None, args)]
    named = getattr(args, "region", None)
    if named not in (None, ALL) or not (replicated or named == ALL):
        return [Target(regions.local, args)]
    return [
        Target(region.name, pointed_at(args, region, regions.identity_of(region)))
        for region in regions.regions.values()
    ]


def pointed_at(args: argparse.Namespace, region: Any, identity: str | None) -> argparse.Namespace:
    """A copy of ``args`` that connects to ``region`` as ``identity`` (its TLS and identity,
    not the ones given for the local ensemble: ``Regions.identity_of``)."""
    pointed = copy.copy(args)
    pointed.zk = region.hosts
    pointed.namespace = region.namespace
    pointed.region_tls = region.tls
    pointed.region_identity = identity
    pointed.zk_tls, pointed.zk_tls_ca, pointed.zk_tls_cert, pointed.zk_tls_key = (
        False,
        None,
        None,
        None,
    )
    return pointed


def each_region(
    chosen: list[Target], action: Callable[[argparse.Namespace], Any], operation: str
) -> list[Outcome]:
    """Run ``action(args)`` in each region, in order; an error in one region is its outcome
    (translated to Sentinel's, as ``main`` would) and the next region still runs."""
    outcomes = []
    for target in chosen:
        try:
            outcomes.append(Outcome(target.region, action(target.args)))
        except SentinelError as exc:
            outcomes.append(Outcome(target.region, error=exc))
        except (KazooException, KazooTimeoutError) as exc:
            error = translate(exc, operation)
            if not isinstance(error, SentinelError):
                raise
            outcomes.append(Outcome(target.region, error=error))
    return outcomes


def raise_failures(outcomes: list[Outcome]) -> None:
    """RegionsFailed naming every region that failed (and those that were written), if any
    did."""
    failures = {str(o.region): o.error for o in outcomes if o.error is not None}
    if failures:
        written = tuple(str(o.region) for o in outcomes if o.error is None)
        raise RegionsFailed(failures, written)
