"""One deregistration stage by stage, Sentinel's and Curator's: ``python -m benchmarks.departure``.

Where the time of a deregistration reaching another cache goes, on one clock: every process
reads ``time.monotonic_ns()`` (CLOCK_MONOTONIC, system-wide on Linux), and Java's
``System.nanoTime()`` is that clock too. The work is ``benchmarks.compare``'s propagation row:
``--changes`` registrations then as many deregistrations, ``--pace`` seconds apart, from a
writer process to a cache in another (ours: the writer ``python -m benchmarks.departure
--writer``, the follower this process's ``listen()`` callback; Curator's: ``CuratorBench.java
propagation``, its writer and its ``ServiceCacheListener`` in one JVM, as in ``compare``). A
third process beside them, ``--watch``, holds a persistent recursive watch on the same service
on a raw socket (``benchmarks.floor.RawSession``, no library, no thread) and notes when each
event's bytes are in its hands: the server's side, bracketed, alike for both libraries.

Sentinel's stages (each the first time it is passed for the change):

1. ``call``: the writer enters ``deregister`` (``register``);
2. ``sent``: its request written to its socket (the writer's thread, ``HookedConnection._submit``);
3. ``reply``: the reply read off the writer's socket (its connection thread);
4. ``returned``: ``deregister`` returned to the writer;
5. ``raw watcher``: the event on the raw socket beside the follower;
6. ``woke``: the follower's connection thread back from ``select`` for the event's bytes;
7. ``read``: the event's frame read off the socket (kazoo's ``_read_header``: a ``select`` and a
   ``recv`` for its length, the same for its body);
8. ``parsed``: the event parsed and handed to the watchers (``PersistentWatches._dispatch``);
9. ``watcher``: the cache's watcher called (``PersistentFollower._on_event``);
10. ``queued``: the event's task handed on: queued for the cache's worker
    (``CacheWorker.merge``), or run on the connection thread with the worker woken first
    (``CacheWorker.run_now``, where the library has it: a removal, or a read's reply in hand,
    while the worker is idle);
11. ``blocked``: the connection thread, done with the event, in its next ``select`` (the worker
    woken by the task cannot hold the interpreter before);
12. ``dequeued``: the worker back from its queue with the last task before the listener
    (``CacheWorker._next_task`` returned: woken by the system and holding the interpreter);
13. ``applying``: the task started (``PersistentFollower._apply_event``: on the worker, or on
    the connection thread when run there);
14. ``update``: the change handed to the cache (``RegistryCache.update``: the new snapshot is
    built from here);
15. ``swap``: the new snapshot built and about to be stored (``RegistryCache.swap``);
16. ``listener``: the observer's callback, its first statement (on the worker).

Curator's: ``call`` (``unregisterService`` entered), ``raw watcher``, ``watcher`` (the reader's
ZooKeeper client hands the event to a watcher of the same subtree on its event thread, where
the cache's own watcher gets it: ``CuratorBench.java propagation ... trace``) and ``listener``
(the ``ServiceCacheListener``'s first statement). The table gives, per stage, the p50 and p99 after
``call`` over every change of the kind, and the p50 of its step from the stage it follows
(``SENTINEL_STAGES``, ``CURATOR_STAGES``); every change's stages go into
``benchmarks/results/departure.json``. ``--rounds`` alternate the two sides on one ZooKeeper.
Each round also gives the CPU the follower's connection thread and its cache's worker used
(``/proc``'s ``schedstat``, nanoseconds), the wrappers' own cost included.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kazoo.protocol.serialization import Create, Delete, Transaction

from benchmarks.common import percentiles, report
from benchmarks.compare import PACE, curator, curator_classpath
from benchmarks.floor import _HEADER, _INT, _REPLY, _WATCH_XID, RawSession, _string
from benchmarks.propagation import WARM_UP, prepare, warm_up
from sentinel import Sentinel
from sentinel.cache.followers import PersistentFollower
from sentinel.cache.registry_cache import RegistryCache
from sentinel.cache.worker import CacheWorker
from sentinel.events import InstancesChanged
from sentinel.tables import format_table
from sentinel.testing.zookeeper import LocalZooKeeper
from sentinel.zk.kazoo_internals import HookedConnection
from sentinel.zk.transport import PollHandler
from sentinel.zk.watches import PersistentWatches, WatcherType

_ADD_WATCH, _PERSISTENT_RECURSIVE = 106, 1
_PING, _PING_XID = 11, -2
_CREATED, _DELETED = 1, 2
# Each side's stages, each with the stage its step is taken from (None: the call itself):
# the follower's chain, the writer's own, and the raw watcher, a bystander bracketing the
# server (from the request on the wire for Sentinel; from the call for Curator, whose write
# to its socket is not traced).
SENTINEL_STAGES = {
    "call": None,
    "sent": "call",
    "reply": "sent",
    "returned": "reply",
    "raw watcher": "sent",
    "woke": "sent",
    "read": "woke",
    "parsed": "read",
    "watcher": "parsed",
    "queued": "watcher",
    "blocked": "queued",
    "dequeued": "queued",
    "applying": "queued",
    "update": "applying",
    "swap": "update",
    "listener": "swap",
}
# The deregistrations made with the writer's own watch on the node removed first (--unwatch).
UNWATCHED = "deregister, writer's watch removed first"
CURATOR_STAGES = {"call": None, "raw watcher": "call", "watcher": "call", "listener": "watcher"}


def _now() -> int:
    return time.monotonic_ns()


def _wrap(owner: Any, name: str, before=None, after=None) -> None:
    """Note ``before(*args)`` ahead of ``owner.name`` and ``after(*args)`` once it returned
    (this process only lives for the trace, so nothing is undone)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(*args)
        result = original(*args, **kwargs)
        if after is not None:
            after(*args)
        return result

    setattr(owner, name, wrapper)


