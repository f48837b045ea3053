"""The publisher's side of readiness checks: an instance's status follows its check.

:class:`Readiness` runs each registration's :class:`~sentinel.health.checks.HealthCheck` on one
shared :class:`~sentinel.health.scheduler.CheckScheduler`, damps the results
(:class:`~sentinel.health.damping.Damper`) and, when the damped state differs from the status
the instance is published with, writes the new status: one ZooKeeper write per change of
state, none while it holds. Writes happen on one writer thread of their own (never on
kazoo's thread, never on a check's), and a write that fails (the connection is down) is
retried until it succeeds or the state changes back.

A check owns the statuses ``starting``, ``up`` and ``down`` and nothing else: ``draining``
is an operator's (``sentinel drain``) or the application's, and a check never overrides it.
After ``sentinel undrain`` (status ``up``) the check's state is written again at its next
result if it differs. The comparison is with the status as this client publishes it now, in
memory: no read.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from sentinel import telemetry
from sentinel.health.checks import CheckFailed, HealthCheck
from sentinel.health.damping import DOWN, UP, Damper
from sentinel.health.scheduler import CheckScheduler, ScheduledCheck
from sentinel.registry.records import CHECK_PASSING, MAX_CHECK_TEXT

log = logging.getLogger(__name__)

# The statuses a check may replace; any other (draining) is left as it is.
CHECKED_STATUSES = frozenset({"starting", "up", "down"})
_RETRY_AFTER_FAILURE = 1.0
_RETRY_MAX_DELAY = 30.0


class _Followed:
    """One registration's check and its damped state."""

    def __init__(self, path: str, service: str, check: HealthCheck) -> None:
        self.path = path
        self.service = service
        self.check = check
        self.damper = Damper(check.failures_before_down, check.successes_before_up)
        self.passing: bool | None = None  # the last result, to log changes only
        self.result: str | None = None  # published_result() of the last result
        self.scheduled: ScheduledCheck | None = None


