"""Headless Chromium driven through Selenium: the dashboard's browser tests and benchmark.

Debian's ``chromium`` and ``chromium-driver`` packages, started fully offline: Selenium is given
the driver's path (so Selenium Manager, which would download one, never runs) and the browser's
own binary, ``/usr/lib/chromium/chromium`` (``/usr/bin/chromium`` is a shell wrapper that adds
flags of its own and hides the process the driver waits for). A browser starts in about a
second and holds about 400 MiB, so a test module starts one and reuses its tab.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = Path("/usr/lib/chromium/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Nothing but the pages under test: a closed network refuses the browser's own connections
# (component updates, sync, the QUIC probes), which would otherwise be retried in the
# background and show as noise in the tests' timings.
ARGUMENTS = (
    "--headless=new",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-gpu",
    "--hide-scrollbars",  # a screenshot shows the page, not the frame's scroll bars
)
# A page that does not finish loading (the 7th of a tab whose earlier pages each hold a
# connection open) fails the test in this many seconds rather than in Selenium's 300.
PAGE_LOAD_TIMEOUT = 10.0


def unavailable() -> str | None:
    """Why no browser can be driven here (what to install), or None when one can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if not os.access(CHROMEDRIVER, os.X_OK):
        return f"no ChromeDriver at {CHROMEDRIVER} (apt-get install chromium-driver)"
    return None


@contextlib.contextmanager
def headless_chromium(width: int = 1280, height: int = 900) -> Iterator[WebDriver]:
    """A headless Chromium of its own (a fresh profile, removed afterwards), its window
    ``width`` x ``height`` CSS pixels; it is quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="sentinel-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (*ARGUMENTS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(argument)
    if os.geteuid() == 0:  # Chromium's sandbox refuses to run as root
        options.add_argument("--no-sandbox")
    try:
        driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
        try:
            driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT)
            yield driver
        finally:
            driver.quit()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver: WebDriver, path: Path) -> None:
    """Write the whole page (beyond the window's height, not beyond its width) as a PNG."""
    metrics: dict[str, Any] = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    size = metrics["cssContentSize"]
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {
                "x": 0,
                "y": 0,
                "width": metrics["cssLayoutViewport"]["clientWidth"],
                "height": size["height"],
                "scale": 1,
            },
        },
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))
