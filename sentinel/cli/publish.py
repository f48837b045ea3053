"""``sentinel register``: hold one registration until interrupted (a publisher sidecar)."""

from __future__ import annotations

import argparse
import os
import threading
from typing import TYPE_CHECKING

from sentinel.cli.common import event_printer, run_daemon
from sentinel.health import HealthCheck
from sentinel.health.checks import Schedule
from sentinel.registry.layout import sanitize_name

if TYPE_CHECKING:
    from sentinel.client import Sentinel


def health_check(args: argparse.Namespace) -> HealthCheck | None:
    """The check the options ask for, if any (a ValidationError, exit 2, if a value is bad)."""
    settings: Schedule = {
        "interval": args.check_interval,
        "timeout": args.check_timeout,
        "failures_before_down": args.failures_before_down,
        "successes_before_up": args.successes_before_up,
    }
    if args.check_http is not None:
        return HealthCheck.http(args.check_http, **settings)
    if args.check_tcp is not None:
        return HealthCheck.tcp(args.check_tcp or None, **settings)
    if args.check_grpc is not None:
        return HealthCheck.grpc(args.check_grpc, **settings)
    return None


class _Held:
    """Registers on :meth:`run`, holds the registration until :meth:`stop`, deregisters."""

    def __init__(self, sentinel: Sentinel, args: argparse.Namespace, check: HealthCheck | None):
        self._sentinel = sentinel
        self._args = args
        self._check = check
        self._stopped = threading.Event()
        self._report = event_printer(args, {})

    def run(self) -> None:
        """Register, say so, hold until stopped, deregister."""
        args = self._args
        registration = self._sentinel.register(
            args.service,
            args.partition,
            args.host,
            args.port,
            scheme=args.scheme,
            label=args.label,
            weight=args.weight,
            zone=args.zone,
            health=self._check,
        )
        self._report(
            "registered",
            {
                "service": registration.service,
                "instance": f"{registration.partition}:{registration.label}",
                "status": registration.instance.status,
                "health": self._check.source if self._check else "registry",
            },
        )
        self._stopped.wait()
        self._sentinel.deregister(registration)
        self._report("deregistered", {"service": registration.service})

    def stop(self) -> None:
        """End :meth:`run` (from a signal handler)."""
        self._stopped.set()


def _register(args: argparse.Namespace) -> int:
    check = health_check(args)  # before connecting: a bad option registers nothing
    client_id = sanitize_name(f"publisher-{args.service}-{args.host}-{args.port}-{os.getpid()}")
    return run_daemon(args, client_id, lambda sentinel: _Held(sentinel, args, check))
