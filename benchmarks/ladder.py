"""The scale ladder, Sentinel beside Curator: ``python -m benchmarks.ladder``.

Each rung (``--rungs``, instances x services, default ``1000x10,10000x100,100000x100,
10000x10000``) gets a fresh ZooKeeper (heap ``--zk-heap``). A writer registers the instances
spread evenly over the services, as ephemeral nodes written in multi transactions of
``BATCH`` creates (a few in flight at once), and a twin of the same shape in Curator's format
(``/curator-bench/s<i>/<id>``). Then, in a fresh interpreter, a Sentinel client with a
snapshot file prefetches every service (one ``prefetch`` call naming them all); measured: cold
start (client start to every instance cached), RSS growth per instance, the snapshot file's
size, and for ``--changes`` registrations and as many instance updates made by the parent, the
time until the client's listener hears each and the client's CPU over a window after it
(``--window`` s: the cache's work and the snapshot's rewrite, less the CPU of an idle window),
and the CPU of one whole (first) write of the snapshot file, timed on its own. Curator
(``CuratorBench.java``'s ``ladder``: a ``ServiceCache`` per service, one JVM) gives its cold
start, heap used after a GC and registration propagation, unless its JVM (``--curator-heap``)
cannot hold the rung. From the server: the largest ``getChildren`` reply (jute-encoded, against
``jute.maxbuffer``'s default), ``zk_approximate_data_size``, ``zk_znode_count`` and its heap
used after a GC.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from kazoo.client import KazooClient

from benchmarks.common import report
from benchmarks.compare import curator_classpath
from sentinel import Sentinel
from sentinel.registry.layout import DEFAULT_NAMESPACE, instance_path
from sentinel.registry.records import InstanceRecord
from sentinel.testing.zookeeper import LocalZooKeeper, four_letter_word

# Creates per multi transaction: about 300 bytes each, well under jute.maxbuffer per request.
BATCH = 500
IN_FLIGHT = 8
# ZooKeeper 3.8's default jute.maxbuffer (0xfffff): the largest packet a Java peer accepts.
JUTE_MAXBUFFER = 0xFFFFF
CURATOR_BASE = "/curator-bench"
# Seconds of client CPU counted after each change (``--window``): the snapshot file is
# rewritten at most once a second (CacheConfig.snapshot_interval), so the window holds one
# rewrite, whole while a rewrite takes less CPU than the window (not at 100,000 instances).
WINDOW = 1.5

PROBE = textwrap.dedent("""
    import gc, json, os, sys, threading, time
    from sentinel import Sentinel
    from sentinel.cache.config import CacheConfig
    hosts, services, total, snapshot = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    window = float(sys.argv[5])
    tick = os.sysconf("SC_CLK_TCK")
    def rss():
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))
    def snapshot_cpu():
        # the snapshot writer thread's CPU seconds (utime + stime of its task), in ticks
        for thread in threading.enumerate():
            if thread.name == "sentinel-snapshot":
                fields = open(f"/proc/self/task/{thread.native_id}/stat").read().rsplit(")", 1)[1]
                return sum(map(int, fields.split()[11:13])) / tick
        return 0.0
    heard, times = threading.Event(), []
    def on_change(event):
        times.append(time.monotonic_ns())
        heard.set()
    before = rss()
    started = time.perf_counter()
    client = Sentinel(hosts, "ladder", announce=False, cache=CacheConfig(snapshot_path=snapshot))
    client.start()
    client.prefetch(*[f"s{s}" for s in range(services)])
    held = sum(len(client.eligible_instances(f"s{s}")) for s in range(services))
    cold = time.perf_counter() - started
    gc.collect()
    after = rss()
    # one rewrite of the snapshot file, timed in this thread: what each change costs the
    # writer thread for a first write (forget() drops every kept encoding: the whole cache)
    writer = client.session.snapshot_writer
    writer.forget()
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    writer.write_now()
    rewrite = {"rewrite_cpu_s": time.thread_time() - cpu0, "rewrite_s": time.perf_counter() - wall0,
               "rewrite_bytes": os.path.getsize(snapshot)}
    client.listen(None, on_change)
    # the idle window comes after the load's own snapshot writes (two windows: enough while
    # a rewrite takes less CPU than a window; idle_cpu_s shows when it did not)
    time.sleep(2 * window)
    idle0 = time.process_time(); time.sleep(window); idle = time.process_time() - idle0
    print(json.dumps({"cold_s": cold, "held": held, "rss_before_kb": before,
                      "rss_after_kb": after, "idle_cpu_s": idle, **rewrite}), flush=True)
    for line in sys.stdin:
        heard.clear(); times.clear()
        cpu0, writer0 = time.process_time(), snapshot_cpu()
        print("go", flush=True)
        heard.wait(10)
        heard_ns = times[0] if times else None
        time.sleep(window)
        print(json.dumps({"heard_ns": heard_ns, "cpu_s": time.process_time() - cpu0,
                          "snapshot_cpu_s": snapshot_cpu() - writer0,
                          "snapshot_bytes": os.path.getsize(snapshot)}), flush=True)
    client.close()