def watcher(host: str, port: int, path: str) -> None:
    """The raw watcher process: a persistent recursive watch on ``path``, every event's time
    and path printed (one JSON line each) once stdin is closed or 120 s have passed."""
    session = RawSession(host, port)
    session.request(_ADD_WATCH, _string(path) + _INT.pack(_PERSISTENT_RECURSIVE))
    print("ready", flush=True)
    events: list[tuple[int, int, str]] = []
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    session._sock.settimeout(0.2)
    deadline = pinged = time.monotonic()
    deadline += 120
    while not done.is_set() and time.monotonic() < deadline:
        if time.monotonic() - pinged > 1:  # the session lives on what this client sends
            session._send(_HEADER.pack(_PING_XID, _PING))
            pinged = time.monotonic()
        try:
            reply = session._receive()
        except TimeoutError:
            continue
        at = _now()
        if _REPLY.unpack_from(reply)[0] == _WATCH_XID:
            events.append((at, *session._event(reply)))
    for at, kind, where in events:
        print(json.dumps({"t": at, "kind": kind, "path": where}))


def writer(hosts: str, count: int, pace: float, unwatch: bool = False) -> None:
    """Sentinel's writer process: ``count`` registrations then as many deregistrations, each
    with its stages (``call``, ``sent``, ``reply``, ``returned``), printed at the end (one
    JSON line each, as ``benchmarks.propagation``'s writer: nothing printed while measuring).

    ``unwatch``: every other deregistration is preceded, before its call, by the removal of
    the data watch this writer holds on its own node (``EphemeralNodes.follow``'s, which hears
    an operator's drain), its reply awaited, so the server has dropped it when the delete
    arrives: whether a deletion that also fires a watch of the deleting session's reaches the
    other sessions later."""
    current: dict[str, int] = {}

    def sent(conn: HookedConnection, request: Any, *_: Any) -> None:
        if isinstance(request, (Create, Delete, Transaction)) and "sent" not in current:
            current["sent"] = _now()

    def replied(conn: HookedConnection, *_: Any) -> None:
        if "sent" in current and "reply" not in current:
            current["reply"] = _now()

    _wrap(HookedConnection, "_submit", after=sent)
    _wrap(HookedConnection, "_read_response", before=replied)
    written = []
    with Sentinel(hosts, "bench-writer") as client:
        warm_up(client, pace)  # untimed, as compare's writers (before the wrappers note)

        def timed(op: str, label: str, call) -> Any:
            current.clear()
            current["call"] = _now()
            result = call()
            current["returned"] = _now()
            written.append({"op": op, "label": label, **current})
            time.sleep(pace)
            return result

        registered = []
        for i in range(count):
            label = f"new-{i}"
            register = functools.partial(client.register, "db", "p0", "10.0.0.1", 6000 + i)
            registered.append(timed("register", label, functools.partial(register, label=label)))
        for i, registration in enumerate(registered):
            unwatched = unwatch and i % 2 == 1
            if unwatched:
                client.session.watches.remove_watches(registration.path, WatcherType.DATA)
            timed(
                "deregister", registration.label, functools.partial(client.deregister, registration)
            )
            written[-1]["unwatched"] = unwatched
    for line in written:
        print(json.dumps(line))


