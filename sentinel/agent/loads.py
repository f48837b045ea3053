"""Services loaded into the agent's cache when a program without Sentinel first asks for them:
the line both the xDS server (:mod:`sentinel.agent.xds`) and the DNS server
(:mod:`sentinel.agent.dns.server`) follow services through.

A service asked for waits in line, first asked first, and is loaded on one of a few workers
(:meth:`Sentinel.prefetch <sentinel.Sentinel.prefetch>`, which may wait on ZooKeeper), never
on the server's event loop; it is served only when everyone may read its node (such a client
has no identity to read as: what it is told is what anyone may read). A load ZooKeeper could
not answer is tried again every :data:`RETRY_SECONDS` while the service is still wanted; a
service no longer wanted leaves the line, and a load under way for it is ignored when it ends.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import KazooException, NoAuthError, NoNodeError
from kazoo.security import Permissions

from sentinel.agent.peers import Throttled
from sentinel.errors import AccessDenied, SentinelError, ServiceNotFound
from sentinel.registry.layout import service_path

if TYPE_CHECKING:
    from sentinel.cache.views import ServiceSnapshot
    from sentinel.client import Sentinel

#: Seconds between retries of the services that could not be loaded (ZooKeeper unreachable).
RETRY_SECONDS = 2.0
#: Loads under way at once (and workers): the others wait in line.
WORKERS = 4


class Loads:
    """The line of services ``surface`` (``"xDS"``, ``"DNS"``: named in the log) asks for,
    loaded on :data:`WORKERS` workers. ``loaded(service, snapshot)`` is called on the loop
    with the service's snapshot once loaded, or None when it does not exist or not everyone
    may read it, for a service still wanted. The loop's alone (but :meth:`close`)."""

    def __init__(
        self,
        sentinel: Sentinel,
        surface: str,
        loaded: Callable[[str, ServiceSnapshot | None], None],
        log: logging.Logger,
    ) -> None:
        self.sentinel = sentinel
        self._surface = surface
        self._loaded_callback = loaded
        self._log = log
        #: The workers: loads, and whatever else of the surface's may wait on ZooKeeper.
        self.executor = ThreadPoolExecutor(WORKERS, f"sentinel-{surface.lower()}-load")
        self._wanted: set[str] = set()
        self._waiting: OrderedDict[str, None] = OrderedDict()
        self._loading: set[str] = set()
        self._retrying: set[str] = set()
        self._closing = False
        self._hidden = Throttled(log)  # the services not everyone may read, once in a while

    @property
    def waiting(self) -> int:
        """The services in line (not yet being loaded)."""
        return len(self._waiting)

    def want(self, service: str) -> None:
        """Load ``service`` once the services asked for before it have been."""
        self._wanted.add(service)
        if service not in self._loading:
            self._waiting.setdefault(service)
        self._start()

    def retry(self, service: str) -> None:
        """Load ``service`` again at the next retry (it did not exist: created since?)."""
        if service in self._wanted:
            self._retrying.add(service)

    def forget(self, service: str) -> None:
        """``service`` is no longer wanted: out of the line, never retried."""
        self._wanted.discard(service)
        self._waiting.pop(service, None)
        self._retrying.discard(service)

    def loading(self, service: str) -> bool:
        """Whether ``service`` is in line or being loaded."""
        return service in self._waiting or service in self._loading

    async def retry_forever(self) -> None:
        """Put the services that could not be loaded back in line, every RETRY_SECONDS."""
        while True:
            await asyncio.sleep(RETRY_SECONDS)
            for service in self._retrying:
                if service not in self._loading:
                    self._waiting.setdefault(service)
            self._retrying.clear()
            self._start()

    def close(self) -> None:
        """Start no load from now on, and wait for those under way (each bounded by the
        cache's load timeout): call it while the loop still runs, their results go there."""
        self._closing = True
        self.executor.shutdown(wait=True, cancel_futures=True)

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting and len(self._loading) < WORKERS and not self._closing:
            service, _ = self._waiting.popitem(last=False)
            self._loading.add(service)
            future = loop.run_in_executor(self.executor, self._read, service)
            future.add_done_callback(functools.partial(self._done, service))

    def _read(self, service: str) -> Any:
        """On a worker: the service's snapshot, loaded into the agent's cache; None when it
        does not exist or not everyone may read it. Raises when ZooKeeper cannot say."""
        try:
            self.sentinel.prefetch(service)
            entries, _ = self.sentinel.session.zk.get_acls(service_path(service))
        except (ServiceNotFound, NoNodeError):
            return None
        except (AccessDenied, NoAuthError):  # not even the agent may read it
            entries = []
        if not any(e.perms & Permissions.READ and e.id.scheme == "world" for e in entries):
            self._hidden.warning(
                "%s: %s is not served: not everyone may read it", self._surface, service
            )
            return None
        return self.sentinel.session.cache.snapshots.get(service)

    def _done(self, service: str, done: asyncio.Future[Any]) -> None:
        self._loading.discard(service)
        if service in self._wanted and not done.cancelled():
            failure = done.exception()
            if failure is None:
                self._loaded_callback(service, done.result())
            else:  # retried; meanwhile nothing is answered for it
                self._retrying.add(service)
                if not isinstance(failure, SentinelError | KazooException):
                    self._log.error(
                        "%s: loading %s failed", self._surface, service, exc_info=failure
                    )
        self._start()