""")


def spread(instances: int, services: int) -> list[int]:
    """How many instances each service gets: ``instances`` as evenly as possible."""
    return [instances // services + (s < instances % services) for s in range(services)]


def commit_all(zk: KazooClient, operations: list[tuple[str, bytes]]) -> None:
    """Create ``operations`` (path, value) as ephemeral nodes in multi transactions of
    ``BATCH``, ``IN_FLIGHT`` at once."""
    pending = []
    for start in range(0, len(operations), BATCH):
        transaction = zk.transaction()
        for path, value in operations[start : start + BATCH]:
            transaction.create(path, value, ephemeral=True)
        pending.append(transaction.commit_async())
        if len(pending) >= IN_FLIGHT:
            _check(pending.pop(0).get())
    for result in pending:
        _check(result.get())


def _check(results: list) -> None:
    failed = [r for r in results if isinstance(r, Exception)]
    if failed:
        raise RuntimeError(f"a batch of creates failed: {failed[0]!r}")


def instance_value(
    service: str, i: int, weight: float = 1, status: str = "up"
) -> tuple[str, bytes]:
    """The node of Sentinel instance ``i`` of ``service``: path and value."""
    path = DEFAULT_NAMESPACE + instance_path(service, "p0", f"i{i}")
    address = f"10.{i // 62500}.{i // 250 % 250}.{i % 250}"
    record = InstanceRecord(service, "p0", f"i{i}", address, 8080, weight=weight, status=status)
    return path, record.to_bytes(path)


def curator_value(service: str, i: int) -> tuple[str, bytes]:
    """Curator's ``ServiceInstance`` JSON for instance ``i`` of ``service``: path and value.
    Its id has the length of the random UUID Curator gives an instance by default (36), so
    the twin's listings are as long as a real Curator registry's."""
    uuid = f"{i:08x}-0000-4000-8000-000000000000"
    document = {
        "name": service,
        "id": uuid,
        "address": f"10.{i // 62500}.{i // 250 % 250}.{i % 250}",
        "port": 8080,
        "sslPort": None,
        "payload": None,
        "registrationTimeUTC": 1_795_576_186_745,
        "serviceType": "DYNAMIC",
        "uriSpec": None,
    }
    return f"{CURATOR_BASE}/{service}/{uuid}", json.dumps(document).encode()


def populate(zk: LocalZooKeeper, owner: KazooClient, counts: list[int]) -> float:
    """Both registries, Sentinel's and Curator's twin; returns the seconds it took."""
    started = time.perf_counter()
    with Sentinel(zk.connect_string, "ladder-writer", announce=False) as writer:
        for s in range(len(counts)):
            writer.ensure_service(f"s{s}")
    for s in range(len(counts)):
        owner.ensure_path(f"{CURATOR_BASE}/s{s}")
    ours = [instance_value(f"s{s}", i) for s, n in enumerate(counts) for i in range(n)]
    commit_all(owner, ours)
    theirs = [curator_value(f"s{s}", i) for s, n in enumerate(counts) for i in range(n)]
    commit_all(owner, theirs)
    return time.perf_counter() - started


def listing_bytes(owner: KazooClient, path: str) -> int:
    """The jute size of a ``getChildren`` reply for ``path``: the reply header (xid, zxid,
    err: 16 bytes), the vector's length and each name with its length (4 + bytes)."""
    names = owner.get_children(path)
    return 16 + 4 + sum(4 + len(name.encode()) for name in names)


