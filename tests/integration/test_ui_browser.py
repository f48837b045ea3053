"""The dashboard (``sentinel ui``) in a real browser, against a real ZooKeeper.

One headless Chromium for the module (Debian's chromium-driver through Selenium, fully
offline: :mod:`sentinel.testing.browser`), its one tab reused by every test, and one
``sentinel ui`` process (``--allow-actions``) on a namespace of the module's own, in which a
publisher registers ``orders`` (two instances), ``payments`` (one instance whose readiness
check fails) and a follower client reads both (the topology's edges).

With ``SENTINEL_WRITE_SCREENSHOTS=1`` the layout test writes the pages' screenshots to
docs/img/dashboard-*.png (docs/dashboard.md shows them); without it nothing is written, so a
run of the suite leaves the tree as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sentinel import Sentinel
from sentinel.auth.acl import owner_acl
from sentinel.cli.ui import build
from sentinel.health import HealthCheck
from sentinel.testing.browser import headless_chromium, screenshot, unavailable
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper
from sentinel.ui.server import listen, url
from tests.conftest import sentinel_in_process
from tests.integration.test_dashboard import dashboard

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WRITE_SCREENSHOTS = os.environ.get("SENTINEL_WRITE_SCREENSHOTS") == "1"
PHONE = (390, 844)  # CSS pixels of a phone held upright
DESKTOP = (1280, 900)
# Every page of the navigation bar, and a service's.
# The screenshots docs/dashboard.md shows: (page, window size) -> file in docs/img.
SCREENSHOTS_SHOWN = {
    ("services", DESKTOP): "dashboard-services.png",
    ("service", DESKTOP): "dashboard-service.png",
    ("topology", DESKTOP): "dashboard-topology.png",
    ("services", PHONE): "dashboard-services-phone.png",
}
# Why the page shown was not restored from the back/forward cache (Chromium's own words).
NOT_RESTORED = (
    "return JSON.stringify(performance.getEntriesByType('navigation')[0].notRestoredReasons)"
)
# What Tab may stop at, in the page's order.
FOCUSABLE = """return [...document.querySelectorAll(
    'a[href], button, input:not([type=hidden]), select, textarea, [tabindex]')]
  .filter(e => e.tabIndex >= 0 && !e.disabled && e.getClientRects().length > 0);"""
# The focused element, and whether it shows that it is (an outline or a shadow).
FOCUSED = """const focused = document.activeElement, style = getComputedStyle(focused);
return [focused, (style.outlineStyle !== "none" && parseFloat(style.outlineWidth) > 0)
    || style.boxShadow !== "none"];"""
FORGED_FORM = """<!doctype html><html><body>
<form method="post" action="{action}"><input type="hidden" name="csrf" value="guessed"></form>
<script>document.forms[0].submit();</script></body></html>"""
# Put in the page before its own script: counts the changes its stream hears, and holds each
# read of its new content (fetched whole, so the server's answer is what it was then) until
# the test releases it.
HOLD = """
window.sentinelTest = {heard: 0, reads: 0, held: []};
const realFetch = window.fetch;
window.fetch = (...args) => realFetch(...args).then(response => response.text().then(text => {
  window.sentinelTest.reads += 1;
  return new Promise(resolve => window.sentinelTest.held.push(
    () => resolve(new Response(text, {status: response.status}))));
}));
const RealEventSource = window.EventSource;
window.EventSource = function (url) {
  const stream = new RealEventSource(url);
  stream.addEventListener("change", () => { window.sentinelTest.heard += 1; });
  return stream;
};
window.EventSource.CLOSED = RealEventSource.CLOSED;
"""
HELD = "return window.sentinelTest.held.length"
RELEASE = "window.sentinelTest.held.splice(0).forEach(release => release())"
PAGES = {
    "services": "/services",
    "service": "/services/payments",
    "topology": "/topology",
    "regions": "/regions",
    "rotations": "/rotations",
    "shards": "/shards",
    "agents": "/agents",
    "doctor": "/doctor",
}


@dataclass
class World:
    """What the module's namespace holds."""

    namespace: str
    publisher: Sentinel
    follower: Sentinel
    orders: list  # the two Registrations of orders
    ui: Sentinel  # the dashboard's client
    url: str  # the dashboard's base URL, without the trailing slash


