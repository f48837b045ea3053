"""``sentinel ui``: the web dashboard (:mod:`sentinel.ui`) of this command's own client."""

from __future__ import annotations

import argparse
import functools
from typing import TYPE_CHECKING, Any

from sentinel.cli.common import client, event_printer, serve_metrics
from sentinel.cli.doctor import diagnose
from sentinel.cli.options import EXIT_OK
from sentinel.cli.rotation import set_status
from sentinel.cli.shard import keys_and_gaps
from sentinel.errors import SentinelError, ValidationError
from sentinel.freshness import METRICS_MAX_AGE
from sentinel.shards.store import existing_policies, read_map_state

if TYPE_CHECKING:
    import socket

    from kazoo.client import KazooClient

    from sentinel.client import Sentinel
    from sentinel.ui.server import DashboardServer


def ui_server() -> Any:
    """:mod:`sentinel.ui.server`, or an error naming the extra it needs."""
    try:
        from sentinel.ui import server
    except ImportError as exc:
        raise ValidationError(
            f"the dashboard needs the ui extra ({exc.name} is missing): "
            "pip install 'sentinel-discovery[ui]'"
        ) from None
    return server


def _run(args: argparse.Namespace) -> int:
    server = ui_server()
    serve_metrics(args)
    # Bound before connecting: a port another process holds is exit 4 with nothing started.
    sock = server.listen(args.address, args.port)
    try:
        with client(args) as sentinel:
            dashboard = build(
                sentinel,
                sock,
                address=args.address,
                allow_hosts=args.allow_host,
                max_streams=args.max_streams,
                allow_actions=args.allow_actions,
                doctor_args=doctor_options(args),
                timeout=args.timeout,
            )
            report = event_printer(args, {"serving": lambda d: f"serving {d['url']}"})
            report("serving", {"url": server.url(sock)})
            dashboard.run()
    finally:
        sock.close()
    return EXIT_OK


def build(
    sentinel: Sentinel,
    sock: socket.socket,
    *,
    address: str,
    allow_hosts: list[str],
    max_streams: int,
    allow_actions: bool = False,
    doctor_args: argparse.Namespace | None = None,
    agent: str | None = None,
    timeout: float = 10.0,
) -> DashboardServer:
    """The dashboard of ``sentinel`` on ``sock`` (not started): ``sentinel ui``'s and the
    agent's (``--ui``)."""
    server = ui_server()
    from sentinel.ui.app import Settings, create_app
    from sentinel.ui.security import allowed_hosts
    from sentinel.ui.source import Readers, RegistrySource

    wildcard = address in ("0.0.0.0", "::")
    if wildcard and not allow_hosts:
        raise ValidationError(
            f"--address {address} listens on every address: name the host browsers use "
            "with --allow-host NAME (the Host header is checked)"
        )
    port = sock.getsockname()[1]
    readers = Readers(
        shard_maps=read_shard_maps,
        findings=None if doctor_args is None else functools.partial(diagnose, doctor_args),
        set_status=set_status if allow_actions else None,
    )
    source = RegistrySource(sentinel, readers).start(timeout)
    settings = Settings(
        allow_actions=allow_actions,
        max_streams=max_streams,
        hosts=allowed_hosts(address, port, allow_hosts),
        agent=agent,
    )
    return server.DashboardServer(create_app(source, settings), sock)


def read_shard_maps(zk: KazooClient) -> list[tuple[str, Any]]:
    """Each shard policy as ``sentinel shard stats`` and ``doctor`` read it: ``(policy,
    (spec, keys per partition, gaps by service, digest problem))``, or ``(policy, why it
    could not be read)``."""
    found: list[tuple[str, Any]] = []
    for policy in existing_policies(zk):
        try:
            counts, gaps = keys_and_gaps(zk, policy)
            state = read_map_state(zk, policy)
        except SentinelError as exc:
            found.append((policy, str(exc)))
            continue
        found.append((policy, (state.spec, counts, gaps, state.digest_problem)))
    return found


def doctor_options(args: argparse.Namespace) -> argparse.Namespace:
    """``sentinel doctor``'s options for the doctor page: this command's connection and
    regions, doctor's defaults for the rest (every region; no identities file)."""
    return argparse.Namespace(
        **{
            **vars(args),
            "stale_after": METRICS_MAX_AGE,
            "identities": None,
            "all_regions": True,
            "json": False,
        }
    )
