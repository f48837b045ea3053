"""The demo's driver and its Spark job's gate when the driver's half fails: the driver's error is
the one the user sees, and the job's second half ends at once saying why (no ZooKeeper, no
Spark: the gate runs on a thread standing in for the job)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import sentinel.demo
from sentinel.demo.job import Gate

FIRST = "the first half of the job did not finish"


def _second_half(tmp_path: Path) -> tuple[Path, threading.Thread, list[BaseException]]:
    """A task of the job's second half, waiting at its gate on a thread; what it raised."""
    go = tmp_path / "go"
    gate = Gate(None, "orders-db", 1, str(go), str(tmp_path / "progress.jsonl"))  # type: ignore[arg-type]
    raised: list[BaseException] = []

    def task() -> None:
        try:
            gate(1, [])
        except Exception as exc:
            raised.append(exc)

    runner = threading.Thread(target=task, daemon=True)
    runner.start()
    return go, runner, raised


def test_a_failed_first_half_is_the_error_raised_and_the_second_half_ends_saying_why(tmp_path):
    """The driver's half failed: it was followed by the second half's tasks failing to read
    the empty file the driver released them with (a JSONDecodeError each, in Spark's output).
    Now they fail at once naming the driver's error, and the driver's error is raised."""
    go, runner, raised = _second_half(tmp_path)
    first = RuntimeError(FIRST)
    with pytest.raises(RuntimeError) as caught, sentinel.demo._driving(go, runner):
        raise first
    assert caught.value is first
    assert not runner.is_alive()
    assert len(raised) == 1 and type(raised[0]) is RuntimeError, raised
    assert str(raised[0]) == f"the driver stopped the job: RuntimeError: {FIRST}"


def test_a_job_that_does_not_end_does_not_hide_the_drivers_error(tmp_path, monkeypatch):
    """A job wedged (it does not end when released): the driver waited for it without a
    bound, and its error never came. Now it waits the demo's bound, then raises it."""
    monkeypatch.setattr(sentinel.demo, "WAIT", 0.2)
    wedged = threading.Event()
    runner = threading.Thread(target=wedged.wait, args=(30,), daemon=True)
    runner.start()
    first = RuntimeError(FIRST)
    seen: list[BaseException] = []

    def drive() -> None:
        try:
            with sentinel.demo._driving(tmp_path / "go", runner):
                raise first
        except RuntimeError as exc:
            seen.append(exc)

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        driver.join(10)
        assert seen == [first]
    finally:
        wedged.set()