@pytest.fixture(scope="module")
def browser() -> Iterator:
    why_not = unavailable()
    if why_not:
        pytest.skip(f"no browser for the dashboard's tests: {why_not}")
    with headless_chromium(*DESKTOP) as driver:
        yield driver


def payments_ready() -> bool:
    """payments' readiness check: it fails (named, as the pages show a check)."""
    return False


@pytest.fixture(scope="module")
def world(zookeeper: LocalZooKeeper, browser) -> Iterator[World]:
    """The module's namespace and its dashboard (drain and undrain offered)."""
    namespace = f"/test-ui-browser-{uuid.uuid4().hex[:12]}"
    hosts = zookeeper.connect_string
    publisher = Sentinel(hosts, "publisher", namespace, announce=False).start()
    orders = [
        publisher.register("orders", "main", "10.2.0.1", 8080 + k, label=f"orders-{k}")
        for k in (1, 2)
    ]
    failing = HealthCheck.call(payments_ready, interval=0.1, timeout=0.1)
    publisher.register("payments", "main", "10.3.0.1", 9090, label="payments-1", health=failing)
    follower = Sentinel(hosts, "web-1", namespace, app="web").start()
    follower.prefetch("orders")
    follower.prefetch("payments")
    ui = Sentinel(hosts, "ui", namespace, announce=False).start()
    try:
        with dashboard(ui, allow_actions=True) as url:
            yield World(namespace, publisher, follower, orders, ui, url)
            leave(browser)
    finally:
        for client in (ui, follower, publisher):
            client.close()


def leave(driver) -> None:
    """Leave the dashboard's pages, whose open streams would hold its server's stop for
    uvicorn's grace period."""
    driver.get("about:blank")


def visit(driver, url: str) -> None:
    """Load ``url`` in the tab and wait for its live stream to open (a load that never ends
    fails after PAGE_LOAD_TIMEOUT)."""
    driver.get(url)
    wait_for(driver, lambda: live_state(driver) == "open", f"{url}'s live stream to open")


def wait_for(driver, condition, what: str, timeout: float = 5.0) -> float:
    """Poll ``condition`` (bounded); the seconds it took, or the test fails naming ``what``."""
    took = wait_until(condition, timeout=timeout, interval=0.01)
    assert took is not None, f"waited {timeout} s for {what}; the page: {page_text(driver)}"
    return took


def live_state(driver) -> str | None:
    return driver.execute_script("return document.body.dataset.liveState")


def page_text(driver) -> str:
    return driver.execute_script("return document.body.innerText")[:2000]


def dataset(driver, selector: str, name: str) -> str | None:
    """``data-NAME`` of the element ``selector`` finds now (None: no such element)."""
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e && e.dataset[arguments[1]];",
        selector,
        name,
    )


def instance_row(label: str) -> str:
    return f"#instance-main-{label}"


def published_status(world: World, service: str, label: str) -> str:
    """The status ZooKeeper holds for ``service``'s instance ``label`` (read past any cache)."""
    listing = world.publisher.read_service(service)
    (found,) = [i for i in listing.instances if i.label == label]
    return found.status


