"""``sentinel service retire``: remove a service nothing uses any more
(:func:`sentinel.registry.retire.retire_service`, one transaction)."""

from __future__ import annotations

import argparse

from sentinel.cli.common import connect, print_json
from sentinel.cli.options import EXIT_OK
from sentinel.registry.retire import retire_service


def _retire(args: argparse.Namespace) -> int:
    with connect(args) as zk:
        retired = retire_service(zk, args.service, force=args.force)
    if args.json:
        print_json(
            {
                "service": retired.service,
                "instances": retired.instances,
                "followers": retired.followers,
                "removed": list(retired.removed),
            }
        )
        return EXIT_OK
    remaining = (
        f" ({retired.instances} instance(s) and {retired.followers} follower(s) removed with it)"
        if retired.instances or retired.followers
        else ""
    )
    print(f"retired {retired.service}: {len(retired.removed)} node(s) removed{remaining}")
    return EXIT_OK
