"""What a fleet of followers costs ZooKeeper: ``python -m benchmarks.zkcost``.

Clients (1 to 200 by default) each follow ``--services`` services of ``--instances`` instances
(each instance with a metrics node); they live in ``--workers`` worker processes, many
``Sentinel`` clients per process, each process reaching the server through a ``TcpProxy`` of its
own so that it can cut its clients' connections at once. At each fleet size (the sizes grow one
after the other on one standalone ZooKeeper, and size 0 measures the writer alone), the server
itself is asked, through four-letter words:

* ``wchs``: the watches it holds (``Total watches``);
* ``mntr``: the sessions (``zk_global_sessions``) and connections
  (``zk_num_alive_connections``), and the counters differenced around each change and each
  reconnection: reads served under the namespace (``zk_cnt_<ns>_read_per_namespace``), the bytes
  of their replies (``zk_sum_<ns>_read_per_namespace``), the bytes of every reply the server
  sent (``zk_response_bytes``; four-letter words' answers are not counted) and the watches
  fired, one notification each (``zk_sum_node_{changed,children,deleted,created}_watch_count``).
  The packet counters (``zk_packets_sent``/``_received``, ``zk_bytes_received_count``) are left
  out: each four-letter word the benchmark sends moves them.

Then, on a ZooKeeper of its own, the server's heap per session and per watch:
``--probe-sessions`` bare sessions, then each with an ``exists`` watch on the same
``--probe-paths`` paths, the live heap (``jcmd <pid> GC.class_histogram``, which runs a full
collection first) read before and after each step.

A change is one of: a metric rewritten, an instance registered, an instance deregistered (in the
first service); each is measured ``--changes`` times: counters before the write, the write, every
worker waiting until all its clients show the change, the server quiet for half a second, the
counters after. A reconnection is every worker cutting its relay at once and waiting until each
client is connected again and has re-synced. Per-client figures are (at n clients - at 0) / n.
These are counts, not times: the shared machine's load does not move them.

``--watch-mode`` names how the cache follows ZooKeeper; ``WATCH_MODES`` maps each mode to the
``CacheConfig.persistent_watches`` that selects it: ``one-shot`` (kazoo's watches, re-read
after every reconnection) and ``persistent`` (one recursive watch per followed subtree, kept
across reconnections within the session); the default measures both, one after the other, in
one table.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from kazoo.client import KazooClient

from benchmarks.common import RESULTS, report
from sentinel import CacheConfig, Sentinel
from sentinel.tables import format_table
from sentinel.testing.helpers import TcpProxy, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper, four_letter_word

NAMESPACE = "/zkcost"
# How each watch mode is selected: CacheConfig(persistent_watches=...).
WATCH_MODES: dict[str, bool] = {"one-shot": False, "persistent": True}
CHANGES = ("metric", "register", "deregister")
FIRED = ("changed", "children", "deleted", "created")


@dataclass(frozen=True)
class Counters:
    """``mntr`` counters that only grow, read at one moment."""

    reads: int
    read_bytes: int
    bytes_sent: int
    watches_fired: int

    def __sub__(self, other: Counters) -> Counters:
        return Counters(*(a - b for a, b in zip(self.values(), other.values(), strict=True)))

    def values(self) -> tuple[int, ...]:
        return tuple(self.__dict__.values())


def mntr(host: str, port: int) -> dict[str, str]:
    """The server's ``mntr`` answer as a dict."""
    answer = four_letter_word(host, port, "mntr", timeout=5)
    return dict(line.split("\t", 1) for line in answer.splitlines() if "\t" in line)


def counters(host: str, port: int) -> Counters:
    """The growing counters this benchmark differences."""
    ns = NAMESPACE.strip("/")
    m = mntr(host, port)
    return Counters(
        reads=int(m.get(f"zk_cnt_{ns}_read_per_namespace", 0)),
        read_bytes=int(m.get(f"zk_sum_{ns}_read_per_namespace", 0)),
        bytes_sent=int(m["zk_response_bytes"]),
        watches_fired=sum(int(m[f"zk_sum_node_{kind}_watch_count"]) for kind in FIRED),
    )


def watches(host: str, port: int) -> int:
    """``wchs``'s total: the watches the server holds."""
    answer = four_letter_word(host, port, "wchs", timeout=5)
    return int(answer.rsplit("Total watches:", 1)[1].strip())


