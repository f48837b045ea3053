"""``--region`` and ``--regions``: the connection settings a region supplies to a command.

Run once, after parsing and before the command (:func:`apply`), so that every command (each
reads ``args.zk`` and ``args.namespace``) acts in the region named, through the one parser of
:mod:`sentinel.regions.config`.
"""

from __future__ import annotations

import argparse
import os

from sentinel.errors import RegionConfigError
from sentinel.regions.config import REGION_ENV, REGIONS_ENV, Regions
from sentinel.regions.identity import identity_for

#: ``--region all``: every configured region, for the commands that act in several
#: (``doctor``, the shard manager's writes: :mod:`sentinel.cli.fanout`); the others act in the
#: local region. No region may be called so.
ALL = "all"


def apply(args: argparse.Namespace) -> None:
    """Set ``args.regions_config`` (:class:`~sentinel.regions.config.Regions` or None) from
    ``--regions``/``--region`` (defaults ``$SENTINEL_REGIONS``/``$SENTINEL_REGION``), and fill
    ``--zk``, ``--namespace``, TLS (``args.region_tls``) and the identity
    (``args.region_identity``) from the region's entry where not given.

    ``--region`` names the region the command acts in, not the one it is run from: the home
    region, whose password ``$SENTINEL_ZK_IDENTITY`` is, stays ``$SENTINEL_REGION``'s (else
    the document's ``local``; ``--region`` only when neither names one), and the identity
    is the one rule's (:func:`~sentinel.regions.identity.identity_for`).

    Raises RegionConfigError (a usage error) for a configuration that cannot be used, or a
    ``--region`` the configuration does not hold (``--region all``: see :data:`ALL`).
    """
    text = getattr(args, "regions", None) or os.environ.get(REGIONS_ENV) or None
    asked = getattr(args, "region", None)
    every = asked == ALL
    named = None if every else asked
    declared = os.environ.get(REGION_ENV) or None  # the home region
    source = "--regions" if getattr(args, "regions", None) else f"${REGIONS_ENV}"
    regions = None
    if text is not None:
        regions = Regions.from_text(text, declared, source=source, default_local=named)
    elif (home := declared or named) is not None:
        regions = Regions(home)
    if regions is not None and named is not None:
        regions = regions.acting_in(named)
    if every and not getattr(args, "all_regions", False):
        raise RegionConfigError(
            "only doctor and the shard manager's changes act in every region: name one",
            field="--region",
        )
    if every and (regions is None or not regions.regions):
        raise RegionConfigError(
            "--region all needs the regions (--regions or $SENTINEL_REGIONS)", field="--region"
        )
    if regions is not None and ALL in regions.regions:
        raise RegionConfigError(
            f"a region cannot be called {ALL!r}: --region {ALL} means every region",
            field=f"regions.{ALL}",
        )
    args.regions_config = regions
    args.region_tls = None
    args.region_identity = None
    if regions is None:
        return
    # Named on the command line, the region must exist (region() raises).
    entry = regions.region(regions.local) if named is not None else regions.local_region()
    args.region_identity = identity_for(
        regions.local, None if entry is None else entry.identity, regions.home
    )
    if entry is not None:
        if getattr(args, "zk", None) is None:
            args.zk = entry.hosts
        if not getattr(args, "namespace_given", False):
            args.namespace = entry.namespace
        args.region_tls = entry.tls
