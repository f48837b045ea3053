"""``sentinel agent``: the host agent daemon (one ZooKeeper session for a host's processes)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Iterator
from typing import Any

from sentinel.agentlink.link import AgentLink
from sentinel.agentlink.protocol import field, socket_path
from sentinel.auth.acl import effective_identity
from sentinel.cli.common import event_printer, print_json, print_table, serve_metrics, tls_config
from sentinel.cli.options import EXIT_OK
from sentinel.errors import AgentProtocolError, ValidationError
from sentinel.registry.layout import validate_namespace


def _run(args: argparse.Namespace) -> int:
    if args.print_xds_bootstrap:
        return _print_xds_bootstrap(args)
    # The daemon's own modules: `sentinel agent status` needs none of them.
    from sentinel.agent.regions import AGENT_SESSION, RegionServers
    from sentinel.agent.server import AgentServer
    from sentinel.cache.config import CacheConfig
    from sentinel.client import Sentinel
    from sentinel.registry.layout import sanitize_name

    xds_server = _xds_server_class(args.xds) if args.xds else None
    # Bound before connecting, as the xDS address is checked: a taken port is exit 4.
    ui_socket = _ui_socket(args) if args.ui is not None else None
    serve_metrics(args)
    client_id = args.client_id or sanitize_name(f"agent-{socket.gethostname()}")
    settings: dict[str, Any] = {  # the agent's client of each region, as of its own
        "connect_timeout": args.timeout,
        "session_timeout": args.session_timeout,
        "cache": CacheConfig(curator_base_paths=tuple(args.curator_path)),
    }
    configured = args.regions_config
    # Its own region's name too, without others: a hello may name it.
    regions = (
        None if configured is None else RegionServers(configured, client_id=client_id, **settings)
    )
    with Sentinel(
        args.zk,
        client_id,
        args.namespace,
        tls=tls_config(args),
        identity=getattr(args, "region_identity", None),
        **AGENT_SESSION,
        **settings,
    ) as sentinel:
        server = AgentServer(
            sentinel,
            socket_path(args.socket),
            allowed_uids=args.allow_uid,
            allowed_gids=args.allow_gid,
            send_timeout=args.send_timeout,
            max_connections=args.max_connections,
            max_connections_per_uid=args.max_connections_per_uid,
            hello_timeout=args.hello_timeout,
            heartbeat=args.heartbeat,
            deltas=not args.whole_state_frames,
            regions=regions,
        )
        report = event_printer(
            args,
            {
                "serving": lambda details: f"serving {details['socket']}",
                "serving_xds": lambda details: f"serving xDS on {details['address']}",
            },
        )
        with contextlib.ExitStack() as running:
            # Both listen before either is announced: an xDS address that cannot be served
            # is one error, never a `serving` line followed by an exit.
            running.enter_context(server)
            xds = None
            if xds_server is not None:
                xds = xds_server(
                    sentinel,
                    args.xds,
                    shared=bool(args.allow_uid or args.allow_gid),
                    send_timeout=args.send_timeout,
                    max_streams=args.max_connections,
                    max_streams_per_uid=args.max_connections_per_uid,
                    handshake_timeout=args.hello_timeout,
                )
                running.enter_context(xds)
            if ui_socket is not None:
                running.enter_context(_dashboard(args, sentinel, ui_socket, client_id))
            report("serving", {"socket": server.path})
            if xds is not None:
                report("serving_xds", {"address": xds.address})
            if ui_socket is not None:
                from sentinel.ui.server import url

                report("serving_ui", {"url": url(ui_socket)})
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: server.stop())
            server.run()
    return EXIT_OK


def _ui_socket(args: argparse.Namespace) -> socket.socket:
    """The dashboard's listening socket (``--ui``), or an error naming the ui extra."""
    from sentinel.cli.ui import ui_server

    return ui_server().listen(args.ui_address, args.ui)  # type: ignore[no-any-return]