def live_heap_bytes(pid: int | None) -> int | None:
    """Bytes of live objects in the server's heap (``jcmd GC.class_histogram``, which collects
    first), None without ``jcmd`` or a local process."""
    if pid is None:
        return None
    try:
        histogram = subprocess.run(
            ["jcmd", str(pid), "GC.class_histogram"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    total = re.search(r"^Total\s+\d+\s+(\d+)", histogram, re.MULTILINE)
    return int(total.group(1)) if total else None


def server_memory(sessions: int, paths: int) -> dict[str, float | None]:
    """What a session and a watch cost the server's heap, on a ZooKeeper of their own.

    ``sessions`` bare kazoo sessions (no watch), then each sets an ``exists`` watch on the same
    ``paths`` absent paths (no write, so ZooKeeper's log of recent proposals does not move), as a
    fleet watches the same nodes. Live heap after a full collection, before and after each step.
    """
    with LocalZooKeeper() as zk, ExitStack() as stack:
        pid = zk.members[0].pid
        start = live_heap_bytes(pid)
        clients = []
        for _ in range(sessions):
            client = KazooClient(zk.connect_string)
            client.start()
            stack.callback(client.stop)
            clients.append(client)
        connected = live_heap_bytes(pid)
        for client in clients:
            for result in [
                client.exists_async(f"{NAMESPACE}/probe-{i}", watch=lambda _event: None)
                for i in range(paths)
            ]:
                result.get()
        watching = live_heap_bytes(pid)
        held = watches(*_host_port(zk.connect_string))
    if None in (start, connected, watching):
        return {"bytes_per_session": None, "bytes_per_watch": None, "watches": held}
    return {
        "bytes_per_session": (connected - start) / sessions,
        "bytes_per_watch": (watching - connected) / held,
        "watches": held,
    }


def _host_port(connect_string: str) -> tuple[str, int]:
    host, port = connect_string.split(":")
    return host, int(port)


def quiet(host: str, port: int, seconds: float = 0.5) -> Counters:
    """Wait until the server served no read under the namespace for ``seconds``; the counters
    then. (Not "no packet": every four-letter word and every client's ping is one.)"""
    before = counters(host, port)
    while True:
        time.sleep(seconds)  # the quiet interval is the condition itself, not a synchronisation
        after = counters(host, port)
        if after.reads == before.reads:
            return after
        before = after


# --- the worker process: many clients, one relay ------------------------------------------------


def worker(hosts: str, mode: str, services: list[str]) -> None:
    """Serve the parent's commands (one JSON line each) until ``stop``."""
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # many clients x "connection dropped"
    host, port = hosts.split(":")
    with ExitStack() as stack:
        proxy = TcpProxy(host, int(port))
        stack.callback(proxy.close)
        clients: list[Sentinel] = []
        for line in sys.stdin:
            command = json.loads(line)
            if command["cmd"] == "grow":
                while len(clients) < command["to"]:
                    client = Sentinel(
                        proxy.address,
                        f"follower-{command['worker']}-{len(clients)}",
                        NAMESPACE,
                        announce=False,
                        session_timeout=30,
                        prometheus_registry=None,
                        cache=CacheConfig(persistent_watches=WATCH_MODES[mode]),
                    )
                    stack.enter_context(client)
                    for service in services:
                        client.prefetch(service)
                    clients.append(client)
                answer: dict[str, object] = {"clients": len(clients)}
            elif command["cmd"] == "wait":
                answer = {"ok": _wait_for(clients, command)}
            elif command["cmd"] == "reconnect":
                answer = {"ok": _reconnect(proxy, clients)}
            else:
                break
            print(json.dumps(answer), flush=True)


def _wait_for(clients: list[Sentinel], command: Mapping) -> bool:
    service, label, load = command["service"], command["label"], command.get("load")

    def shows(client: Sentinel) -> bool:
        found = [e for e in client.cached_instances(service) if e.label == label]
        if load is not None:
            return bool(found) and found[0].metrics.get("load") == load
        return bool(found) == command["present"]

    return all(wait_until(lambda c=c: shows(c), timeout=60) for c in clients)


def _reconnect(proxy: TcpProxy, clients: list[Sentinel]) -> bool:
    resyncs = [c.cache_stats.resyncs for c in clients]
    proxy.cut()
    proxy.restore()

    def settled() -> bool:
        return all(
            c.connection_state == "connected" and c.cache_stats.resyncs > before
            for c, before in zip(clients, resyncs, strict=True)
        )

    return bool(wait_until(settled, timeout=120, interval=0.05))


@contextmanager
def workers(hosts: str, mode: str, services: list[str], count: int) -> Iterator[list]:
    """``count`` worker processes, stopped on exit."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.zkcost", "--worker", hosts, mode, *services],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.stdin.write(json.dumps({"cmd": "stop"}) + "\n")
                process.stdin.close()
        for process in processes:
            process.wait(timeout=60)


def ask_all(processes: list, commands: list[dict]) -> list[dict]:
    """Send one command to each worker (all at once), then read each answer."""
    for process, command in zip(processes, commands, strict=True):
        process.stdin.write(json.dumps(command) + "\n")
        process.stdin.flush()
    return [json.loads(process.stdout.readline()) for process in processes]


def shares(total: int, parts: int) -> list[int]:
    """``total`` clients spread over ``parts`` workers, as evenly as possible."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


# --- the measurement ----------------------------------------------------------------------------


def measure_mode(mode: str, args: argparse.Namespace) -> list[dict]:
    """Every fleet size's figures for one watch mode, on a fresh ZooKeeper."""
    services = [f"svc{i}" for i in range(args.services)]
    rows = []
    with (
        LocalZooKeeper() as zk,
        Sentinel(zk.connect_string, "zkcost-writer", NAMESPACE, announce=False) as writer,
    ):
        host, port = _host_port(zk.connect_string)
        for service in services:
            for i in range(args.instances):
                writer.register(service, "p0", "10.0.0.1", 5000 + i, label=f"r{i}")
                writer.update_metrics(service, "p0", f"r{i}", {"load": 0})
        with workers(zk.connect_string, mode, services, args.workers) as processes:
            load = 0
            for size in sorted({0, *args.clients}):
                grown = ask_all(
                    processes,
                    [
                        {"cmd": "grow", "to": n, "worker": w}
                        for w, n in enumerate(shares(size, args.workers))
                    ],
                )
                assert sum(g["clients"] for g in grown) == size, grown
                quiet(host, port)
                m = mntr(host, port)
                row: dict = {
                    "mode": mode,
                    "clients": size,
                    "watches": watches(host, port),
                    "sessions": int(m["zk_global_sessions"]),
                    "connections": int(m["zk_num_alive_connections"]),
                }
                for kind in CHANGES:
                    deltas = []
                    for repeat in range(args.changes):
                        before = quiet(host, port)
                        wait = _change(writer, services[0], kind, repeat, load := load + 1)
                        answers = ask_all(processes, [wait] * len(processes))
                        assert all(a["ok"] for a in answers), f"{kind} never reached a client"
                        deltas.append(quiet(host, port) - before)
                    row[kind] = _median_counters(deltas)
                if size:
                    before = quiet(host, port)
                    answers = ask_all(processes, [{"cmd": "reconnect"}] * len(processes))
                    assert all(a["ok"] for a in answers), "a client never re-synced"
                    row["reconnect"] = (quiet(host, port) - before).__dict__
                print(f"{mode}: {size} clients measured", file=sys.stderr, flush=True)
                rows.append(row)
    return rows


def _change(writer: Sentinel, service: str, kind: str, repeat: int, load: int) -> dict:
    """Make one change; the wait command that tells when a client shows it."""
    label = f"moving-{repeat}"
    if kind == "metric":
        writer.update_metrics(service, "p0", "r0", {"load": load})
        return {"cmd": "wait", "service": service, "label": "r0", "load": load}
    if kind == "register":
        writer.register(service, "p0", "10.0.0.2", 6000 + repeat, label=label)
        return {"cmd": "wait", "service": service, "label": label, "present": True}
    (registration,) = [r for r in writer.registrations if r.label == label]
    writer.deregister(registration)
    return {"cmd": "wait", "service": service, "label": label, "present": False}


def _median_counters(deltas: list[Counters]) -> dict[str, float]:
    return {
        field: statistics.median(getattr(d, field) for d in deltas)
        for field in Counters.__dataclass_fields__
    }


def per_client(rows: list[dict]) -> list[dict]:
    """Per-client costs: (figure at n clients - figure at 0 clients) / n, for n > 0."""
    derived = []
    for row in rows:
        n, mode = row["clients"], row["mode"]
        if not n:
            continue
        zero = next(r for r in rows if r["mode"] == mode and r["clients"] == 0)
        entry = {
            "mode": mode,
            "clients": n,
            "watches_held": row["watches"],
            "watches": (row["watches"] - zero["watches"]) / n,
            "sessions": (row["sessions"] - zero["sessions"]) / n,
        }
        for kind in CHANGES:
            entry[kind] = {f: (row[kind][f] - zero[kind][f]) / n for f in row[kind]}
        entry["reconnect"] = {f: v / n for f, v in row["reconnect"].items()}
        derived.append(entry)
    return derived


@dataclass(frozen=True)
class Fleet:
    """The fleet ``--extrapolate`` sizes ZooKeeper for."""

    hosts: int
    processes_per_host: int
    services_followed: int  # S, by every process
    instances: int  # I, per service (each with a metrics node)
    services: int  # in the whole registry
    servers: int  # members and observers that clients connect to


def watches_per_client(services: int, instances: int, mode: str = "one-shot") -> int:
    """One-shot mode: a data watch per instance node and per metrics node, and one more per
    service (``wchs`` agrees at every measured size: 63 for 3 services of 10 instances).
    Persistent mode: one recursive watch on each service's node and one on its metrics node,
    whatever the instances."""
    return services * (2 * instances + 1) if mode == "one-shot" else 2 * services


def reads_per_resync(services: int, instances: int, mode: str = "one-shot") -> int:
    """Reads of one reconnection within the session when nothing changed. One-shot mode: a
    re-sync reads each service's spec, its two listings and every node. Persistent mode:
    none (the server reports what changed, and nothing did)."""
    return services * (2 * instances + 3) if mode == "one-shot" else 0


def extrapolate(
    results: Mapping, fleet: Fleet, mode: str = "one-shot"
) -> list[tuple[str, str, str]]:
    """One watch mode's cost for ``fleet``, from the constants ``results`` measured; each row
    as one session per process and as one shared session per host."""
    measured = [row for row in results["per_client"] if row.get("mode", "one-shot") == mode][-1]
    expected = watches_per_client(results["services"], results["instances"], mode)
    if measured["watches"] != expected:
        raise SystemExit(f"measured {measured['watches']} watches per client, model {expected}")
    memory = results["server_memory"]
    # What a re-read costs per read, from the one-shot re-sync (the persistent mode's storm
    # reads nothing, and an expiry re-reads as the one-shot mode does).
    one_shot = [row for row in results["per_client"] if row.get("mode", "one-shot") == "one-shot"][
        -1
    ]
    bytes_per_resync_read = one_shot["reconnect"]["bytes_sent"] / one_shot["reconnect"]["reads"]
    s, i = fleet.services_followed, fleet.instances
    followers = fleet.hosts * fleet.processes_per_host * s / fleet.services  # per service

    def figures(sessions: int) -> list[float]:
        per_service = followers * sessions / (fleet.hosts * fleet.processes_per_host)
        watches = sessions * watches_per_client(s, i, mode)
        storm = sessions * reads_per_resync(s, i, mode)
        return [
            sessions,
            sessions / fleet.servers,
            watches,
            watches / fleet.servers,
            watches / fleet.servers * memory["bytes_per_watch"] / 2**30,
            sessions / fleet.servers * memory["bytes_per_session"] / 2**30,
            per_service,
            per_service * measured["metric"]["reads"],
            per_service * measured["register"]["reads"],
            per_service * measured["metric"]["bytes_sent"] / 2**20,
            storm,
            storm * bytes_per_resync_read / 2**30,
        ]

    names = [
        "sessions",
        "sessions per server",
        "watches held",
        "watches per server",
        "heap for watches per server (GiB)",
        "heap for its sessions per server (GiB)",
        "followers of one service",
        "reads for one metric change",
        "reads for one instance registered",
        "bytes sent for one metric change (MiB)",
        "reads for a reconnect storm (every session re-syncs)",
        "bytes sent for that storm (GiB)",
    ]
    per_process = figures(fleet.hosts * fleet.processes_per_host)
    per_host = figures(fleet.hosts)
    return [
        (name, _figure(a), _figure(b))
        for name, a, b in zip(names, per_process, per_host, strict=True)
    ]


def _figure(value: float) -> str:
    return f"{value:,.2f}" if value < 10 else f"{value:,.0f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--clients",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 10, 50, 100, 200],
        help="fleet sizes, comma-separated (default 1,10,50,100,200)",
    )
    parser.add_argument("--services", type=int, default=3, help="services each client follows")
    parser.add_argument("--instances", type=int, default=10, help="instances per service")
    parser.add_argument("--workers", type=int, default=4, help="client processes")
    parser.add_argument("--changes", type=int, default=3, help="repeats of each change")
    parser.add_argument("--probe-sessions", type=int, default=50)
    parser.add_argument("--probe-paths", type=int, default=200)
    parser.add_argument(
        "--watch-mode",
        default="one-shot,persistent",
        help="comma-separated, measured one after the other (available: "
        f"{', '.join(WATCH_MODES)}); with --extrapolate, the one mode to size (default one-shot)",
    )
    parser.add_argument(
        "--extrapolate",
        metavar="HOSTSxPROCESSES",
        help="size a fleet from benchmarks/results/zkcost.json instead of measuring (10000x20)",
    )
    parser.add_argument("--follow", type=int, default=5, help="with --extrapolate: S")
    parser.add_argument("--size", type=int, default=100, help="with --extrapolate: I")
    parser.add_argument("--registry", type=int, default=500, help="with --extrapolate: services")
    parser.add_argument("--servers", type=int, default=5, help="with --extrapolate")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        hosts, mode, *services = args.worker
        worker(hosts, mode, services)
        return
    if args.extrapolate:
        hosts, processes = (int(n) for n in args.extrapolate.split("x"))
        fleet = Fleet(hosts, processes, args.follow, args.size, args.registry, args.servers)
        results = json.loads((RESULTS / "zkcost.json").read_text())
        mode = args.watch_mode if args.watch_mode in WATCH_MODES else "one-shot"
        print(
            f"{mode} mode, {hosts:,} hosts x {processes} processes, each following "
            f"{fleet.services_followed} of {fleet.services:,} services of {fleet.instances:,} "
            f"instances, clients spread over {fleet.servers} servers"
        )
        print(
            format_table(
                extrapolate(results, fleet, mode),
                headers=("figure", "a session per process", "a session per host"),
            )
        )
        return
    modes = args.watch_mode.split(",")
    unknown = [m for m in modes if m not in WATCH_MODES]
    if unknown:
        parser.error(
            f"watch mode {', '.join(unknown)} is not available: the cache has "
            f"{', '.join(WATCH_MODES)} (add a mode to WATCH_MODES when the cache has it)"
        )
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    rows = [row for mode in modes for row in measure_mode(mode, args)]
    derived = per_client(rows)
    memory = server_memory(args.probe_sessions, args.probe_paths)
    table = [
        (
            d["mode"],
            d["clients"],
            d["watches_held"],
            f"{d['watches']:.1f}",
            f"{d['sessions']:.2f}",
            *(f"{d[kind]['reads']:.2f} / {d[kind]['bytes_sent']:.0f}" for kind in CHANGES),
            f"{d['reconnect']['reads']:.1f} / {d['reconnect']['bytes_sent']:.0f}",
        )
        for d in derived
    ]
    report(
        "zkcost",
        f"ZooKeeper's cost per client following {args.services} services x {args.instances} "
        f"instances (+ metrics); medians of {args.changes} changes; per client = "
        "(figure at n - figure at 0) / n; reads / bytes sent per client",
        (
            "mode",
            "clients",
            "watches held",
            "watches/client",
            "sessions/client",
            *(f"{kind}: reads / bytes" for kind in CHANGES),
            "reconnection: reads / bytes",
        ),
        table,
        {
            "server_memory": memory,
            "rows": rows,
            "per_client": derived,
            "services": args.services,
            "instances": args.instances,
            "workers": args.workers,
            "changes": args.changes,
        },
    )
    if memory["bytes_per_watch"] is None:
        print("server heap per session and per watch: not measured (needs jcmd)")
    else:
        print(
            f"server heap: {memory['bytes_per_session']:,.0f} bytes per session, "
            f"{memory['bytes_per_watch']:,.0f} bytes per watch ({memory['watches']:,} watches of "
            f"{args.probe_sessions} sessions on the same {args.probe_paths} paths)"
        )


if __name__ == "__main__":
    main()