class KeptByTheCache:
    """The dashboard as a reverse proxy that rewrites caching headers serves it: without
    ``Cache-Control: no-store``. Chromium keeps no page in its back/forward cache that was
    served no-store and opened a stream, so only so does a kept page's stream come into play:
    each page kept with its stream open holds one of the 6 connections a browser opens to a
    host, and the 7th load waits for ever."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def without_no_store(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message["headers"] if k.lower() != b"cache-control"]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, without_no_store)


@contextlib.contextmanager
def cacheable(ui: Sentinel) -> Iterator[str]:
    """A second dashboard of ``ui``, its pages served as :class:`KeptByTheCache` says."""
    sock = listen("127.0.0.1", 0)
    served = build(ui, sock, address="127.0.0.1", allow_hosts=[], max_streams=32)
    served.server.config.app = KeptByTheCache(served.server.config.app)
    served.start()
    try:
        yield url(sock).rstrip("/")
    finally:
        served.stop()


def test_going_back_to_a_page_reconnects_its_stream(browser, world):
    visit(browser, world.url + "/services")
    visit(browser, world.url + "/topology")
    browser.back()
    wait_for(browser, lambda: live_state(browser) == "open", "the stream of the page gone back to")
    assert browser.current_url == world.url + "/services"


def test_a_dozen_page_loads_in_one_tab_keep_working_when_pages_are_kept(browser, world):
    """Pages the back/forward cache keeps let go of their streams, and take them again when
    shown: twelve loads in one tab, then back to a page that was kept, live again."""
    with cacheable(world.ui) as base:
        pages = [*PAGES.values(), "/services/orders", "/topology", "/services", "/agents"]
        assert len(pages) == 12
        for number, path in enumerate(pages, 1):
            if number == len(pages):
                browser.execute_script("window.sentinelTestKept = true")  # on page 11
            visit(browser, base + path)
        browser.back()
        wait_for(browser, lambda: live_state(browser) == "open", "the kept page's stream")
        # The same document, restored from the back/forward cache (a new load would not hold
        # what the test left in it), its stream open again: a change reaches it.
        assert browser.execute_script("return window.sentinelTestKept") is True, (
            browser.execute_script(NOT_RESTORED)
        )
        before = int(browser.find_element("id", "version").text)
        world.orders[1] = world.publisher.update_registration(world.orders[1], weight=2)
        try:
            wait_for(
                browser,
                lambda: int(browser.find_element("id", "version").text) > before,
                "a change to reach the page restored from the back/forward cache",
            )
        finally:
            world.orders[1] = world.publisher.update_registration(world.orders[1], weight=1)
            leave(browser)


def test_a_drain_shows_within_a_second_without_a_reload(browser, world):
    visit(browser, world.url + "/services/orders")
    row = instance_row("orders-1")
    assert dataset(browser, row, "status") == "up"
    browser.execute_script("window.sentinelTestKept = true")
    world.orders[0] = world.publisher.update_registration(world.orders[0], status="draining")
    try:
        took = wait_for(
            browser, lambda: dataset(browser, row, "status") == "draining", "the drain to show"
        )
        assert took < 1.0, f"the drain took {took:.2f} s to show"
        assert dataset(browser, row, "eligible") == "false"
        assert browser.execute_script("return window.sentinelTestKept") is True  # no reload
    finally:
        world.orders[0] = world.publisher.update_registration(world.orders[0], status="up")
    wait_for(browser, lambda: dataset(browser, row, "status") == "up", "the undrain to show")


def test_a_change_heard_while_the_page_reads_its_new_content_is_shown_too(browser, world):
    """The page's read of its new content is held until the next change has been heard: the
    content it brings is then older than that change, which the page shows too (a read
    more), rather than stay one change behind until the next."""
    script = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": HOLD})
    try:
        visit(browser, world.url + "/services/orders")
        row = instance_row("orders-1")
        heard = browser.execute_script("return window.sentinelTest.heard")
        world.orders[0] = world.publisher.update_registration(world.orders[0], status="draining")
        wait_for(browser, lambda: browser.execute_script(HELD) == 1, "the page's read")
        world.orders[0] = world.publisher.update_registration(world.orders[0], status="up")
        wait_for(
            browser,
            lambda: browser.execute_script("return window.sentinelTest.heard") == heard + 2,
            "the second change to be heard",
        )

        def shows_up() -> bool:
            browser.execute_script(RELEASE)
            return dataset(browser, row, "status") == "up" and browser.execute_script(HELD) == 0

        wait_for(browser, shows_up, "the page to show the second change")
        assert browser.execute_script("return window.sentinelTest.reads") == 2
    finally:
        browser.execute_cdp_cmd(
            "Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]}
        )
        world.orders[0] = world.publisher.update_registration(world.orders[0], status="up")


def test_a_failing_check_shows_on_the_service_and_on_the_topology(browser, world):
    visit(browser, world.url + "/services/payments")
    row = instance_row("payments-1")
    wait_for(browser, lambda: dataset(browser, row, "eligible") == "false", "payments-1 failing")
    health = browser.find_element("css selector", f"{row} .health").text
    verdict = browser.find_element("css selector", f"{row} .verdict").text
    assert "check:call" in health and "down" in health, health
    assert "down" in verdict, verdict
    visit(browser, world.url + "/topology")
    edge = 'tr[data-source="web"][data-target="payments"]'
    assert dataset(browser, edge, "health") == "failing", page_text(browser)
    assert dataset(browser, 'tr[data-source="web"][data-target="orders"]', "health") == "ok"
    if shutil.which("dot") is None:  # the page draws no graph without Graphviz: the table
        return
    # the drawn graph too: the edge into payments is the failing colour, the other is not
    edges = browser.execute_script(
        "return [...document.querySelectorAll('#graph g.edge')].map("
        "e => [e.querySelector('title').textContent,"
        " e.querySelector('path').getAttribute('stroke')])"
    )
    assert dict(edges) == {"web->payments": "#c62828", "web->orders": "#2e7d32"}, edges


def test_a_secured_namespace_shows_an_unprivileged_identity_only_what_it_may_read(
    browser, zookeeper, tmp_path
):
    """In a namespace `init --secure` made, the publisher shuts one service to everyone but
    itself; a dashboard acting as an identity of no role lists that service with the reason
    only (none of its instances, on no page), shows the rest, and its drain is refused by
    ZooKeeper (the identity may not write)."""
    namespace = f"/test-ui-secured-{uuid.uuid4().hex[:12]}"
    hosts = zookeeper.connect_string
    identities_file = tmp_path / "identities.json"
    done = sentinel_in_process(
        "init", "--secure", "--identities", str(identities_file), *_zk(hosts, namespace)
    )
    assert done.returncode == 0, done.stderr
    publisher_identity = json.loads(identities_file.read_text())["publisher"]
    publisher = Sentinel(
        hosts, "publisher", namespace, identity=publisher_identity, announce=False
    ).start()
    viewer = Sentinel(hosts, "viewer", namespace, identity="viewer:viewer-pw", announce=False)
    try:
        publisher.register("billing-db", "p1", "10.9.0.5", 5432, label="billing-1")
        publisher.register("catalog", "main", "10.9.0.6", 8080, label="catalog-1")
        publisher.session.zk.set_acls("/services/billing-db", [owner_acl(publisher_identity)])
        viewer.start()
        with dashboard(viewer, allow_actions=True) as base:
            visit(browser, base + "/services")
            wait_for(browser, lambda: dataset(browser, "#service-catalog", "up") == "1", "catalog")
            shut = browser.find_element("css selector", "#service-billing-db").text
            assert "not readable" in shut, shut
            for path in ("/services", "/services/billing-db", "/topology"):
                browser.get(base + path)
                assert "10.9.0.5" not in browser.page_source, path
            visit(browser, base + "/services/catalog")
            browser.find_element("css selector", f"{instance_row('catalog-1')} button").click()
            wait_for(browser, lambda: "refused by ZooKeeper" in page_text(browser), "refusal")
            (catalog,) = publisher.read_service("catalog").instances
            assert catalog.status == "up"
            leave(browser)
    finally:
        viewer.close()
        publisher.close()


def _zk(hosts: str, namespace: str) -> list[str]:
    return ["--zk", hosts, "--namespace", namespace]


def test_the_keyboard_reaches_every_link_and_button_in_order_and_enter_follows(browser, world):
    """Tab, from the top of a service's page, visits each link and button once, in the
    page's order, each with a visible focus ring; Enter on a link follows it."""
    visit(browser, world.url + "/services/orders")
    expected = browser.execute_script(FOCUSABLE)
    buttons = [e for e in expected if e.tag_name == "button"]
    assert len(expected) >= 10 and len(buttons) == 2  # the navigation; drain, drain
    keyboard = ActionChains(browser)
    reached = []
    for _ in expected:
        keyboard.send_keys(Keys.TAB).perform()
        focused, ring = browser.execute_script(FOCUSED)
        assert ring, f"no visible focus on {focused.get_attribute('outerHTML')[:120]}"
        reached.append(focused)
    assert reached == expected
    visit(browser, world.url + "/services/orders")
    topology = browser.find_element("css selector", 'nav a[href="/topology"]')
    while browser.switch_to.active_element != topology:
        keyboard.send_keys(Keys.TAB).perform()
    keyboard.send_keys(Keys.ENTER).perform()
    wait_for(browser, lambda: browser.current_url == world.url + "/topology", "Enter to follow")


