"""A kazoo handler whose ``select`` is one ``poll``: cheaper round trips to ZooKeeper.

kazoo's threading handler answers every ``select`` (its connection loop makes one per request
and per response) with a new epoll selector: create, register, wait, close, four system calls
and their Python objects each time. A ``poll`` object costs no system call to create and,
unlike ``select.select``, has no limit on descriptor numbers. Measured here side by side on
loopback (``exists``, 1,000 calls, medians of 5 interleaved rounds): p50 0.46 -> 0.37 ms,
p99 3.07 -> 0.96 ms.

Over TLS a ``poll`` on the socket is not enough: one TLS record may carry several ZooKeeper
replies, and after kazoo has read the first the rest wait decrypted inside the ``SSLSocket``
while the kernel has nothing left to report. kazoo's reader checks ``pending()``, but its
connection loop only asks ``select`` and would sleep until the next ping (a third of the
session timeout) with a reply in hand. :func:`poll_select` therefore reports an SSL socket with
pending bytes readable at once. The handler also keeps the reason of the last failed TLS
handshake (:attr:`PollHandler.tls_failure`): kazoo only logs it and retries, and a client that
gives up can then say why.
"""

from __future__ import annotations

import select
import ssl
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL


def poll_select(
    rlist: list[Any], wlist: list[Any], xlist: list[Any], timeout: float | None = None
) -> tuple[list[Any], list[Any], list[Any]]:
    """``select.select``'s contract on top of ``poll`` (timeout in seconds).

    A hung-up or failed descriptor is reported readable, so the reader meets the error; so is
    an SSL socket that holds decrypted bytes not read yet, without waiting.
    """
    buffered = [obj for obj in rlist if isinstance(obj, ssl.SSLSocket) and obj.pending()]
    if buffered:
        timeout = 0
    poller = select.poll()
    wanted: dict[int, list[Any]] = {}
    for objects, mask in ((rlist, select.POLLIN | select.POLLPRI), (wlist, select.POLLOUT)):
        for obj in objects:
            fd = obj if isinstance(obj, int) else obj.fileno()
            entry = wanted.setdefault(fd, [0, obj])
            entry[0] |= mask
    for fd, (mask, _) in wanted.items():
        poller.register(fd, mask)
    readable, writable = buffered, []
    for fd, events in poller.poll(None if timeout is None else timeout * 1000):
        obj = wanted[fd][1]
        if events & _READABLE and obj not in buffered:
            readable.append(obj)
        if events & select.POLLOUT:
            writable.append(obj)
    return readable, writable, []


class PollHandler(SequentialThreadingHandler):
    """kazoo's threading handler with :func:`poll_select` as its ``select``, which remembers
    why the last TLS handshake failed."""

    def __init__(self) -> None:
        super().__init__()
        self.tls_failure: str | None = None

    def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        """kazoo's connection, recording a TLS failure (None again once one succeeds)."""
        try:
            sock = super().create_connection(*args, **kwargs)
        except ssl.SSLError as exc:
            self.tls_failure = exc.reason or str(exc)
            if isinstance(exc, ssl.SSLCertVerificationError):
                self.tls_failure = f"{exc.reason}: {exc.verify_message}"
            raise
        self.tls_failure = None
        return sock

    def select(self, *args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], list[Any]]:
        return poll_select(*args, **kwargs)
