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

import importlib.util
import os
import re
import select
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sentinel import Sentinel
from sentinel.health import HealthCheck
from sentinel.registry.layout import instance_name
from sentinel.testing.browser import headless_chromium, screenshot, unavailable
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper
from tests.conftest import SENTINEL

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "docs" / "img"
WRITE_SCREENSHOTS = os.environ.get("SENTINEL_WRITE_SCREENSHOTS") == "1"
PHONE = (390, 844)  # CSS pixels of a phone held upright
DESKTOP = (1280, 900)
# Every page of the navigation bar, and a service's.
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
    url: str  # the dashboard's base URL, without the trailing slash


@pytest.fixture(scope="module")
def browser() -> Iterator:
    why_not = unavailable() or _ui_missing()
    if why_not:
        pytest.skip(f"the dashboard's browser tests need {why_not}")
    with headless_chromium(*DESKTOP) as driver:
        yield driver


def _ui_missing() -> str | None:
    missing = [m for m in ("starlette", "uvicorn", "jinja2") if importlib.util.find_spec(m) is None]
    return f"the ui extra ({', '.join(missing)} missing)" if missing else None