def _raw_watcher(host: str, port: int, path: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.departure", "--watch", host, str(port), path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def _raw_events(process: subprocess.Popen) -> dict[tuple[str, str], int]:
    """(op, label) -> when the raw watcher had the event (the first of that kind and node)."""
    out, _ = process.communicate(timeout=60)
    kinds = {_CREATED: "register", _DELETED: "deregister"}
    seen: dict[tuple[str, str], int] = {}
    for line in out.splitlines():
        event = json.loads(line)
        if event["kind"] in kinds:
            label = event["path"].rsplit("/", 1)[1].split(":")[-1]
            seen.setdefault((kinds[event["kind"]], label), event["t"])
    return seen


class _FollowerTrace:
    """The follower's stages of each event, noted by wrappers installed once per process around
    the methods an event passes through (each round's follower is traced in turn)."""

    current: _FollowerTrace | None = None

    def __init__(self, client: Any) -> None:
        self.client = client
        # node path -> per event of the node (its creation, then its deletion): stage -> ns
        self.stages: dict[str, list[dict[str, int]]] = {}
        self.woke = self.read = self.dequeued = 0
        self.applying = ""
        self.queued = ""  # the node whose task was queued last, until the next select
        self.threads: dict[str, int] = {}  # "connection", "worker" -> native thread id

    @classmethod
    def of(cls, client: Any) -> _FollowerTrace:
        """Trace ``client``'s follower from now on."""
        if cls.current is None:
            _wrap(HookedConnection, "_read_socket", before=cls._read_socket)
            _wrap(HookedConnection, "_read_header", after=cls._read_header)
            _wrap(PersistentWatches, "_dispatch", before=cls._dispatched)
            _wrap(PersistentFollower, "_on_event", before=cls._watcher)
            _wrap(CacheWorker, "merge", after=cls._merged)
            if hasattr(CacheWorker, "run_now"):  # the library before issue 53 has none
                cls._wrap_run_now()
            _wrap(PollHandler, "select", before=cls._select)
            _wrap(CacheWorker, "_next_task", after=cls._dequeued)
            _wrap(PersistentFollower, "_apply_event", before=cls._applying)
            _wrap(RegistryCache, "update", before=lambda *_: cls._note(None, "update"))
            _wrap(RegistryCache, "swap", before=lambda *_: cls._note(None, "swap"))
        cls.current = trace = cls(client)
        return trace

    @classmethod
    def _wrap_run_now(cls) -> None:
        original = CacheWorker.run_now

        @functools.wraps(original)
        def run_now(worker: CacheWorker, task: Any, *args: Any, **kwargs: Any) -> bool:
            at = _now()
            ran = original(worker, task, *args, **kwargs)
            if ran and task.run.__name__ == "_apply_event":
                cls._note(task.args[0], "queued", at)
                if cls.current is not None:
                    cls.current.queued = task.args[0]
            return ran

        CacheWorker.run_now = run_now  # type: ignore[method-assign]

    @classmethod
    def _note(cls, path: str | None, stage: str, at: int | None = None) -> None:
        trace = cls.current
        if trace is not None:
            events = trace.stages.get(trace.applying if path is None else path)
            if events:
                events[-1].setdefault(stage, _now() if at is None else at)

    @classmethod
    def _read_socket(cls, connection: HookedConnection, *_: Any) -> None:
        trace = cls.current
        if trace is not None and connection.client is trace.client:
            trace.woke = _now()
            trace.read = 0
            trace.threads["connection"] = threading.get_native_id()

    @classmethod
    def _read_header(cls, connection: HookedConnection, *_: Any) -> None:
        trace = cls.current
        if trace is not None and connection.client is trace.client:
            trace.read = _now()

    @classmethod
    def _dispatched(cls, watches: PersistentWatches, watch: Any) -> None:
        trace = cls.current
        if trace is not None and watches._client is trace.client:
            parsed = _now()
            events = trace.stages.setdefault(trace.client.unchroot(watch.path), [])
            events.append({"woke": trace.woke, "read": trace.read, "parsed": parsed})

    @classmethod
    def _watcher(cls, follower: PersistentFollower, root: str, event: Any) -> None:
        cls._note(event.path, "watcher")

    @classmethod
    def _merged(cls, worker: CacheWorker, task: Any) -> None:
        if task.run.__name__ == "_apply_event":
            cls._note(task.args[0], "queued")
            if cls.current is not None:
                cls.current.queued = task.args[0]

    @classmethod
    def _select(cls, *_: Any) -> None:
        trace = cls.current
        if (
            trace is not None
            and trace.queued
            and trace.threads.get("connection") == threading.get_native_id()
        ):
            cls._note(trace.queued, "blocked")
            trace.queued = ""

    @classmethod
    def _applying(cls, follower: PersistentFollower, path: str) -> None:
        trace = cls.current
        if trace is not None:
            trace.applying = path
        cls._note(path, "applying")

    @classmethod
    def _dequeued(cls, worker: CacheWorker) -> None:
        if cls.current is not None:
            cls.current.dequeued = _now()
            cls.current.threads["worker"] = threading.get_native_id()


def _threads_cpu() -> dict[int, float]:
    """Milliseconds of CPU each thread of this process has used (Linux's /proc: the time on
    a CPU its scheduler counted, in nanoseconds)."""
    used = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(FileNotFoundError):  # ended meanwhile
            on_cpu = Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]
            used[int(tid)] = int(on_cpu) / 1e6
    return used


