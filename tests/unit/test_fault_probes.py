"""The fault suite's own probes see every failure: an exception that is not a SentinelError is
a failed lookup (fault prober) or a violation (chaos runner), recorded with its type, and a
probe thread that died or stalled fails the test instead of reporting "0 failed"."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

import benchmarks.chaos
from benchmarks.chaos import Chaos, Outcome, _part_difference, exit_status
from sentinel.cache.stats import CacheStats
from sentinel.errors import NoInstanceAvailable
from sentinel.testing.helpers import wait_until
from tests.faults.conftest import Prober


class _FlakyClient:
    """Raises ``errors`` in turn on get_service, then answers."""

    connection_state = "connected"

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)

    def get_service(self, service: str, key: Any = None) -> str:
        if self.errors:
            raise self.errors.pop(0)
        return "endpoint"


def test_the_prober_counts_any_exception_as_a_failed_lookup_by_type():
    client = _FlakyClient(ValueError("boom"), KeyError("k"), NoInstanceAvailable("none"))
    with Prober(client, "svc", min_lookups=10) as prober:  # type: ignore[arg-type]
        pass
    assert prober.failed == 3
    assert prober.error_types == {"ValueError": 1, "KeyError": 1, "NoInstanceAvailable": 1}
    with pytest.raises(AssertionError, match="ValueError"):
        prober.check()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_prober_whose_thread_died_fails_its_check():
    client = _FlakyClient(SystemExit())  # not an Exception: it ends the thread
    with Prober(client, "svc", min_lookups=10) as prober:  # type: ignore[arg-type]
        pass
    assert prober.alive_at_exit is False
    with pytest.raises(AssertionError, match="died"):
        prober.check()


def test_a_healthy_prober_passes_its_check():
    with Prober(_FlakyClient(), "svc", min_lookups=10) as prober:  # type: ignore[arg-type]
        pass
    prober.check()
    assert prober.lookups >= 10


def test_a_chaos_reader_counts_any_exception_as_a_violation_with_its_type():
    outcome = Outcome()
    zk = SimpleNamespace(connect_string="127.0.0.1:1")  # never connected to
    chaos = Chaos(zk, seed=1, outcome=outcome)  # type: ignore[arg-type]
    client = _FlakyClient(TypeError("bad key"), OverflowError("big"))
    reader = SimpleNamespace(name="r", client=client, connected_since=None)
    thread = threading.Thread(target=chaos.lookups, args=(reader,), daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: outcome.reader_lookups["r"] >= 5, timeout=10)
        assert thread.is_alive(), "an exception ended the lookup thread"
    finally:
        chaos.stop.set()
        thread.join()
    assert outcome.lookup_errors == {"TypeError": 1, "OverflowError": 1}
    assert outcome.violations["lookup"] == 2
    assert any("TypeError" in example for example in outcome.examples)


def test_a_chaos_checkpoint_names_what_differs_between_the_cache_and_a_fresh_read():
    instance = ("p0", "db-2", "127.0.0.1", 8000, "up", 1)
    assert _part_difference("instances", {instance}, set()) == (
        f"instances: cache only [{instance!r}], fresh only []"
    )
    assert _part_difference("shard keys", {"k1": "p0", "k2": "p1"}, {"k1": "p1", "k2": "p1"}) == (
        "shard keys: 'k1' cache 'p0' fresh 'p1'"
    )
    assert _part_difference("metrics", {}, {"db-3": {"load": 0.5}}) == (
        "metrics: 'db-3' cache None fresh {'load': 0.5}"
    )


def test_a_chaos_checkpoint_tells_a_cache_that_catches_up_late_from_one_that_never_does(
    monkeypatch: pytest.MonkeyPatch,
):
    chaos = Chaos(SimpleNamespace(connect_string="127.0.0.1:1"), seed=1, outcome=Outcome())  # type: ignore[arg-type]
    client = SimpleNamespace(
        connection_state="connected",
        session_id=7,
        staleness=0.0,
        session=SimpleNamespace(cache=SimpleNamespace(stats=CacheStats(resyncs=3))),
    )
    reader = SimpleNamespace(name="proxied", client=client)
    fresh = [(set(), {}, {"k1": "p1"})]
    monkeypatch.setattr(benchmarks.chaos, "LATE_CONVERGENCE", 0.2)
    monkeypatch.setattr(benchmarks.chaos, "cached_view", lambda c, s: (set(), {}, {"k1": "p0"}))
    monkeypatch.setattr(benchmarks.chaos, "registry_view", lambda w, s: fresh[0])
    first = chaos._difference(reader, "db")  # type: ignore[arg-type]
    assert "shard keys: 'k1' cache 'p0' fresh 'p1'" in first
    assert "'connected', session 7" in first and "3 re-syncs" in first
    assert first.endswith("not caught up 0.2s later)")
    # Watched longer once a run only: the next difference is told without waiting.
    assert chaos._difference(reader, "db").endswith("0 decode errors)")  # type: ignore[arg-type]

    chaos.watched_late = False
    caught_up = threading.Timer(0.05, lambda: fresh.__setitem__(0, (set(), {}, {"k1": "p0"})))
    caught_up.start()
    late = chaos._difference(reader, "db")  # type: ignore[arg-type]
    assert "; caught up 0." in late and late.endswith("s later)"), late
    caught_up.join()


def test_the_chaos_run_passes_without_violations_and_the_broken_clients_only_with_some():
    clean, violated = Outcome(), Outcome()
    violated.violate("a", "r3 served after its deregistration")
    assert exit_status(clean, broken_client=False) == (0, "passed")
    assert exit_status(violated, broken_client=False)[0] == 1
    # The self-check: a broken client the checker finds nothing in fails, saying so.
    status, verdict = exit_status(clean, broken_client=True)
    assert status == 1 and verdict.startswith("SELF-CHECK FAILED")
    status, verdict = exit_status(violated, broken_client=True)
    assert status == 0 and "found 1 violations" in verdict
