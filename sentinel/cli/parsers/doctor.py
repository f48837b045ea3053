"""``sentinel doctor``: its parser (implementation: :mod:`sentinel.cli.doctor`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import add_command, add_curator_option, seconds_or_zero
from sentinel.freshness import METRICS_MAX_AGE


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``doctor``."""
    doctor = add_command(
        commands,
        "doctor",
        "doctor:_doctor",
        "check the namespace and say how to fix what is wrong",
        "Checks: ZooKeeper reachable and its version, the namespace and its "
        "sections, ACLs, undecodable nodes (schema), services or partitions without a live "
        "instance, shard policies that are missing, stale metrics, metrics of instances that "
        "are gone, /auth entries of clients that are not connected, and with --curator-path "
        "the Curator nodes Curator itself could not read, and each shard map read whole (one "
        "that does not decode, or whose buckets do not add up to the digest its writers keep). "
        "With --region all: every configured region (an unreachable one is a finding), and "
        "whether their shard maps agree. Each finding comes "
        "with the command that fixes it. Exit 1 when there is a problem (warnings alone: 0). "
        "On a terminal ERROR lines are red and WARN lines yellow, unless NO_COLOR is set.",
        (
            "sentinel doctor",
            "sentinel doctor --namespace /staging --stale-after 60",
            "sentinel doctor --identities identities.json",
            "sentinel doctor --region all --regions regions.json   # and do the maps agree?",
            "sentinel doctor --json | jq '.[] | select(.severity != \"ok\")'",
            "sentinel doctor --curator-path /services   # and nodes Curator could not read",
        ),
    )
    add_curator_option(doctor)
    doctor.set_defaults(all_regions=True)  # --region all: every region
    doctor.add_argument(
        "--stale-after",
        type=seconds_or_zero,
        default=METRICS_MAX_AGE,
        metavar="SECONDS",
        help=f"metrics older than this are stale (default {METRICS_MAX_AGE:g}: three of a "
        "collector's default intervals, the age past which the metric policies exclude an "
        "instance)",
    )
    doctor.add_argument(
        "--identities",
        metavar="FILE",
        help="the identities file 'init --secure' wrote: act as every role, so that each "
        "node's writers are compared by their whole identity (ZooKeeper hides digests from "
        "other sessions; without it they are compared by user name, with a warning)",
    )