class Readiness:
    """Makes registrations' published status follow their checks.

    ``published(path)`` is the status a registration is published with now (None once it is
    deregistered); ``publish(path, status, result)`` writes a new one, with the check's last
    result (:func:`published_result`), unless the published one is not a check's to replace
    (it re-checks that itself, holding the publisher's lock).
    """

    def __init__(
        self,
        published: Callable[[str], str | None],
        publish: Callable[[str, str, str | None], object],
    ) -> None:
        self._published = published
        self._publish = publish
        self._lock = threading.Lock()
        self._followed: dict[str, _Followed] = {}
        self._pending: set[str] = set()
        self._wake = threading.Event()
        self._closed = False
        self._scheduler: CheckScheduler | None = None  # and the writer, on the first follow

    def follow(self, path: str, service: str, host: str, port: int, check: HealthCheck) -> None:
        """Run ``check`` against ``host:port`` for the registration at ``path`` (replacing the
        check it had); its first run starts now."""
        followed = _Followed(path, service, check)
        followed.scheduled = ScheduledCheck(
            check.probe(host, port),
            check.interval,
            check.timeout,
            lambda passed, detail: self._report(followed, passed, detail),
        )
        with self._lock:
            if self._closed:
                return
            self._forget(path)
            self._followed[path] = followed
            if self._scheduler is None:
                self._scheduler = CheckScheduler()
                threading.Thread(
                    target=self._write_loop, name="sentinel-health-writer", daemon=True
                ).start()
            scheduler = self._scheduler
        scheduler.add(followed.scheduled)

    def forget(self, path: str) -> None:
        """Stop the check of the registration at ``path`` (deregistered, or registered anew
        without one); a status write of it not made yet is dropped."""
        with self._lock:
            self._forget(path)

    def _forget(self, path: str) -> None:
        followed = self._followed.pop(path, None)
        if followed is None:
            return
        self._pending.discard(path)
        service, source = followed.service, followed.check.source
        if followed.damper.state == DOWN:
            telemetry.HEALTH_DOWN.labels(service, source).dec()
        if followed.scheduled is not None and self._scheduler is not None:
            self._scheduler.remove(followed.scheduled)
        # The last check of its service and source: their series go with it, or a process
        # checking instances of ever-new services would keep a series of each.
        others = self._followed.values()
        if not any(f.service == service and f.check.source == source for f in others):
            _remove(telemetry.HEALTH_DOWN, service, source)
            for status in (UP, DOWN):
                _remove(telemetry.HEALTH_CHANGES, service, source, status)

    def close(self) -> None:
        """Stop every check and the writer (a write in progress finishes)."""
        with self._lock:
            self._closed = True
            for path in list(self._followed):
                self._forget(path)
            scheduler = self._scheduler
        self._wake.set()
        if scheduler is not None:
            scheduler.close()

    def _report(self, followed: _Followed, passed: bool, detail: str) -> None:
        """One result of a check (on a scheduler thread): log a change of result, damp it,
        and have the writer publish a state the published status disagrees with."""
        if passed != followed.passing:
            if not passed:
                log.warning("%s: readiness check failed: %s", followed.path, detail)
            elif followed.passing is not None:
                log.info("%s: readiness check passes again", followed.path)
            followed.passing = passed
        followed.result = published_result(followed.check, passed, detail)
        before = followed.damper.state
        changed = followed.damper.observe(passed)
        if changed is not None:
            source = followed.check.source
            with self._lock:  # counted while followed: a forgotten check's series are gone
                if self._followed.get(followed.path) is followed:
                    telemetry.HEALTH_CHANGES.labels(followed.service, source, changed).inc()
                    if changed == DOWN:
                        telemetry.HEALTH_DOWN.labels(followed.service, source).inc()
                    elif before == DOWN:
                        telemetry.HEALTH_DOWN.labels(followed.service, source).dec()
            log.info("%s: %s by its readiness check", followed.path, changed)
        state = followed.damper.state
        published = self._published(followed.path)
        if state is not None and published in CHECKED_STATUSES and published != state:
            with self._lock:
                if self._followed.get(followed.path) is not followed:
                    return  # forgotten meanwhile
                self._pending.add(followed.path)
            self._wake.set()

    def _write_loop(self) -> None:
        delay: float | None = None
        while True:
            self._wake.wait(delay)
            self._wake.clear()
            with self._lock:
                if self._closed:
                    return
                pending = [self._followed[p] for p in self._pending]
                self._pending.clear()
            failed = False
            for followed in pending:
                state = followed.damper.state
                if state is None:
                    continue
                try:
                    self._publish(followed.path, state, followed.result)
                except Exception as exc:
                    if not failed and delay is None:
                        log.warning(
                            "%s: could not publish status %s (%s); retrying",
                            followed.path,
                            state,
                            exc,
                        )
                    failed = True
                    with self._lock:
                        if self._followed.get(followed.path) is followed:
                            self._pending.add(followed.path)
            if failed:
                delay = min((delay or _RETRY_AFTER_FAILURE / 2) * 2, _RETRY_MAX_DELAY)
            else:
                delay = None


def _remove(metric: Any, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set
        metric.remove(*labels)


def published_result(check: HealthCheck, passed: bool, detail: str) -> str:
    """A result as it is published with the status it sets, for every reader of the namespace
    to see: ``passing``, or why it failed in Sentinel's own words (an HTTP status, a refused
    connection, a timeout), a URL's query left out as in the check's name. An application's
    exception (a ``call`` check's) is named by its type only: its message may say anything, a
    password included."""
    if passed:
        return CHECK_PASSING
    kind, sep, text = detail.partition(": ")
    if sep and kind == CheckFailed.__name__:
        detail = _QUERY.sub("", text)
    elif sep and check.kind == "call" and kind.isidentifier():
        detail = f"raised {kind}"
    return detail[:MAX_CHECK_TEXT]


# A URL's query or fragment in a result: up to the ": " that ends the URL in CheckFailed's
# words (a URL holds no spaces: HealthCheck refuses them).
_QUERY = re.compile(r"[?#]\S*?(?=: |\s|$)")