@contextlib.contextmanager
def _dashboard(
    args: argparse.Namespace, sentinel: Any, sock: socket.socket, client_id: str
) -> Iterator[None]:
    """The agent's read-only dashboard of its own cache, served while the agent runs. No
    actions: the agent has no identity of its own to write with, and no doctor page."""
    from sentinel.cli.ui import build

    server = build(
        sentinel,
        sock,
        address=args.ui_address,
        allow_hosts=args.ui_allow_host,
        max_streams=args.ui_max_streams,
        agent=client_id,
        timeout=args.timeout,
    ).start()
    try:
        yield
    finally:
        server.stop()


def _xds_server_class(address: str) -> Any:
    """:class:`~sentinel.agent.xds.XdsServer`, or an error naming the extra it needs, what
    is wrong with ``address``, or that another process listens there: before anything
    connects."""
    from sentinel.agent.xds_bootstrap import check_free

    check_free(address)
    try:
        from sentinel.agent.xds import XdsServer
    except ImportError as exc:
        raise ValidationError(
            f"--xds needs the xds extra ({exc.name} is missing): "
            "pip install -e '.[xds]' in a checkout"
        ) from None
    return XdsServer


def _print_xds_bootstrap(args: argparse.Namespace) -> int:
    """The bootstrap a process copies; connects to nothing, needs no gRPC."""
    from sentinel.agent.xds_bootstrap import bootstrap_json

    if not args.xds:
        raise ValidationError("--print-xds-bootstrap prints the bootstrap for --xds ADDRESS")
    print(bootstrap_json(args.xds, socket.gethostname()))
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    link = AgentLink(
        socket_path(args.socket),
        validate_namespace(args.namespace),
        f"sentinel-cli-{os.getpid()}",
        None,
        # Another user than root or the agent's sees what this identity may read.
        identity=effective_identity(None),
        timeout=args.timeout,
    )
    # The link logs its retries; the command's error says it once (-v shows them).
    link_log = logging.getLogger("sentinel.agentlink.link")
    level = link_log.level
    if not args.verbose:
        link_log.setLevel(logging.ERROR)
    try:
        link.start()
        link.wait_connected(args.timeout)
        status = _checked_status(link.request({"op": "status"}))
    finally:
        link.close()
        link_log.setLevel(level)
    if args.json:
        print_json({"socket": link.path, **status})
        return EXIT_OK
    staleness = "" if status["state"] == "connected" else f", stale {status['staleness']:.1f}s"
    print(f"agent {link.path}: ZooKeeper session {status['state']}{staleness}")
    print_table(
        [(p["pid"], p["client"], ", ".join(p["services"]) or "-") for p in status["processes"]],
        ("PID", "CLIENT", "SERVICES"),
    )
    if status["regions"]:
        print("other regions (a session each, opened when a process first needs it):")
        print_table(
            [
                (
                    r["region"],
                    r["state"],
                    "-" if r["staleness"] is None else f"{r['staleness']:.1f}s",
                    "-" if r["processes"] is None else r["processes"],
                )
                for r in status["regions"]
            ],
            ("REGION", "SESSION", "STALE", "PROCESSES"),
        )
    return EXIT_OK


def _checked_status(answer: dict[str, Any]) -> dict[str, Any]:
    """The agent's ``status`` answer, its fields checked (the agent is read as untrusted)."""
    state = field(answer, "state", str)
    staleness = field(answer, "staleness", (int, float))
    processes = []
    for process in field(answer, "processes", list):
        if not isinstance(process, dict):
            raise AgentProtocolError("'status' lists a process that is not an object")
        services = field(process, "services", list)
        if not all(isinstance(service, str) for service in services):
            raise AgentProtocolError("'status' lists a service that is not a string")
        processes.append(
            {
                "pid": field(process, "pid", int),
                "client": field(process, "client", (str, type(None))),
                "services": services,
            }
        )
    regions = []
    for region in field(answer, "regions", list) if "regions" in answer else []:  # else: older
        if not isinstance(region, dict):
            raise AgentProtocolError("'status' lists a region that is not an object")
        regions.append(
            {
                "region": field(region, "region", str),
                "state": field(region, "state", str),
                "staleness": field(region, "staleness", (int, float, type(None))),
                "processes": field(region, "processes", (int, type(None))),
            }
        )
    return {"state": state, "staleness": staleness, "processes": processes, "regions": regions}
