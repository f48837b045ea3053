"""Runs many checks on a few threads, each run bounded by its timeout.

One timer thread keeps every check's next start in a heap; runs go to worker threads, started
on demand up to ``workers`` (default :data:`DEFAULT_WORKERS`), so a process with a hundred
checks has a handful of threads, never one per check. A run that has not returned by its
deadline is reported as a failure at the deadline; its late result is discarded. A check that
ignores its timeout (a callable that never returns, a name lookup that hangs) keeps its
worker: that worker is replaced, so the other checks keep their threads, and the check is not
started again until the run returns (every start meanwhile is one more failure), so a hung
check holds one thread at most. Nothing a check does (raise, hang, return garbage) stops the
scheduler's threads; results are reported on them, never on kazoo's thread.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 4

Report = Callable[[bool, str], None]


class ScheduledCheck:
    """One check in a :class:`CheckScheduler`: ``probe`` every ``interval`` seconds, bounded
    by ``timeout``, each result given to ``report(passed, detail)``."""

    def __init__(
        self, probe: Callable[[], None], interval: float, timeout: float, report: Report
    ) -> None:
        self.probe = probe
        self.interval = interval
        self.timeout = timeout
        self.report = report
        self.removed = False
        # The scheduler's bookkeeping, read and written under its lock only.
        self.in_flight: int | None = None  # the run in flight, if any
        self.running = False  # taken by a worker (else still queued)
        self.hung = False  # a run past its deadline has not returned yet
        self.started_at = 0.0


class CheckScheduler:
    """A timer thread and a few workers that run :class:`ScheduledCheck` objects."""

    def __init__(self, workers: int = DEFAULT_WORKERS, name: str = "sentinel-health") -> None:
        self._size = workers
        self._name = name
        self._lock = threading.Lock()
        self._timer_wake = threading.Condition(self._lock)
        self._work_wake = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, str, ScheduledCheck, int]] = []
        self._ready: collections.deque[tuple[ScheduledCheck, int]] = collections.deque()
        self._ids = itertools.count()
        self._threads = 0  # workers alive
        self._idle = 0  # workers waiting for a run
        self._stuck = 0  # workers in a run past its deadline
        self._closed = False
        self._timer: threading.Thread | None = None

    def add(self, scheduled: ScheduledCheck) -> None:
        """Run ``scheduled`` from now on; its first run starts at once."""
        with self._lock:
            if self._closed:
                return
            if self._timer is None:
                self._timer = threading.Thread(
                    target=self._time, name=f"{self._name}-timer", daemon=True
                )
                self._timer.start()
            self._push(time.monotonic(), "start", scheduled, 0)

    def remove(self, scheduled: ScheduledCheck) -> None:
        """Stop running ``scheduled``; a run in progress ends unreported."""
        with self._lock:
            scheduled.removed = True

    def close(self, timeout: float = 1.0) -> None:
        """Stop every check and the threads; waits ``timeout`` seconds at most for the timer
        (a worker in a hung run is a daemon thread and ends when its run does)."""
        with self._lock:
            self._closed = True
            self._timer_wake.notify_all()
            self._work_wake.notify_all()
            timer = self._timer
        if timer is not None and timer is not threading.current_thread():
            timer.join(timeout)

    @property
    def threads(self) -> int:
        """Worker threads alive now (the timer not counted)."""
        return self._threads

    def _push(self, when: float, kind: str, scheduled: ScheduledCheck, run: int) -> None:
        heapq.heappush(self._heap, (when, next(self._ids), kind, scheduled, run))
        self._timer_wake.notify()

    def _dispatch(self, scheduled: ScheduledCheck, run: int) -> None:
        """Queue a run and make sure a worker will take it. Holds the lock."""
        self._ready.append((scheduled, run))
        self._wake_worker()

    def _wake_worker(self) -> None:
        """Have a worker take the queued runs: an idle one, else a new one while fewer than
        ``workers`` are not stuck in a hung run. Holds the lock."""
        if not self._ready:
            return
        if self._idle >= len(self._ready):
            self._work_wake.notify()
        elif self._threads - self._stuck < self._size:
            self._threads += 1
            threading.Thread(target=self._work, name=f"{self._name}-worker", daemon=True).start()

    def _time(self) -> None:
        while True:
            due: list[tuple[ScheduledCheck, str]] = []
            with self._lock:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._timer_wake.wait(wait)
                if self._closed:
                    return
                when, _, kind, scheduled, run = heapq.heappop(self._heap)
                if scheduled.removed:
                    continue
                if kind == "start":
                    self._start(scheduled, when, due)
                elif scheduled.in_flight == run:  # its deadline, and the run has not reported
                    self._overrun(scheduled, due)
            for scheduled, detail in due:
                _report(scheduled, False, detail)

    def _start(
        self, scheduled: ScheduledCheck, when: float, due: list[tuple[ScheduledCheck, str]]
    ) -> None:
        """A start is due. Holds the lock."""
        if scheduled.hung:
            due.append((scheduled, "its previous run has still not returned"))
            self._push(when + scheduled.interval, "start", scheduled, 0)
            return
        run = next(self._ids)
        scheduled.in_flight, scheduled.running, scheduled.started_at = run, False, when
        self._dispatch(scheduled, run)
        self._push(time.monotonic() + scheduled.timeout, "deadline", scheduled, run)

    def _overrun(self, scheduled: ScheduledCheck, due: list[tuple[ScheduledCheck, str]]) -> None:
        """A run is past its deadline. Holds the lock."""
        run, scheduled.in_flight = scheduled.in_flight, None
        assert run is not None  # only a run in flight has a deadline
        if scheduled.running:
            scheduled.hung = True
            self._stuck += 1
            self._wake_worker()  # a replacement, so the other checks keep their workers
            due.append((scheduled, f"no result within its timeout of {scheduled.timeout:g} s"))
        else:
            self._ready.remove((scheduled, run))
            due.append((scheduled, "not started within its timeout: every check thread was busy"))
        self._push(scheduled.started_at + scheduled.interval, "start", scheduled, 0)

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._ready and not self._closed:
                    self._idle += 1
                    self._work_wake.wait()
                    self._idle -= 1
                if self._closed:
                    self._threads -= 1
                    return
                scheduled, run = self._ready.popleft()
                scheduled.running = True
            try:
                scheduled.probe()
            except BaseException as exc:  # a check's failure, whatever it is
                passed, detail = False, _describe(exc)
            else:
                passed, detail = True, ""
            with self._lock:
                if scheduled.in_flight != run:  # reported at its deadline already
                    scheduled.hung = False
                    self._stuck -= 1
                    if self._threads - self._stuck > self._size:
                        self._threads -= 1  # the replacement took over: one too many
                        return
                    continue
                scheduled.in_flight = None
                if not scheduled.removed:
                    due = max(scheduled.started_at + scheduled.interval, time.monotonic())
                    self._push(due, "start", scheduled, 0)
            _report(scheduled, passed, detail)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _report(scheduled: ScheduledCheck, passed: bool, detail: str) -> None:
    if scheduled.removed:
        return
    try:
        scheduled.report(passed, detail)
    except Exception:  # a reporting bug must not end the scheduler's thread
        log.exception("reporting a health check's result failed")
