"""``sentinel watch``: its parser (implementation: :mod:`sentinel.cli.watch`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import SERVICE_HELP, add_command, add_curator_option

# ``--events`` kinds, each the events of one kind (their ``event`` name in ``--json`` lines).
EVENT_KINDS = {
    "current": "CurrentInstances",  # --initial: what each service holds when watch starts
    "instances": "InstancesChanged",
    "metrics": "MetricsChanged",
    "shard": "ShardKeysChanged",
    "spec": "ServiceSpecChanged",
    "service": "ServiceAppeared",
    "auth": "AuthChanged",
    "connection": "ConnectionChanged",
}


def event_kinds(text: str) -> frozenset[str]:
    """``--events KIND,...``: the ``event`` names to show; a kind is one of
    :data:`EVENT_KINDS` or its event's name, in any case. Unknown kinds are a usage error."""
    names = {kind.lower(): event for kind, event in EVENT_KINDS.items()}
    names.update({event.lower(): event for event in EVENT_KINDS.values()})
    chosen = set()
    for kind in text.split(","):
        event = names.get(kind.strip().lower())
        if event is None:
            raise argparse.ArgumentTypeError(
                f"unknown event kind {kind.strip()!r}; kinds: {', '.join(EVENT_KINDS)}"
            )
        chosen.add(event)
    return frozenset(chosen)


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``watch``."""
    watch = add_command(
        commands,
        "watch",
        "watch:_watch",
        "stream changes as they happen",
        "Print every change the cache sees, with a timestamp: registrations (+), "
        "deregistrations (-), instance updates (~), metrics, shard-key moves, spec changes and "
        "the connection's state. Without SERVICE, every service, including new ones. Only "
        "changes are printed, unless --initial asks for each service's instances first. "
        "--json prints one JSON object per line. Ctrl-C (or SIGTERM) stops it cleanly.",
        (
            "sentinel watch",
            "sentinel watch orders-db",
            "sentinel watch orders-db --initial   # what it holds now, then the changes",
            "sentinel watch --events shard,connection   # shard moves, without metric lines",
            "sentinel watch --json | jq -c 'select(.event == \"ConnectionChanged\")'",
            "sentinel watch orders --curator-path /services   # a Curator registry's service",
        ),
    )
    watch.add_argument(
        "service", nargs="?", metavar="SERVICE", help=f"{SERVICE_HELP}; default: every service"
    )
    watch.add_argument(
        "--initial",
        action="store_true",
        help="first print each service's instances as they are now (lines '= NAME URI "
        "(STATUS)'; --json: CurrentInstances), then the changes",
    )
    add_curator_option(watch)
    watch.add_argument(
        "--events",
        type=event_kinds,
        metavar="KIND,...",
        help="show only these kinds of event: "
        + ", ".join(f"{kind} ({event})" for kind, event in EVENT_KINDS.items())
        + "; default: all",
    )
