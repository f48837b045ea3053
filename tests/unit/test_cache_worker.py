"""The cache worker runs an event's read that the connection interrupted again after the
re-sync, and nothing else again."""

from __future__ import annotations

import threading

from kazoo.exceptions import ConnectionLoss, NoAuthError

from sentinel.cache.worker import CacheWorker, Task


class Reads:
    """Tasks that fail as told, recording each run; the re-sync fails while ``resync_fails``."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.failures: dict[str, list[Exception]] = {}
        self.resync_fails = False
        self.done = threading.Event()

    def read(self, name: str) -> None:
        self.runs.append(name)
        failures = self.failures.get(name)
        if failures:
            raise failures.pop(0)

    def resync(self) -> None:
        self.runs.append("resync")
        if self.resync_fails:
            raise ConnectionLoss()

    def mark(self) -> None:
        self.done.set()


def run_until_idle(worker: CacheWorker, reads: Reads) -> None:
    """Wait until the tasks queued so far, and those they queue, have run."""
    for _ in range(2):  # the second mark queues behind what ran before the first queued
        reads.done.clear()
        worker.put(Task(reads.mark))
        assert reads.done.wait(5)


def test_a_merged_read_interrupted_by_the_connection_runs_again_after_the_resync():
    reads = Reads()
    worker = CacheWorker(reads.resync, resync_jitter=0)
    worker.start()
    try:
        reads.failures = {"a": [ConnectionLoss()], "b": [ConnectionLoss()], "c": [NoAuthError()]}
        worker.merge(Task(reads.read, ("a",)))  # an event's read
        worker.put(Task(reads.read, ("b",)))  # a load's: its caller got the error
        worker.merge(Task(reads.read, ("c",)))  # refused, not interrupted
        run_until_idle(worker, reads)
        assert reads.runs == ["a", "b", "c"]

        reads.resync_fails = True  # interrupted again: kept for the next re-sync
        worker.put(Task(worker.schedule_resync))
        run_until_idle(worker, reads)
        assert reads.runs[3:] == ["resync"]

        reads.resync_fails = False
        worker.put(Task(worker.schedule_resync))
        run_until_idle(worker, reads)
        assert reads.runs[4:] == ["resync", "a"]

        worker.put(Task(worker.schedule_resync))  # it ran: not again
        run_until_idle(worker, reads)
        assert reads.runs[6:] == ["resync"]
    finally:
        assert worker.stop(lambda task: None, timeout=5)


def test_run_now_runs_on_the_calling_thread_and_leaves_the_rest_to_the_worker():
    reads = Reads()
    worker = CacheWorker(reads.resync, resync_jitter=0)
    assert not worker.run_now(Task(reads.read, ("early",)))  # not started: queue it
    worker.start()
    threads: dict[str, threading.Thread] = {}
    woken = threading.Event()

    def applied() -> None:
        threads["task"] = threading.current_thread()
        worker.later(told)
        assert worker._tasks.qsize() == 0  # the worker is woken once this task has ended

    def told() -> None:
        threads["told"] = threading.current_thread()
        woken.set()

    try:
        assert worker.run_now(Task(applied))
        assert threads["task"] is threading.current_thread() and "told" not in threads
        assert woken.wait(5) and threads["told"].name == "sentinel-cache"
        run_until_idle(worker, reads)
        assert worker.idle
        assert worker.run_now(Task(reads.read, ("nothing left",)))  # nothing to wake it for
        assert worker.idle and worker._tasks.qsize() == 0
    finally:
        assert worker.stop(lambda task: None, timeout=5)


def test_run_now_declines_while_the_worker_has_a_task_queued_or_running():
    reads = Reads()
    worker = CacheWorker(reads.resync, resync_jitter=0)
    worker.start()
    release = threading.Event()
    running = threading.Event()

    def busy() -> None:
        running.set()
        assert release.wait(5)

    try:
        worker.put(Task(busy))
        assert running.wait(5)
        # a task applied now would overtake the one running (and those queued behind it)
        assert not worker.idle and not worker.run_now(Task(reads.read, ("now",)))
        worker.merge(Task(reads.read, ("queued",)))
        release.set()
        run_until_idle(worker, reads)
        assert reads.runs == ["queued"] and worker.idle
        assert worker.run_now(Task(reads.read, ("now",)))
        assert reads.runs == ["queued", "now"]
    finally:
        release.set()
        assert worker.stop(lambda task: None, timeout=5)


def test_what_is_queued_before_run_nows_wake_up_runs_after_its_deferred_work():
    # A replacement: the new instance applied on kazoo's thread (its listeners deferred, the
    # worker woken when that thread lets go), the old one's removal queued meanwhile: the
    # listeners must hear of the new one first, or they see an empty service for a moment.
    reads = Reads()
    worker = CacheWorker(reads.resync, resync_jitter=0)
    worker.start()
    wake_ups: list = []

    def wake(run) -> bool:  # taken: given when kazoo's thread lets go of the interpreter
        wake_ups.append(run)
        return True

    try:
        assert worker.run_now(Task(lambda: worker.later(reads.read, "told")), wake=wake)
        worker.merge(Task(reads.read, ("queued meanwhile",)))
        worker.put(Task(reads.read, ("put meanwhile",)))
        assert worker._tasks.qsize() == 0  # all behind the wake-up not yet given
        [wake] = wake_ups
        wake()
        run_until_idle(worker, reads)
        assert reads.runs == ["told", "queued meanwhile", "put meanwhile"] and worker.idle
    finally:
        assert worker.stop(lambda task: None, timeout=5)