def sentinel_side(
    zk: LocalZooKeeper,
    count: int,
    pace: float,
    cpu: list[dict] | None = None,
    unwatch: bool = False,
) -> list[dict]:
    """Every change's stages, in ns on CLOCK_MONOTONIC, Sentinel's writer to Sentinel's cache
    (the service prepared by ``benchmarks.propagation.prepare``); ``cpu`` gets the CPU the
    follower's process used meanwhile, in all and on its busiest thread (is any thread busy
    while an event is on its way, keeping the interpreter from the thread that handles it?);
    ``unwatch``: see :func:`writer` (those deregistrations are the kind ``UNWATCHED``)."""
    cpu = [] if cpu is None else cpu
    host, port = "127.0.0.1", zk.members[0].client_port
    with Sentinel(zk.connect_string, "bench-reader") as reader:
        trace = _FollowerTrace.of(reader.session.zk)
        heard: dict[tuple[str, str], int] = {}
        dequeued: dict[tuple[str, str], int] = {}  # the worker's last dequeue before each

        def listener(event: object) -> None:
            now = _now()
            if isinstance(event, InstancesChanged):
                for endpoint in event.added:
                    heard.setdefault(("register", endpoint.label), now)
                    dequeued.setdefault(("register", endpoint.label), trace.dequeued)
                for endpoint in event.removed:
                    heard.setdefault(("deregister", endpoint.label), now)
                    dequeued.setdefault(("deregister", endpoint.label), trace.dequeued)

        reader.get_service("db", "seed")
        reader.listen("db", listener)
        service_path = f"{reader.session.namespace}/services/db"
        raw = _raw_watcher(host, port, service_path)
        cpu_before = _threads_cpu()
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.departure",
                "--writer",
                zk.connect_string,
                "--changes",
                str(count),
                "--pace",
                str(pace),
                *(["--unwatch"] if unwatch else []),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        deadline = time.monotonic() + 5
        while len(heard) < 2 * count and time.monotonic() < deadline:
            time.sleep(0.05)
        raw_seen = _raw_events(raw)
        cpu_after = _threads_cpu()
    busy = {tid: cpu_after[tid] - cpu_before.get(tid, 0) for tid in cpu_after}
    cpu.append(
        {
            "total_ms": sum(busy.values()),
            "busiest_thread_ms": max(busy.values(), default=0),
            **{f"{name}_ms": busy.get(tid, 0) for name, tid in trace.threads.items()},
        }
    )
    changes = []
    for line in run.stdout.splitlines():
        write = json.loads(line)
        key = (write["op"], write["label"])
        node = f"/services/db/p0:{write['label']}"
        stages = {s: write[s] for s in ("call", "sent", "reply", "returned") if s in write}
        events = trace.stages.get(node, [])
        episode = 0 if write["op"] == "register" else 1
        if len(events) > episode:
            stages.update(events[episode])
        if key in raw_seen:
            stages["raw watcher"] = raw_seen[key]
        if key in heard:
            stages["listener"] = heard[key]
        if dequeued.get(key):
            stages["dequeued"] = dequeued[key]
        op = UNWATCHED if write.get("unwatched") else write["op"]
        changes.append({"op": op, "stages": stages})
    return changes


