"""``sentinel failover SERVICE RULE``: change a service's failover rule in one region.

The write is :func:`sentinel.publisher.write_failover` (a compare-and-set of the spec's
``failover`` field), the one the API's ``Sentinel.set_failover`` makes; the rule is parsed,
and checked against the regions configured (``--regions``), before anything is connected to,
so a bad one writes nothing.
"""

from __future__ import annotations

import argparse

from sentinel.cli.common import connect, print_json
from sentinel.cli.options import EXIT_OK
from sentinel.publisher import write_failover
from sentinel.registry.failover import LOCAL_ONLY, Failover
from sentinel.registry.layout import validate_name


def _set_failover(args: argparse.Namespace) -> int:
    service = validate_name("service", args.service)
    parsed = Failover.parse(args.rule)
    if args.regions_config is not None:
        args.regions_config.check_failover(parsed)  # a region its clients do not know
    rule = None if parsed.local_only else parsed  # local: no rule, as a service created bare
    with connect(args) as zk:
        before, after = write_failover(zk, service, rule)
    region = args.regions_config.local if args.regions_config is not None else None
    if args.json:
        print_json(
            {
                "service": service,
                "region": region,
                "old": None if before.failover is None else before.failover.to_document(),
                "new": None if after.failover is None else after.failover.to_document(),
                "changed": before != after,
            }
        )
        return EXIT_OK
    where = "" if region is None else f" in region {region}"
    old, new = ((s.failover or LOCAL_ONLY).describe() for s in (before, after))
    if before == after:
        print(f"{service}{where}: failover is {new} already")
    else:
        print(f"{service}{where}: failover {old} -> {new}")
    return EXIT_OK
