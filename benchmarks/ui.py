"""The dashboard at size: ``python -m benchmarks.ui``.

A fresh ZooKeeper holds ``--services`` services and ``--instances`` instances (default 1,000 and
10,000: ephemeral nodes written in multi transactions, as ``benchmarks.ladder`` fills a rung),
and ``sentinel ui`` runs against it in a process of its own. Measured:

- the services page's render: the server's time (a ``GET`` from this process, the whole body
  read, after one warm-up) and the browser's (headless Chromium: the navigation's
  ``loadEventEnd``, every row drawn); target under 1 s;
- a change reaching an open page: an instance's status written to ZooKeeper, until the page's
  live version changes (the browser's clock and this process's are the same clock: a
  MutationObserver in the page stamps ``Date.now()``); target under 1 s;
- the server process's CPU per change (``utime + stime`` of ``/proc/<pid>/stat``) with 1 and
  with ``--pages`` open pages, each its own live stream: ``--changes`` changes ``--spacing``
  seconds apart, less the CPU of an idle stretch as long with the same pages open.

A browser opens at most 6 connections to one host, and every open page holds one: the pages
are spread over several origins, 5 pages each (the 6th connection for the new content a page
fetches on a change) (names under ``localhost``, which Chromium
resolves to loopback itself, each given to ``sentinel ui --allow-host``), so that each page's
stream is really open (each page says so: ``data-live-state="open"``), and at the end every
page shows the same, last, version.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TypeVar

from kazoo.client import KazooClient

from benchmarks.common import percentiles, report
from benchmarks.ladder import commit_all, instance_value, spread
from sentinel import Sentinel
from sentinel.testing.browser import headless_chromium, unavailable
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper, free_ports

T = TypeVar("T")
TARGET_S = 1.0
# Chromium opens 6 connections to a host: 5 pages' streams, and one for the new content each
# page fetches on a change (with 6 streams open, those fetches would wait for ever).
PAGES_PER_ORIGIN = 5
SENTINEL = os.path.join(os.path.dirname(sys.executable), "sentinel")
# Stamps the time the page's live version last changed (the page's own clock is Date.now()).
WATCH_VERSION = """
const target = document.querySelector(arguments[0]);
window.__versionChanged = null;
new MutationObserver(() => { window.__versionChanged = Date.now(); })
    .observe(target, {childList: true, characterData: true, subtree: true, attributes: true});
"""
LIVE_VERSION = "#version"
VERSION_SHOWN = "return document.querySelector(arguments[0]).textContent"
NAVIGATION = """
const [n] = performance.getEntriesByType("navigation");
return {ttfb: n.responseStart - n.requestStart, dom: n.domContentLoadedEventEnd,
        load: n.loadEventEnd, bytes: n.transferSize};
"""


def populate(zk: LocalZooKeeper, owner: KazooClient, services: int, instances: int) -> float:
    """``services`` services with ``instances`` spread over them; the seconds it took."""
    started = time.perf_counter()
    counts = spread(instances, services)
    with Sentinel(zk.connect_string, "ui-bench-writer", announce=False) as writer:
        for s in range(services):
            writer.ensure_service(f"s{s}")
    commit_all(owner, [instance_value(f"s{s}", i) for s, n in enumerate(counts) for i in range(n)])
    return time.perf_counter() - started


def cpu_seconds(pid: int) -> float:
    """The process's CPU so far, user and system (``/proc/<pid>/stat``'s fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Dashboard:
    """A ``sentinel ui`` process: its pid, base URL and Prometheus metrics' URL."""

    pid: int
    base: str
    metrics: str

    def viewers(self) -> int:
        """Live streams open now (its ``sentinel_ui_viewers`` gauge)."""
        return int(self._metric(r"sentinel_ui_viewers"))

    def renders(self) -> int:
        """Services pages rendered so far, whole or their new content
        (``sentinel_ui_page_views_total{page="services"}``)."""
        return int(self._metric(r'sentinel_ui_page_views_total\{page="services"\}'))

    def _metric(self, pattern: str) -> float:
        with urllib.request.urlopen(self.metrics, timeout=10) as response:
            text = response.read().decode()
        found = re.search(rf"^{pattern} (\S+)$", text, re.M)
        return float(found[1]) if found else 0.0


@contextmanager
def dashboard(zk: LocalZooKeeper, pages: int, instances: int) -> Iterator[Dashboard]:
    """``sentinel ui`` on a free port, answering to the origins of ``pages`` pages, once its
    services page counts every one of ``instances``."""
    port, metrics_port = free_ports(2)
    base = f"http://127.0.0.1:{port}"
    command = [SENTINEL, "ui", "--port", str(port), "--metrics-port", str(metrics_port)]
    command += ["--zk", zk.connect_string, "--max-streams", str(pages + 10)]
    for origin in origins(base, pages):
        command += ["--allow-host", origin.split("//")[1].rsplit(":", 1)[0]]
    with subprocess.Popen(command, stdout=subprocess.DEVNULL) as server:
        try:
            if wait_until(lambda: counted(base) == instances, timeout=300, interval=0.5) is None:
                raise RuntimeError(f"sentinel ui at {base} did not show {instances} instances")
            yield Dashboard(server.pid, base, f"http://127.0.0.1:{metrics_port}/metrics")
        finally:
            server.terminate()
            server.wait(timeout=30)


