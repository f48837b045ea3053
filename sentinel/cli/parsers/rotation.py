"""``sentinel drain`` and ``sentinel undrain``: their parsers
(implementation: :mod:`sentinel.cli.rotation`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import SERVICE_HELP, add_command


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``drain`` and ``undrain``."""
    for name, handler, summary, description in (
        (
            "drain",
            "rotation:_drain",
            "take one instance out of rotation, reversibly (status draining; see undrain)",
            "Set the status of one live instance to draining: clients stop choosing it as "
            "soon as their cache sees the change (get_service returns only instances that are "
            "up), while it stays registered and keeps serving what it has. Its process keeps "
            "that status across its own updates and session expiries, until `sentinel "
            "undrain` (or its own update_registration(status=...)). To remove an instance "
            "for good, its process calls Sentinel.deregister(registration, wait=1.0) (or stops).",
        ),
        (
            "undrain",
            "rotation:_undrain",
            "put a drained instance back into rotation (status up)",
            "Set the status of one live instance back to up: clients choose it again as soon "
            "as their cache sees the change.",
        ),
    ):
        parser = add_command(
            commands,
            name,
            handler,
            summary,
            description,
            (
                f"sentinel {name} orders-db p1:replica-b",
                f"sentinel {name} orders-db replica-b   # the label, when one partition has it",
            ),
        )
        parser.add_argument("service", metavar="SERVICE", help=SERVICE_HELP)
        parser.add_argument(
            "instance",
            metavar="INSTANCE",
            help="PARTITION:LABEL as `sentinel ls SERVICE` and `watch` show it, or the LABEL "
            "alone when one partition holds it",
        )
