"""The application's listeners of a cache, by service, and how an event reaches them."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from sentinel.events import ChangeEvent

log = logging.getLogger(__name__)

Listener = Callable[[ChangeEvent], None]


class Listeners:
    """Listeners by service (None: every service), called on the cache's worker.

    A listener that raises is logged and the others still hear the event; a listener may call
    back into the client (the worker runs a lookup it makes there and then).
    """

    def __init__(self) -> None:
        self._by_service: dict[str | None, list[Listener]] = {}
        # A service's entry goes with its last listener (services come and go for months), so
        # an add must not append to a list a remove is dropping: both hold this.
        self._changing = threading.Lock()

    def add(self, service: str | None, listener: Listener) -> Callable[[], None]:
        """Add a listener for ``service`` (None: every service); returns its remover."""
        with self._changing:
            self._by_service.setdefault(service, []).append(listener)

        def remove() -> None:
            with self._changing:
                listeners = self._by_service.get(service, [])
                with contextlib.suppress(ValueError):  # removing twice is harmless
                    listeners.remove(listener)
                if not listeners:
                    self._by_service.pop(service, None)

        return remove

    def adopt(self, inherited: Listeners) -> None:
        """Share ``inherited``'s listeners: a forked child's new cache keeps the listeners the
        application added in the parent."""
        self._by_service = inherited._by_service

    def emit(self, service: str | None, event: ChangeEvent) -> None:
        """Tell ``service``'s listeners and the catch-all ones; None (a connection event):
        every listener."""
        listeners = list(self._by_service.get(None, ()))
        if service is not None:
            listeners += self._by_service.get(service, ())
        else:
            for key, extra in list(self._by_service.items()):
                if key is not None:
                    listeners += extra
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                log.exception("listener %r failed on %r", listener, event)