def counted(base: str) -> int | None:
    """The instances the services page counts (None: no answer yet)."""
    try:
        with urllib.request.urlopen(f"{base}/services", timeout=30) as response:
            page = response.read().decode()
    except OSError:
        return None
    return sum(int(n) for n in re.findall(r'data-instances="(\d+)"', page))


def server_render(base: str, rounds: int) -> dict:
    """Seconds per ``GET /`` (the services page), body read, after one warm-up; its size."""
    timings, size = [], 0
    for _ in range(rounds + 1):
        started = time.perf_counter()
        with urllib.request.urlopen(f"{base}/services", timeout=30) as response:
            size = len(response.read())
        timings.append(time.perf_counter() - started)
    return {**percentiles(timings[1:]), "bytes": size}


def browser_render(driver, base: str, rounds: int) -> dict:
    """The services page in the browser, per load: ``loadEventEnd`` (ms since the navigation
    began), time to the first byte and the bytes transferred; after one warm-up."""
    loads = []
    for _ in range(rounds + 1):
        driver.get("about:blank")  # a new navigation each time, not a restore from the cache
        driver.get(f"{base}/")
        loads.append(driver.execute_script(NAVIGATION))
    loads = loads[1:]
    return {
        **percentiles([load["load"] / 1000 for load in loads]),
        "ttfb_p50_s": statistics.median(load["ttfb"] for load in loads) / 1000,
        "dom_content_loaded_p50_s": statistics.median(load["dom"] for load in loads) / 1000,
        "bytes": loads[-1]["bytes"],
    }


def change_to_page(driver, owner: KazooClient, services: range) -> list[float]:
    """Seconds from a status written to ZooKeeper to the open page's live version changing,
    per change (each drains instance 0 of one of ``services``)."""
    seen = []
    for service in services:
        driver.execute_script(WATCH_VERSION, LIVE_VERSION)
        written = time.time()
        drain(owner, service)
        if wait_until(lambda: driver.execute_script("return window.__versionChanged")) is None:
            raise RuntimeError("the open page's live version did not change within 10 s")
        seen.append(driver.execute_script("return window.__versionChanged") / 1000 - written)
    return seen


def drain(owner: KazooClient, service: int) -> None:
    """Set instance 0 of service ``s<service>`` draining, in ZooKeeper."""
    owner.set(*instance_value(f"s{service}", 0, status="draining"))


def cpu_per_change(
    server: Dashboard, owner: KazooClient, services: range, spacing: float, pages: list[str], driver
) -> dict:
    """The server's CPU seconds per change: one drain per service of ``services``, ``spacing``
    s apart, until every one of ``pages`` (window handles) shows the last (or ``spacing`` s
    after the last, without pages), less the idle CPU of that stretch (the rate of an idle
    stretch as long just before)."""
    idle_from, idle_cpu = time.monotonic(), cpu_seconds(server.pid)
    time.sleep(len(services) * spacing)
    idle_rate = (cpu_seconds(server.pid) - idle_cpu) / (time.monotonic() - idle_from)
    first = min(shown_versions(driver, pages), default=0)
    renders = server.renders()
    busy_from, busy_cpu = time.monotonic(), cpu_seconds(server.pid)
    for service in services:
        drain(owner, service)
        time.sleep(spacing)
    if pages:
        # (each look at 50 windows takes seconds on a busy machine: a long bound)
        heard = wait_until(
            lambda: min(shown_versions(driver, pages)) >= first + len(services),
            timeout=900,
            interval=1.0,
        )
        if heard is None:
            shown = shown_versions(driver, pages)
            raise RuntimeError(f"the open pages show {shown}, not all {first + len(services)}")
    took = time.monotonic() - busy_from
    busy = cpu_seconds(server.pid) - busy_cpu
    return {
        "pages": len(pages),
        "viewers": server.viewers(),
        # a page reads its new content once per change, or once for several changes heard
        # while it was reading (a busy server, or a busy browser)
        "renders_per_change": (server.renders() - renders) / len(services),
        "cpu_per_change_s": (busy - idle_rate * took) / len(services),
        "idle_cpu_per_s": idle_rate,
        "busy_cpu_s": busy,
        "busy_s": took,
    }


