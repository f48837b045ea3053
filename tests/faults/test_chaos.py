"""A short chaos run (``python -m benchmarks.chaos``): every kind of fault at least once,
random churn, the invariants checked all along; none may be violated."""

from __future__ import annotations

import pytest

from benchmarks.chaos import FAULTS, run

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.faults]


def test_a_short_chaos_run_violates_no_invariant():
    outcome = run(seconds=45, seed=11, checkpoint_every=25)
    assert set(outcome.faults) == set(FAULTS), outcome.faults
    assert outcome.checked > 1000, "too few lookups were checked against the bound to mean much"
    assert len(outcome.checkpoints) >= 2
    # One example a line, in full (a list would be cut short): the timelines explain them.
    assert not outcome.violations, "\n".join(outcome.examples)
    assert not outcome.lookup_errors, outcome.lookup_errors
    assert outcome.readers_alive and all(outcome.readers_alive.values()), outcome.readers_alive
    assert len(outcome.reader_lookups) == len(outcome.readers_alive)
    assert min(outcome.reader_lookups.values()) >= 1000, outcome.reader_lookups