def curator_side(java: list[str], zk: LocalZooKeeper, count: int, pace: float) -> list[dict]:
    """Every change's stages for Curator: its call, the raw watcher, its listener."""
    raw = _raw_watcher("127.0.0.1", zk.members[0].client_port, "/curator-bench/prop")
    moved = curator(
        java, zk.connect_string, "propagation", str(count), str(round(pace * 1000)), "trace"
    )
    raw_seen = _raw_events(raw)
    changes = []
    for op in ("register", "deregister"):
        for i, (start, delay) in enumerate(
            zip(moved[f"{op}_start_ns"], moved[f"{op}_ms"], strict=True)
        ):
            stages = {"call": start}
            if (op, f"new-{i}") in raw_seen:
                stages["raw watcher"] = raw_seen[(op, f"new-{i}")]
            if moved[f"{op}_event_ns"][i]:
                stages["watcher"] = moved[f"{op}_event_ns"][i]
            if delay is not None:
                stages["listener"] = start + round(delay * 1e6)
            changes.append({"op": op, "stages": stages})
    return changes


def table(
    side: str, stages: dict[str, str | None], changes: list[dict], op: str
) -> tuple[list, dict]:
    """Rows of one side and kind: each stage after ``call`` (p50, p99) and after the stage
    its step is taken from (p50), over the changes that passed every stage, in the order the
    stages are passed (by their median time after the call)."""
    whole = [
        c["stages"] for c in changes if c["op"] == op and all(s in c["stages"] for s in stages)
    ]
    if not whole:
        return [], {}
    order = sorted(
        stages, key=lambda stage: percentiles([s[stage] - s["call"] for s in whole])["p50"]
    )
    rows, figures = [], {}
    for stage in order:
        since_call = percentiles([(s[stage] - s["call"]) / 1e6 for s in whole])
        start = stages[stage]
        step = percentiles([(s[stage] - s[start]) / 1e6 for s in whole]) if start else None
        figures[stage] = {"since_call": since_call, "step": step, "from": start}
        rows.append(
            [
                side,
                op,
                stage,
                f"{since_call['p50']:.3f}",
                f"{since_call['p99']:.3f}",
                f"{step['p50']:.3f} (from {start})" if step else "",
                len(whole),
            ]
        )
    return rows, figures


# The follower's spans printed after the table, p50 over every change (not a difference of
# two p50s): to the listener from the raw watcher's event and from the connection thread's
# wake-up for it, and to the new snapshot stored (``swap``: what lookups see from then on).
SPANS = (("raw watcher", "listener"), ("woke", "listener"), ("woke", "swap"))