def origins(base: str, pages: int) -> list[str]:
    """Base URLs of as many origins as ``pages`` need, 6 pages each: names under
    ``localhost``, which Chromium resolves to loopback itself (RFC 6761), the dashboard
    started with ``--allow-host`` for each."""
    port = base.rsplit(":", 1)[1]
    return [f"http://o{k}.localhost:{port}" for k in range(-(-pages // PAGES_PER_ORIGIN))]


def open_pages(driver, urls: list[str], pages: int) -> list[str]:
    """Open windows (each visible, as a tab behind another would not be: a hidden page
    closes its stream) until ``pages`` show the services page with their stream open; the
    window handles."""
    while len(driver.window_handles) < pages:
        url = urls[len(driver.window_handles) // PAGES_PER_ORIGIN]
        driver.switch_to.new_window("window")
        driver.get(f"{url}/services")
        if wait_until(lambda: live_state(driver) == "open", timeout=30) is None:
            raise RuntimeError(f"page {len(driver.window_handles)}'s live stream did not open")
    return list(driver.window_handles)


def live_state(driver) -> str | None:
    return driver.execute_script("return document.body.dataset.liveState")


def shown_versions(driver, handles: list[str]) -> list[int]:
    """The live version each of the windows ``handles`` shows."""
    shown = []
    for handle in handles:
        driver.switch_to.window(handle)
        shown.append(int(driver.execute_script(VERSION_SHOWN, LIVE_VERSION)))
    return shown


def progress(what: str, figures: T) -> T:
    """``figures``, shown on stderr as they come (a run takes minutes)."""
    print(f"{what}: {json.dumps(figures, default=str)[:400]}", file=sys.stderr, flush=True)
    return figures


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def verdict(seconds: float) -> str:
    return "met" if seconds < TARGET_S else "MISSED"


def main(argv: list[str] | None = None) -> None:
    """Fill the registry, measure, print the table and write ``benchmarks/results/ui.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=10, help="page loads measured")
    parser.add_argument("--changes", type=int, default=10, help="per measurement")
    parser.add_argument("--spacing", type=float, default=1.0, help="seconds between changes")
    parser.add_argument("--pages", type=int, default=50, help="open pages, each with its stream")
    args = parser.parse_args(argv)
    why_not = unavailable()
    if why_not:
        sys.exit(f"benchmarks.ui needs a browser: {why_not}")
    if args.services < 4 * args.changes:
        sys.exit("--services must be at least 4 x --changes (each change drains a service)")
    batches = [range(k * args.changes, (k + 1) * args.changes) for k in range(4)]
    with ExitStack() as stack:
        zk = stack.enter_context(LocalZooKeeper(jvm_options=("-Xmx2g",)))
        owner = KazooClient(zk.connect_string, timeout=30)
        owner.start()
        stack.callback(owner.close)
        stack.callback(owner.stop)
        populate_s = populate(zk, owner, args.services, args.instances)
        print(f"registered in {populate_s:.1f} s", file=sys.stderr, flush=True)
        server = stack.enter_context(dashboard(zk, args.pages, args.instances))
        driver = stack.enter_context(headless_chromium())
        driver.set_page_load_timeout(120)  # a 1,000-row page, 50 of them open on 2 cores
        served = progress("server render", server_render(server.base, args.rounds))
        drawn = progress("browser render", browser_render(driver, server.base, args.rounds))
        reached = progress("change to page", change_to_page(driver, owner, batches[0]))
        driver.get("about:blank")
        cpu = [progress("cpu", cpu_per_change(server, owner, batches[1], args.spacing, [], driver))]
        urls = origins(server.base, args.pages)
        driver.get(f"{urls[0]}/services")
        handles = open_pages(driver, urls, 1)
        cpu.append(
            progress(
                "cpu", cpu_per_change(server, owner, batches[2], args.spacing, handles, driver)
            )
        )
        handles = open_pages(driver, urls, args.pages)
        cpu.append(
            progress(
                "cpu", cpu_per_change(server, owner, batches[3], args.spacing, handles, driver)
            )
        )
    reach = percentiles(reached)
    rows = [
        (
            "services page, server (GET, body read)",
            ms(served["p50"]),
            ms(served["p95"]),
            verdict(served["p95"]),
        ),
        (
            "services page, browser (load event)",
            ms(drawn["p50"]),
            ms(drawn["p95"]),
            verdict(drawn["p95"]),
        ),
        (
            "a change reaching an open page",
            ms(reach["p50"]),
            ms(reach["max"]),
            verdict(reach["max"]),
        ),
    ]
    for figures in cpu:
        rows.append(
            (
                f"server CPU per change, {figures['pages']} open pages "
                f"({figures['viewers']} streams)",
                f"{figures['cpu_per_change_s'] * 1000:.1f}",
                f"({figures['renders_per_change']:.1f} renders; "
                f"idle {figures['idle_cpu_per_s'] * 1000:.0f} ms/s)",
                "",
            )
        )
    report(
        "ui",
        f"the dashboard with {args.services:,} services and {args.instances:,} instances "
        f"(target: under {TARGET_S:.0f} s)",
        ("what", "p50 ms", "p95 / max ms", "target"),
        rows,
        {
            "args": vars(args),
            "populate_s": populate_s,
            "server_render": served,
            "browser_render": drawn,
            "change_to_page": reach,
            "cpu": cpu,
        },
    )


if __name__ == "__main__":
    main()