def server_figures(zk: LocalZooKeeper) -> dict:
    """``mntr``'s data size and node count, and the server's heap used after a full GC."""
    member = zk.members[0]
    mntr = dict(
        line.split("\t", 1)
        for line in four_letter_word("127.0.0.1", member.client_port, "mntr", 5).splitlines()
        if "\t" in line
    )
    subprocess.run(["jcmd", str(member.pid), "GC.run"], capture_output=True, check=False)
    info = subprocess.run(
        ["jcmd", str(member.pid), "GC.heap_info"], capture_output=True, text=True, check=False
    ).stdout
    # Serial GC: one line per generation, "... total NK, used NK ..."
    used_kb = sum(int(match) for match in re.findall(r"generation\s+total \d+K, used (\d+)K", info))
    return {
        "approximate_data_size": int(mntr.get("zk_approximate_data_size", 0)),
        "znode_count": int(mntr.get("zk_znode_count", 0)),
        "heap_info": info.strip(),
        "heap_used_kb": used_kb,
    }


def ours(
    zk: LocalZooKeeper, owner: KazooClient, counts: list[int], changes: int, window: float
) -> dict:
    """The Sentinel client's figures at this rung (see the module's docstring)."""
    with tempfile.TemporaryDirectory() as directory:
        snapshot = str(Path(directory) / "snapshot.json")
        with subprocess.Popen(
            [
                sys.executable,
                "-c",
                PROBE,
                zk.connect_string,
                str(len(counts)),
                str(sum(counts)),
                snapshot,
                str(window),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as probe:
            assert probe.stdin is not None and probe.stdout is not None
            loaded = json.loads(probe.stdout.readline())
            moves = []
            for i in range(2 * changes):
                probe.stdin.write("next\n")
                probe.stdin.flush()
                assert probe.stdout.readline().strip() == "go"
                begun = time.monotonic_ns()
                if i % 2 == 0:  # register one more
                    path, value = instance_value("s0", counts[0] + i)
                    owner.create(path, value, ephemeral=True)
                else:  # change one: its weight
                    owner.set(*instance_value("s0", i, weight=2 + i))
                moved = json.loads(probe.stdout.readline())
                moved["kind"] = "register" if i % 2 == 0 else "update"
                moved["ms"] = (moved["heard_ns"] - begun) / 1e6 if moved["heard_ns"] else None
                moves.append(moved)
            probe.stdin.close()
            probe.wait(timeout=600)  # its close writes the snapshot file once more
    return {**loaded, "changes": moves}


def theirs(java: list[str] | None, zk: LocalZooKeeper, counts: list[int], changes: int) -> dict:
    """Curator's figures at this rung, or why it could not run."""
    if java is None:
        return {"skipped": "no Curator peer"}
    run = subprocess.run(
        [*java, zk.connect_string, "ladder", str(len(counts)), str(sum(counts)), str(changes)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if run.returncode != 0:
        return {"skipped": run.stderr.strip()[-400:]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def rung(java: list[str] | None, instances: int, services: int, args) -> dict:
    counts = spread(instances, services)
    heap = (f"-Xmx{args.zk_heap}", "-Xms512m")
    with LocalZooKeeper(jvm_options=heap) as zk:
        owner = KazooClient(zk.connect_string, timeout=30)
        owner.start()
        try:
            populate_s = populate(zk, owner, counts)
            largest = listing_bytes(owner, f"{DEFAULT_NAMESPACE}/services/s0")
            largest_curator = listing_bytes(owner, f"{CURATOR_BASE}/s0")
            sentinel = ours(zk, owner, counts, args.changes, args.window)
            curator = theirs(java, zk, counts, args.changes)
            server = server_figures(zk)
        finally:
            owner.stop()
            owner.close()
    return {
        "instances": instances,
        "services": services,
        "populate_s": populate_s,
        "largest_listing_bytes": largest,
        "largest_curator_listing_bytes": largest_curator,
        "sentinel": sentinel,
        "curator": curator,
        "server": server,
    }


def median(values: list[float | None]) -> float | None:
    """The median of the values that are not None (None: a change never heard)."""
    present = sorted(v for v in values if v is not None)
    return present[len(present) // 2] if present else None


def ms(value: float | None) -> str:
    return "not heard" if value is None else f"{value:.1f}"


def row(result: dict) -> tuple:
    ours_ = result["sentinel"]
    n = result["instances"]
    growth_kb = ours_["rss_after_kb"] - ours_["rss_before_kb"]
    regs = [m["ms"] for m in ours_["changes"] if m["kind"] == "register"]
    upds = [m["ms"] for m in ours_["changes"] if m["kind"] == "update"]
    cpu = median([m["cpu_s"] - ours_["idle_cpu_s"] for m in ours_["changes"]]) or 0.0
    writer_cpu = median([m["snapshot_cpu_s"] for m in ours_["changes"]]) or 0.0
    snapshot = max((m["snapshot_bytes"] for m in ours_["changes"]), default=0)
    rewrite = f"{ours_['rewrite_cpu_s'] * 1000:.0f}"
    held = "" if ours_["held"] >= n else f" ({ours_['held']:,} held)"
    cur = result["curator"]
    if "skipped" in cur:
        curator_cells = ("did not run", "-", "-")
    elif "gave_up_after_s" in cur:
        curator_cells = (f"{cur['held']:,} held after {cur['gave_up_after_s']:.0f} s", "-", "-")
    else:
        curator_cells = (
            f"{cur['cold_s']:.2f}",
            f"{cur['heap_used_mb']:.0f} ({cur['heap_used_mb'] * 1048576 / n:,.0f})",
            ms(median(cur["register_ms"])),
        )
    return (
        f"{n:,} x {result['services']:,}",
        f"{ours_['cold_s']:.2f}{held}",
        f"{growth_kb / 1024:.0f} ({growth_kb * 1024 / n:,.0f})",
        f"{ms(median(regs))} / {ms(median(upds))}",
        f"{max(cpu, 0) * 1000:.0f} ({writer_cpu * 1000:.0f})",
        rewrite,
        f"{snapshot / 1048576:.1f}",
        f"{result['largest_listing_bytes'] / 1024:.1f}",
        f"{result['largest_curator_listing_bytes'] / 1024:.1f}",
        f"{result['server']['approximate_data_size'] / 1048576:.1f}",
        f"{result['server']['heap_used_kb'] / 1024:.0f}",
        *curator_cells,
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rungs", default="1000x10,10000x100,100000x100,10000x10000,30000x1")
    parser.add_argument("--changes", type=int, default=5, help="of each kind per rung")
    parser.add_argument("--window", type=float, default=WINDOW, help="seconds of CPU per change")
    parser.add_argument("--zk-heap", default="3g")
    parser.add_argument("--curator-heap", default="2g")
    args = parser.parse_args(argv)
    rungs = [tuple(map(int, r.split("x"))) for r in args.rungs.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as build:
        java, why_not = curator_classpath(Path(build))
        if java is None:
            print(f"Curator column skipped: {why_not}", file=sys.stderr)
        else:
            java = [java[0], f"-Xmx{args.curator_heap}", *java[1:]]
        for instances, services in rungs:
            print(f"rung {instances:,} x {services:,}", file=sys.stderr, flush=True)
            results.append(rung(java, instances, services, args))
    report(
        "ladder",
        "the scale ladder: Sentinel (one client, every service prefetched) beside Curator",
        (
            "instances x services",
            "cold s",
            "RSS growth MiB (B/inst)",
            "register / update ms",
            "CPU ms/change (snapshot writer's)",
            "one snapshot rewrite CPU ms",
            "snapshot file MiB",
            "largest listing KiB",
            "Curator's largest listing KiB",
            "ZK data MiB",
            "ZK heap MiB",
            "Curator cold s",
            "Curator heap MiB (B/inst)",
            "Curator register ms",
        ),
        [row(r) for r in results],
        {"rungs": results, "args": vars(args), "jute_maxbuffer": JUTE_MAXBUFFER},
    )


if __name__ == "__main__":
    main()