def spans(ours: list[dict], theirs: list[dict]) -> list[list[object]]:
    """Rows: per side and kind of change, the p50 over its changes of each span in ``SPANS``
    it passed (µs), and how many changes passed it."""
    rows = []
    for op in ("deregister", UNWATCHED, "register"):
        for side, changes in (("Sentinel", ours), ("Curator", theirs)):
            for start, end in SPANS:
                values = [
                    (c["stages"][end] - c["stages"][start]) / 1e3
                    for c in changes
                    if c["op"] == op and start in c["stages"] and end in c["stages"]
                ]
                if values:
                    p50 = percentiles(values)["p50"]
                    rows.append([side, op, f"{start} -> {end}", f"{p50:.0f}", len(values)])
    return rows


def print_spans(paths: list[str]) -> None:
    """The spans of runs already written (``benchmarks/results/departure.json`` copies)."""
    for path in paths:
        saved = json.loads(Path(path).read_text())
        print(f"\n{path}")
        print(
            format_table(
                spans(saved["sentinel"], saved["curator"]),
                headers=("side", "change", "span", "p50 (µs)", "n"),
            )
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--pace", type=float, default=PACE)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument(
        "--unwatch",
        action="store_true",
        help="every other deregistration with the writer's own watch on its node removed "
        "first (a row of its own)",
    )
    parser.add_argument(
        "--spans",
        nargs="+",
        metavar="JSON",
        help="print the follower's spans of runs already written (departure.json copies)",
    )
    parser.add_argument("--writer", metavar="HOSTS", help=argparse.SUPPRESS)
    parser.add_argument(
        "--watch", nargs=3, metavar=("HOST", "PORT", "PATH"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.writer:
        writer(args.writer, args.changes, args.pace, args.unwatch)
        return
    if args.watch:
        watcher(args.watch[0], int(args.watch[1]), args.watch[2])
        return
    if args.spans:
        print_spans(args.spans)
        return
    ours: list[dict] = []
    theirs: list[dict] = []
    cpu: list[dict] = []
    with (
        tempfile.TemporaryDirectory() as build,
        LocalZooKeeper() as zk,
        Sentinel(zk.connect_string, "bench-setup") as setup,
    ):
        java, why_not = curator_classpath(Path(build))
        if java is None:
            print(f"Curator skipped: {why_not}", file=sys.stderr)
        for number in range(args.rounds):
            print(f"  round {number + 1}/{args.rounds} ...", file=sys.stderr, flush=True)
            prepare(setup, args.changes)
            ours += sentinel_side(zk, args.changes, args.pace, cpu, args.unwatch)
            if java is not None:
                theirs += curator_side(java, zk, args.changes, args.pace)
    rows, figures = [], {}
    for op in ("deregister", UNWATCHED, "register"):
        for side, order, changes in (
            ("Sentinel", SENTINEL_STAGES, ours),
            ("Curator", CURATOR_STAGES, theirs),
        ):
            if not changes:
                continue
            stage_rows, stage_figures = table(side, order, changes, op)
            rows += stage_rows
            figures[f"{side} {op}"] = stage_figures
    report(
        "departure",
        f"A change stage by stage on CLOCK_MONOTONIC ({args.rounds} rounds x {args.changes} "
        f"changes of each kind, {args.pace * 1000:g} ms apart; ms)",
        ["side", "change", "stage", "after the call p50", "p99", "step p50", "n"],
        rows,
        {"figures": figures, "sentinel": ours, "curator": theirs, "follower_cpu": cpu},
    )
    print(format_table(spans(ours, theirs), headers=("side", "change", "span", "p50 (µs)", "n")))
    for number, used in enumerate(cpu, 1):
        print(
            f"round {number}: the follower's process used {used['total_ms']:.0f} ms of CPU "
            f"for {2 * args.changes} changes and {2 * WARM_UP} warm-up ones: its connection "
            f"thread {used.get('connection_ms', 0):.1f} ms, the cache's worker "
            f"{used.get('worker_ms', 0):.1f} ms, its busiest thread "
            f"{used['busiest_thread_ms']:.1f} ms"
        )


if __name__ == "__main__":
    main()
