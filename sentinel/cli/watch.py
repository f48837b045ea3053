"""``sentinel watch``: a live stream of what changes in the registry."""

from __future__ import annotations

import argparse
import datetime
import json
import signal
import sys
import threading
from typing import Any

from kazoo.recipe.watchers import ChildrenWatch

from sentinel.cli.common import (
    client,
    connect,
)
from sentinel.cli.options import (
    EXIT_OK,
)
from sentinel.errors import ServiceNotFound
from sentinel.events import (
    AuthChanged,
    ChangeEvent,
    ConnectionChanged,
    InstancesChanged,
    MetricsChanged,
    ShardKeysChanged,
)
from sentinel.health.sources import COLLECTOR, REGISTRY, health_of
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.layout import SERVICES
from sentinel.tables import metrics_text

SHOWN_KEYS = 5


def _changed_fields(old: Endpoint, new: Endpoint) -> str:
    fields = ("status", "health", "weight", "zone", "host", "port", "scheme", "properties")
    return ", ".join(
        f"{name} {getattr(old, name)}->{getattr(new, name)}"
        for name in fields
        if getattr(old, name) != getattr(new, name)
    )


def _health(endpoint: Endpoint) -> str:
    """The status, and where it comes from unless that is the registry alone (``up``,
    ``down, check:http``, ``up, collector down``; see sentinel.health.sources)."""
    source, state = health_of(endpoint.health, endpoint.status, endpoint.metrics)
    if source == REGISTRY:
        return endpoint.status
    if source == COLLECTOR:
        return f"{endpoint.status}, {source} {state}"
    return f"{endpoint.status}, {source}"


def describe(event: ChangeEvent) -> list[tuple[str, str]]:
    """``(subject, text)`` lines for a person; one event may say several things."""
    if isinstance(event, ConnectionChanged):
        return [("-", f"connection {event.state}")]
    service = event.service
    if isinstance(event, InstancesChanged):
        return (
            [(service, f"+ {e.name} {e.uri} ({_health(e)})") for e in event.added]
            + [(service, f"- {e.name} {e.uri}") for e in event.removed]
            + [(service, f"~ {new.name} {_changed_fields(old, new)}") for old, new in event.updated]
        )
    if isinstance(event, MetricsChanged):
        return [
            (service, f"metrics {new.name} {metrics_text(new.metrics)}") for _, new in event.updated
        ]
    if isinstance(event, ShardKeysChanged):
        moves = [
            f"{key} {old or '(none)'}->{new or '(none)'}"
            for key, (old, new) in sorted(event.changes.items())
        ]
        extra = len(moves) - SHOWN_KEYS
        text = ", ".join(moves[:SHOWN_KEYS]) + (f" and {extra} more" if extra > 0 else "")
        return [(service, f"shard {event.policy}: {text}")]
    if isinstance(event, AuthChanged):  # the versions only: never the credential
        return [(service, f"credential v{event.old_version} -> v{event.new_version}")]
    if event.new is None:
        return [(service, "service removed")]
    return [(service, f"spec {event.old} -> {event.new}")]


def document(event: ChangeEvent) -> dict[str, Any]:
    """The event as JSON-able data, for ``--json`` lines."""
    kind = type(event).__name__
    if isinstance(event, ConnectionChanged):
        return {"event": kind, "state": event.state}
    if isinstance(event, InstancesChanged):
        return {
            "event": kind,
            "service": event.service,
            "added": [e.to_dict() for e in event.added],
            "removed": [e.to_dict() for e in event.removed],
            "updated": [[o.to_dict(), n.to_dict()] for o, n in event.updated],
        }
    if isinstance(event, MetricsChanged):
        return {
            "event": kind,
            "service": event.service,
            "updated": [n.to_dict() for _, n in event.updated],
        }
    if isinstance(event, ShardKeysChanged):
        return {
            "event": kind,
            "service": event.service,
            "policy": event.policy,
            "changes": {k: list(v) for k, v in event.changes.items()},
        }
    if isinstance(event, AuthChanged):  # the versions only: never the credential
        return {
            "event": kind,
            "service": event.service,
            "old_version": event.old_version,
            "new_version": event.new_version,
        }
    return {
        "event": kind,
        "service": event.service,
        "old": None if event.old is None else event.old.scheme,
        "new": None if event.new is None else event.new.scheme,
    }


def _watch(args: argparse.Namespace) -> int:
    stop = threading.Event()
    # Ctrl-C and SIGTERM end the stream at the next wait, wherever they land; raising
    # KeyboardInterrupt mid-update would exit 130 instead of cleanly.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    lock = threading.Lock()

    def emit(json_document: dict[str, Any], lines: list[tuple[str, str]]) -> None:
        if args.events is not None and json_document["event"] not in args.events:
            return
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
        with lock:
            if args.json:
                print(json.dumps({"at": now, **json_document}, default=str), flush=True)
            else:
                for subject, text in lines:
                    print(f"{now}  {subject:<20}  {text}", flush=True)

    def show(event: ChangeEvent) -> None:
        emit(document(event), describe(event))

    with client(args) as sentinel:
        sentinel.listen(None, show)
        watched: set[str] = set()

        def follow(services: list[str], *, new: bool) -> None:
            for service in services:
                if service not in watched:
                    watched.add(service)
                    try:
                        sentinel.prefetch(service)
                    except ServiceNotFound:
                        watched.discard(service)
                        continue
                    if args.initial and not new:
                        current = sentinel.cached_instances(service)
                        emit(
                            {
                                "event": "CurrentInstances",
                                "service": service,
                                "instances": [e.to_dict() for e in current],
                            },
                            [(service, f"= {e.name} {e.uri} ({_health(e)})") for e in current]
                            or [(service, "= (no instance)")],
                        )
                    if new:  # its instances were there before we looked: say so once
                        emit(
                            {"event": "ServiceAppeared", "service": service},
                            [(service, "service appeared")],
                        )

        if args.service is not None:
            follow([args.service], new=False)
            if args.service not in watched:
                raise ServiceNotFound(args.service)
            print(f"watching {args.service}; Ctrl-C to stop", file=sys.stderr, flush=True)
            _wait(stop)
            return EXIT_OK
        with connect(args) as zk:
            # New services appear as children of /services; kazoo's thread only queues them.
            arrived: list[list[str]] = []
            wake = threading.Event()

            def on_services(children: list[str]) -> None:
                arrived.append(children)
                wake.set()

            ChildrenWatch(zk, SERVICES, on_services)  # calls back at once with the list
            wake.wait(args.timeout)
            wake.clear()
            while arrived:
                follow(arrived.pop(0), new=False)
            # Ready only once the services there now are loaded: later changes are events.
            print("watching every service; Ctrl-C to stop", file=sys.stderr, flush=True)
            while not stop.is_set():
                wake.wait(0.2)
                wake.clear()
                while arrived:
                    follow(arrived.pop(0), new=True)
    return EXIT_OK


def _wait(stop: threading.Event) -> None:
    while not stop.wait(0.2):
        pass
