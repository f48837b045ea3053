"""The cache's one worker thread: its queue of tasks, their merging, and the re-sync's timing.

ZooKeeper's callbacks run on kazoo's thread, which must never block, so they only queue a
:class:`Task` naming what changed; the worker runs it. A task equal to one still queued is not
queued again: repeated events for one node coalesce into one read.

A task that needs no I/O may instead run on the thread that learnt of it (kazoo's, with the
node's read in hand, or a removal that needs none) when the worker is idle
(:meth:`CacheWorker.run_now`): the snapshot is served there, and what must run on the worker
(the listeners, which may call back into the client) runs there next: lookups see the change
without waiting for the worker to wake.

After a reconnection the re-sync starts after a random delay of up to ``resync_jitter``
seconds, so a fleet that reconnects together does not read together, and reconnections within
that delay share one. A merged task (an event's read of one node) that the connection's loss
interrupted runs again after the next re-sync: a session that resumes keeps its persistent
watches, and the server reports only what changed after the last zxid the client saw, which
may be past the change this read was for.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from sentinel.errors import ZooKeeperUnavailable
from sentinel.zk.errors import translate

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Task:
    """One piece of the worker's work: a bound method and its arguments.

    Equal tasks are equal values (a bound method equals another of the same object and
    function), so repeated events for one node merge while the first is still queued.
    ``changes_cache`` is False for work that only tells listeners.
    """

    run: Callable[..., None]
    args: tuple[Any, ...] = ()
    changes_cache: bool = True

    def __str__(self) -> str:
        return f"{self.run.__name__}{self.args}"


class _Deferred:
    """What a task run by :meth:`CacheWorker.run_now` left to the worker, in order."""

    __slots__ = ("tasks",)

    def __init__(self) -> None:
        self.tasks: list[Task] = []


class CacheWorker:
    """Runs a cache's tasks one at a time, in order, on a thread of its own.

    ``resync`` runs once per burst of reconnections, ``resync_jitter`` seconds at most after
    the first :meth:`schedule_resync`; ``on_change`` (if set) after every task that may have
    changed the cache, on the worker (it must not block). Every task runs inside
    ``around()`` (the cache's: its requests do not wait for a connection).
    """

    def __init__(
        self,
        resync: Callable[[], None],
        resync_jitter: float,
        around: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        self._resync = resync
        self._resync_jitter = resync_jitter
        self._around = around
        self._resync_at: float | None = None  # monotonic; only the worker touches it
        self._tasks: queue.SimpleQueue[Task | None] = queue.SimpleQueue()  # None: stop
        self._pending: set[Task] = set()
        self._pending_lock = threading.Lock()
        # Tasks queued or running (under _pending_lock): run_now runs only when there are none.
        self._outstanding = 0
        # Held by whoever runs a task, the worker or run_now's caller: one at a time.
        self._running = threading.Lock()
        self._deferred: _Deferred | None = None  # while run_now runs a task
        # Tasks queued while run_now's deferred work waits for its wake-up: queued after it.
        self._behind: list[Task] | None = None
        self._interrupted: set[Task] = set()  # merged tasks to run after the re-sync
        self._thread: threading.Thread | None = None
        self.on_change: Callable[[], None] | None = None

    def start(self) -> None:
        """Start the thread."""
        self._thread = threading.Thread(target=self._run, name="sentinel-cache", daemon=True)
        self._thread.start()

    def stop(self, dropped: Callable[[Task], None], timeout: float | None = None) -> bool:
        """Stop once the tasks queued so far have run, waiting ``timeout`` seconds at most
        (None: for as long as that takes); whether the thread has ended.

        A task reading from a session that cannot reconnect waits as long as the session
        does, so a caller that bounds the wait ends the session next (which fails that read)
        and then calls :meth:`join`.

        Called on the worker itself (a listener closing the client), it stops after the task
        it is running, unwaited for: a thread cannot join itself, and the tasks queued behind
        it would only read from the session being closed; each is handed to ``dropped``.
        """
        if self.on_worker():
            self._thread = None  # no longer the worker: it stops after this task (see _run)
            with contextlib.suppress(queue.Empty):
                while True:
                    task = self._tasks.get_nowait()
                    if task is not None:
                        with self._pending_lock:  # queued again after a start(): must be queued
                            self._pending.discard(task)
                            self._outstanding -= 1
                        dropped(task)
            return True
        self._tasks.put(None)
        return self.join(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a stopped thread to end, ``timeout`` seconds at most; whether it has."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return False
            self._thread = None
        return True

    def on_worker(self) -> bool:
        """Whether the calling thread is the worker (a listener, or a task, is running)."""
        return self._thread is threading.current_thread()

    def put(self, task: Task) -> None:
        """Queue ``task`` as it is (work that must not merge: a load, a listener's event)."""
        with self._pending_lock:
            self._outstanding += 1
            if self._behind is not None:  # after run_now's deferred work, not yet queued
                self._behind.append(task)
                return
        self._tasks.put(task)

    def merge(self, task: Task) -> None:
        """Queue ``task`` unless an equal one is queued and has not started."""
        with self._pending_lock:
            if task in self._pending:
                return
            self._pending.add(task)
            self._outstanding += 1
            if self._behind is not None:
                self._behind.append(task)
                return
        self._tasks.put(task)

    @property
    def idle(self) -> bool:
        """Started, and no task queued or running (:meth:`run_now` may run one)."""
        return self._thread is not None and not self._outstanding

    def run_now(self, task: Task, wake: Callable[[Callable[[], None]], bool] | None = None) -> bool:
        """Run ``task`` on the calling thread, now, if the worker is :attr:`idle`; False (and
        nothing done) otherwise: queue it then. For a task that does no I/O, from a thread that
        must not block (kazoo's): the worker's lock is only tried, never waited for.

        What the task leaves to the worker (:meth:`later`) runs there next, in order: the
        worker is woken once the task has ended, and only if it left something: by ``wake``
        when given and it takes the wake-up (``PersistentWatches.after_message``: when the
        calling thread is about to let go of the interpreter), else at once. (Woken while
        this thread still holds the interpreter, the worker would wake to wait for it and
        sleep again: on a loaded machine that second wake-up cost a millisecond.) Nothing
        queued meanwhile overtakes it: such tasks are held and queued right after it. An
        exception the task raises is logged, as the worker does.
        """
        with self._pending_lock:
            if not self.idle or self.on_worker() or not self._running.acquire(blocking=False):
                return False
            # counted until the deferred work is queued: a task queued meanwhile runs after it
            self._outstanding += 1
        deferred = self._deferred = _Deferred()
        try:
            with self._around():
                task.run(*task.args)
        except Exception:
            log.exception("cache task %s failed", task)
        finally:
            self._deferred = None
            if deferred.tasks:
                with self._pending_lock:
                    self._behind = []
                told = functools.partial(self._queue_deferred, deferred)
                if wake is None or not wake(told):
                    told()
            else:
                with self._pending_lock:
                    self._outstanding -= 1
            self._running.release()
        return True

    def later(self, run: Callable[..., None], *args: Any) -> None:
        """From a task: ``run(*args)`` on the worker, after the task. On the worker that is
        at once; from a task :meth:`run_now` runs, once it has ended."""
        deferred = self._deferred
        if deferred is None:
            run(*args)
        else:
            deferred.tasks.append(Task(run, args))

    def _queue_deferred(self, deferred: _Deferred) -> None:
        """Queue run_now's deferred work, then what was queued behind it meanwhile."""
        with self._pending_lock:
            behind, self._behind = self._behind or [], None
            self._tasks.put(Task(self._run_deferred, (deferred,)))
            for task in behind:
                self._tasks.put(task)

    def _run_deferred(self, deferred: _Deferred) -> None:
        for task in deferred.tasks:
            try:
                task.run(*task.args)
            except Exception:
                log.exception("cache task %s failed", task)

    def schedule_resync(self) -> None:
        """On the worker, after a reconnection: re-sync after the jitter; reconnections
        meanwhile share it."""
        if self._resync_at is None:
            self._resync_at = time.monotonic() + random.uniform(0, self._resync_jitter)

    @property
    def resync_due(self) -> bool:
        """A re-sync is scheduled and has not started."""
        return self._resync_at is not None

    def _next_task(self) -> Task | None:
        """The next queued task, or the re-sync once its jittered time has come."""
        if self._resync_at is None:
            return self._tasks.get()
        wait = self._resync_at - time.monotonic()
        with contextlib.suppress(queue.Empty):
            if wait > 0:
                return self._tasks.get(timeout=wait)
        self._resync_at = None
        with self._pending_lock:
            self._outstanding += 1
        return Task(self._resync_then_retry)

    def _resync_then_retry(self) -> None:
        """The re-sync, then the merged tasks interrupted before it (kept if it fails)."""
        self._resync()
        interrupted, self._interrupted = self._interrupted, set()
        for task in interrupted:
            self.merge(task)

    def _run(self) -> None:
        worker = threading.current_thread()
        # Until stop(), or a stop() from a listener on this thread (then a start() may have
        # begun another worker already).
        while self._thread is worker and (task := self._next_task()) is not None:
            with self._running:
                self._run_task(task)
                with self._pending_lock:
                    self._outstanding -= 1

    def _run_task(self, task: Task) -> None:
        with self._pending_lock:
            merged = task in self._pending
            self._pending.discard(task)
        try:
            with self._around():
                task.run(*task.args)
            if self.on_change is not None and task.changes_cache:
                self.on_change()
        except Exception as exc:
            if isinstance(translate(exc, ""), ZooKeeperUnavailable):
                if merged:
                    self._interrupted.add(task)
                log.info("%s interrupted by the connection; the re-sync will cover it", task)
            else:
                log.exception("cache task %s failed", task)
