"""Helpers for tests and fault drills against a real ZooKeeper (as ``kazoo.testing`` does)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from kazoo.client import KazooClient

from sentinel.client import Sentinel


def expire_session(client: Sentinel, timeout: float = 10.0) -> int:
    """Expire ``client``'s ZooKeeper session the way a long pause would; return its old id.

    A second connection joins the same session (same id and password) and closes it, which
    ends the session on the server. ``client`` then finds its session expired, as after a
    long garbage-collection pause or a partition, and connects again with a new one.
    """
    session_id, password = client._zk.client_id
    intruder = KazooClient(hosts=client.hosts, client_id=(session_id, password), timeout=timeout)
    intruder.start(timeout=timeout)
    intruder.stop()
    intruder.close()
    return session_id


def wait_until(
    condition: Callable[[], object],
    timeout: float = 10.0,
    *,
    interval: float = 0.01,
    ignore: tuple[type[BaseException], ...] = (),
) -> float | None:
    """Poll ``condition`` until it is truthy; return the seconds that took, None on timeout.

    Exceptions of the ``ignore`` types count as "not yet" (for example
    :class:`~sentinel.errors.ConnectionInterrupted` while a client reconnects).
    """
    start = time.monotonic()
    while True:
        with contextlib.suppress(*ignore):
            if condition():
                return time.monotonic() - start
        if time.monotonic() - start > timeout:
            return None
        time.sleep(interval)
