"""The convergence fuzzer, short: three seeds in each watch mode, every fault kind once each.

Random changes of every kind on three services while the reader's connection is cut, paused
for less than its session, paused past it, or left alone; after each round the reader's cache
must equal a fresh read of ZooKeeper (:mod:`sentinel.testing.convergence`). The long run is
``python -m benchmarks.convergence`` (docs/reliability.md).
"""

from __future__ import annotations

import logging

import pytest

from sentinel.testing.convergence import FAULTS, ConvergenceFuzzer, FuzzSettings

pytestmark = [pytest.mark.integration, pytest.mark.faults]

# A short session keeps the expiry rounds short; the deck deals each fault kind once.
SETTINGS = FuzzSettings(instances=8, changes=(10, 30), session_timeout=2.0, converge_timeout=10.0)


@pytest.mark.parametrize("persistent", [False, True], ids=["one-shot", "persistent"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_cache_converges_to_a_fresh_read_after_every_round(zookeeper, seed, persistent):
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # every fault is a dropped connection
    with ConvergenceFuzzer(zookeeper.connect_string, seed, persistent, SETTINGS) as fuzzer:
        results = fuzzer.run(len(FAULTS))
    rerun = (
        f"python -m benchmarks.convergence --first-seed {seed} --seeds 1 --rounds {len(FAULTS)} "
        f"--mode {fuzzer.mode} --session-timeout {SETTINGS.session_timeout:g}"
    )
    print(f"seed {seed}, {fuzzer.mode}: rerun with {rerun}")
    assert sorted(r.fault for r in results) == sorted(FAULTS)
    assert all(sum(r.changes.values()) >= SETTINGS.changes[0] for r in results)
    failed = [(r.round, r.fault, r.differences) for r in results if not r.converged]
    assert not failed, f"seed {seed}, {fuzzer.mode}: rounds that did not converge: {failed}"
    # The faults were what they claim: only the long pause cost the session.
    assert all(r.fault_as_intended for r in results), [
        (r.round, r.fault, r.session_kept) for r in results
    ]