def test_the_layout_fits_1280_px_and_a_phone(browser, world):
    """No page is wider than the window, on a desktop or a phone (a wide table scrolls inside
    its own frame). With SENTINEL_WRITE_SCREENSHOTS=1 the screenshots docs/dashboard.md shows
    are written to docs/img."""
    for name, path in PAGES.items():
        browser.get(world.url + path)  # laid out at its load; its stream is not needed
        for size in (DESKTOP, PHONE):
            # the page laid out again at the size (a window's, without reloading it)
            browser.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": False},
            )
            try:
                inner, scroll = browser.execute_script(
                    "return [innerWidth, document.documentElement.scrollWidth]"
                )
                assert inner == size[0] and scroll <= inner, (name, size, scroll)
                shot = SCREENSHOTS_SHOWN.get((name, size))
                if WRITE_SCREENSHOTS and shot:
                    wait_for(browser, lambda: live_state(browser) == "open", "the stream")
                    screenshot(browser, ROOT / "docs" / "img" / shot)
            finally:
                browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_a_drain_from_the_page_carries_its_token_and_a_cross_site_form_is_refused(browser, world):
    """Started with --allow-actions: the page's drain button drains (its form carries the
    session's token); the same POST from another site's page (no token: it cannot read one)
    and a same-origin POST without the token are refused, and drain nothing."""
    orders_1 = "/services/orders/instances/main:orders-1/drain"
    with attacker_site(world.url + orders_1) as attacker:
        try:
            visit(browser, world.url + "/services/orders")
            browser.find_element("css selector", f"{instance_row('orders-2')} button").click()
            row = instance_row("orders-2")
            wait_for(browser, lambda: dataset(browser, row, "status") == "draining", "the drain")
            assert published_status(world, "orders", "orders-2") == "draining"
            status = browser.execute_async_script(
                "fetch(arguments[0], {method: 'POST', body: 'csrf='})"
                ".then(r => arguments[1](r.status));",
                world.url + orders_1,
            )
            assert status == 403
            browser.get(attacker)  # its form posts itself to the dashboard
            wait_for(
                browser,
                lambda: (
                    browser.current_url.startswith(world.url) and "refused" in page_text(browser)
                ),
                "the dashboard's answer to the forged form",
            )
            assert published_status(world, "orders", "orders-1") == "up"
        finally:
            world.orders[1] = world.publisher.update_registration(world.orders[1], status="up")


@contextlib.contextmanager
def attacker_site(action: str) -> Iterator[str]:
    """A page of another site (``localhost`` and a port of its own: another origin and
    another site than ``127.0.0.1``) whose form posts itself to ``action`` as soon as it
    loads: its URL."""
    page = FORGED_FORM.format(action=action).encode()

    class Forged(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forged)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
