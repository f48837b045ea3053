"""The fan-out benchmark's pure parts: how clients are packed into OS processes, and what a
change's last process is over several changes."""

import pytest

from benchmarks.fanout import pack, summarize


def test_each_host_is_packed_in_os_processes_of_its_own():
    assert pack(2, 5, 2) == [(0, 2), (0, 2), (0, 1), (1, 2), (1, 2), (1, 1)]
    assert pack(50, 20, 20) == [(host, 20) for host in range(50)]


def test_a_total_keeps_the_first_clients_of_the_same_layout():
    assert pack(3, 4, 4, total=6) == [(0, 4), (1, 2)]
    assert sum(count for _, count in pack(50, 20, 20, total=999)) == 999


@pytest.mark.parametrize("bad", [(0, 1, 1), (1, 0, 1), (1, 1, 0)])
def test_an_empty_layout_is_refused(bad):
    with pytest.raises(ValueError, match="at least 1"):
        pack(*bad)


def test_the_last_process_is_the_slowest_of_each_change_and_summarised_over_changes():
    # Three changes of 100 processes: process i takes i ms, but a different one is the
    # straggler each time (its place in the list is not what makes it the last).
    changes = [[i / 1000 for i in range(100)] for _ in range(3)]
    for change, (process, delay) in zip(changes, [(7, 0.5), (42, 0.3), (99, 0.2)], strict=True):
        change[99], change[process] = change[process], delay  # 0..98 ms and the straggler
    figures = summarize(changes)
    assert figures["changes"] == 3 and figures["processes"] == 100
    assert [c["last"] for c in figures["per_change"]] == [0.5, 0.3, 0.2]
    assert figures["last"] == {"p50": 0.3, "p99": 0.5, "max": 0.5}
    # The straggler is one process in a hundred: p99 (nearest rank: the 99th of 100) is not it.
    assert [c["p99"] for c in figures["per_change"]] == [0.098, 0.098, 0.098]
    assert figures["p50"] == 0.049
    assert figures["worst_p99"] == 0.098


def test_the_median_of_the_last_process_is_the_middle_change_not_a_rounded_rank():
    figures = summarize([[0.001, d] for d in (0.010, 0.020, 0.030, 0.040, 0.050)])
    assert figures["last"]["p50"] == 0.030
    assert figures["last"]["max"] == 0.050
