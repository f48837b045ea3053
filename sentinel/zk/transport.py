"""A kazoo handler whose ``select`` is one ``poll``: cheaper round trips to ZooKeeper.

kazoo's threading handler answers every ``select`` (its connection loop makes one per request
and per response) with a new epoll selector: create, register, wait, close, four system calls
and their Python objects each time. A ``poll`` object costs no system call to create and,
unlike ``select.select``, has no limit on descriptor numbers. What that saves per round trip is
in docs/benchmarks.md ("The poll transport").

Over TLS a ``poll`` on the socket is not enough: one TLS record may carry several ZooKeeper
replies, and after kazoo has read the first the rest wait decrypted inside the ``SSLSocket``
while the kernel has nothing left to report. kazoo's reader checks ``pending()``, but its
connection loop only asks ``select`` and would sleep until the next ping (a third of the
session timeout) with a reply in hand. :func:`poll_select` therefore reports an SSL socket with
pending bytes readable at once. The handler also keeps the reason of the last failed TLS
handshake (:attr:`PollHandler.tls_failure`): kazoo only logs it and retries, and a client that
gives up can then say why; and the addresses that refused a connection
(:attr:`PollHandler.refused`), so that a client starting can tell "nothing listens there"
(say it at once) from a server that is slow to answer (wait for it).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import ssl
from collections.abc import Callable
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

# select.select's sets, as Linux fills them from poll's events (fs/select.c): an error makes a
# descriptor both readable and writable, a hang-up readable, priority data exceptional.
_READABLE = select.POLLIN | select.POLLHUP | select.POLLERR
_WRITABLE = select.POLLOUT | select.POLLERR


def _fileno(obj: Any) -> int:
    """The descriptor ``select.select`` would use for ``obj``, with its errors."""
    if isinstance(obj, int):
        fd = obj
    else:
        try:
            fileno = obj.fileno
        except AttributeError:
            raise TypeError("argument must be an int, or have a fileno() method.") from None
        fd = fileno()
        if not isinstance(fd, int):
            raise TypeError("fileno() returned a non-integer")
    if fd < 0:
        raise ValueError(f"file descriptor cannot be a negative integer ({fd})")
    return fd


def poll_select(
    rlist: list[Any], wlist: list[Any], xlist: list[Any], timeout: float | None = None
) -> tuple[list[Any], list[Any], list[Any]]:
    """``select.select``'s contract on top of ``poll`` (timeout in seconds).

    As ``select.select``: each list comes back filtered in its own order, an object only in
    the lists it was given in; a negative timeout is a ValueError, an object without
    ``fileno()`` a TypeError, a closed descriptor an ``OSError(EBADF)``. A hung-up or failed
    descriptor is readable, so the reader meets the error; so is an SSL socket that holds
    decrypted bytes not read yet, without waiting.
    """
    if timeout is not None:
        if not isinstance(timeout, (int, float)):
            raise TypeError("timeout must be a float or None")
        if timeout < 0:
            raise ValueError("timeout must be non-negative")
    if not xlist and not (rlist and wlist):  # every call kazoo's connection makes
        ready = _one_way(rlist or wlist, bool(rlist), timeout)
        if ready is not None:
            return (ready, [], []) if rlist else ([], ready, [])
    given = [[(obj, _fileno(obj)) for obj in objects] for objects in (rlist, wlist, xlist)]
    masks: dict[int, int] = {}
    for entries, mask in zip(given, (select.POLLIN, select.POLLOUT, select.POLLPRI), strict=True):
        for _, fd in entries:
            masks[fd] = masks.get(fd, 0) | mask
    buffered = [obj for obj in rlist if isinstance(obj, ssl.SSLSocket) and obj.pending()]
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    ready = dict(poller.poll(0 if buffered else None if timeout is None else timeout * 1000))
    if any(events & select.POLLNVAL for events in ready.values()):
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))
    readable = [obj for obj, fd in given[0] if ready.get(fd, 0) & _READABLE or obj in buffered]
    writable = [obj for obj, fd in given[1] if ready.get(fd, 0) & _WRITABLE]
    exceptional = [obj for obj, fd in given[2] if ready.get(fd, 0) & select.POLLPRI]
    return readable, writable, exceptional


def _one_way(objects: list[Any], read: bool, timeout: float | None) -> list[Any] | None:
    """Those of ``objects`` ready to read (``read``) or to write, when all are plain sockets;
    None when one is not (TLS may hold bytes above the kernel, an int or a closed socket has
    its own answer): :func:`poll_select`'s general path answers then.

    kazoo's connection asks ``select`` before every read and write of its socket and in its
    loop, so this is on the way of every reply and watch event: a few system calls' worth of
    Python where the general path builds and filters all three lists.
    """
    poller = select.poll()
    mask, reported = (select.POLLIN, _READABLE) if read else (select.POLLOUT, _WRITABLE)
    fds = []
    for obj in objects:
        if type(obj) is not socket.socket or (fd := obj.fileno()) < 0:
            return None
        poller.register(fd, mask)
        fds.append(fd)
    answered = set()
    for fd, happened in poller.poll(None if timeout is None else timeout * 1000):
        if happened & select.POLLNVAL:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        if happened & reported:
            answered.add(fd)
    if not answered:
        return []
    return [obj for obj, fd in zip(objects, fds, strict=True) if fd in answered]


class PollHandler(SequentialThreadingHandler):
    """kazoo's threading handler with :func:`poll_select` as its ``select``, which remembers
    why the last TLS handshake failed and which addresses refused a connection."""

    def __init__(self) -> None:
        super().__init__()
        self.tls_failure: str | None = None
        #: ``(ip, port)`` of each address whose last connection attempt was refused; replaced,
        #: never changed in place, so that another thread may read it whole.
        self.refused: frozenset[tuple[str, int]] = frozenset()
        #: Called (on kazoo's connection thread: it must not block) after a refusal.
        self.on_refused: Callable[[], None] | None = None

    def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        """kazoo's connection, recording a TLS failure (None again once one succeeds) and a
        refused address (until it accepts one)."""
        address = kwargs["address"] if "address" in kwargs else args[0]
        where = (address[0], address[1])
        try:
            sock = super().create_connection(*args, **kwargs)
        except ssl.SSLError as exc:
            self.tls_failure = exc.reason or str(exc)
            if isinstance(exc, ssl.SSLCertVerificationError):
                self.tls_failure = f"{exc.reason}: {exc.verify_message}"
            raise
        except ConnectionRefusedError:
            self.refused = self.refused | {where}
            if self.on_refused is not None:
                self.on_refused()
            raise
        self.tls_failure = None
        self.refused = self.refused - {where}
        return sock

    def select(self, *args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], list[Any]]:
        return poll_select(*args, **kwargs)
