"""The benchmarks' pure accounting: superseded writes keep their real delay, several whole
runs of ``benchmarks.compare`` are summarised by median and spread, and the soak tells growth
from noise."""

import random

import pytest

from benchmarks.compare import aggregate, spread
from benchmarks.propagation import delays_of
from benchmarks.soak import judge
from benchmarks.zkcost import CHANGES, Fleet, extrapolate, per_client, shares


def _write(op: str, change_id: str, t: float, done: float) -> dict:
    return {"op": op, "id": change_id, "t": t, "done": done}


def test_a_superseded_write_counts_from_its_start_to_the_later_values_arrival():
    writes = [
        _write("metric", "lag-0", 10.000, 10.002),
        _write("metric", "lag-1", 10.020, 10.022),
        _write("metric", "lag-2", 10.040, 10.042),
    ]
    # lag-0 was overwritten before the reader read it: the reader went straight to lag-1.
    arrivals = {("metric", "lag-1"): 10.025, ("metric", "lag-2"): 10.045}
    measured = delays_of(writes, arrivals)
    assert measured.superseded == {"metric": 1}
    assert measured.rows["metric"] == pytest.approx([25.0, 5.0, 5.0])
    assert measured.rows["metric (after the call returned)"] == pytest.approx([23.0, 3.0, 3.0])


def test_a_superseded_write_takes_the_first_later_arrival_not_the_next_write():
    writes = [
        _write("auth", "auth-0", 1.0, 1.001),
        _write("auth", "auth-1", 1.010, 1.011),
        _write("auth", "auth-2", 1.020, 1.021),
    ]
    # Two values skipped; the reader's one read saw auth-2.
    measured = delays_of(writes, {("auth", "auth-2"): 1.030})
    assert measured.superseded == {"auth": 2}
    assert measured.rows["auth"] == pytest.approx([30.0, 20.0, 10.0])


def test_kinds_that_never_overwrite_a_node_must_all_arrive():
    writes = [_write("register", "new-0", 1.0, 1.001), _write("register", "new-1", 1.1, 1.101)]
    with pytest.raises(RuntimeError, match="never arrived"):
        delays_of(writes, {("register", "new-1"): 1.2})


def test_the_last_write_of_a_node_cannot_be_superseded():
    writes = [_write("metric", "lag-0", 1.0, 1.001), _write("metric", "lag-1", 1.1, 1.101)]
    with pytest.raises(RuntimeError, match="lag-1"):
        delays_of(writes, {("metric", "lag-0"): 1.01})


def _figures(ours, theirs, paper=None):
    ratio = theirs / ours if ours and theirs else None
    return {
        "lookup p50 (µs)": {"sentinel": ours, "curator": theirs, "ratio": ratio, "paper": paper}
    }


def test_runs_are_summarised_by_median_and_spread_with_the_factor_taken_run_by_run():
    runs = [_figures(0.2, 1.4), _figures(0.4, 1.2), _figures(0.3, 1.5), _figures(0.25, 1.3)]
    rows, summary = aggregate(runs)
    entry = summary["lookup p50 (µs)"]
    assert entry["sentinel"] == {"median": pytest.approx(0.275), "min": 0.2, "max": 0.4}
    assert entry["curator"] == {"median": pytest.approx(1.35), "min": 1.2, "max": 1.5}
    # Factors per run 7.0, 3.0, 5.0, 5.2: their median, not the ratio of the medians (4.91).
    assert entry["ratio"]["median"] == pytest.approx(5.1)
    assert entry["ratio"]["min"] == pytest.approx(3.0)
    assert rows[0] == (
        "lookup p50 (µs)",
        "0.28 (0.20-0.40)",
        "1.35 (1.20-1.50)",
        "x5.10 (x3.00-x7.00)",
        "-",
    )


def test_a_side_missing_from_every_run_is_a_dash_and_one_run_has_no_spread():
    rows, summary = aggregate([_figures(0.2, None, paper="< 20")])
    assert summary["lookup p50 (µs)"]["curator"] is None
    assert rows[0] == ("lookup p50 (µs)", "0.20", "-", "-", "< 20")


def test_spread_leaves_out_runs_without_the_figure():
    assert spread([None, 2.0, 4.0]) == {"median": 3.0, "min": 2.0, "max": 4.0}
    assert spread([None]) is None


def _cost_row(clients, watches, reads, reconnect_reads=0):
    counters = {"reads": reads, "read_bytes": 10 * reads, "bytes_sent": 0, "watches_fired": 0}
    row = {
        "mode": "one-shot",
        "clients": clients,
        "watches": watches,
        "sessions": clients + 1,
        **{kind: counters for kind in CHANGES},
    }
    if clients:
        row["reconnect"] = {**counters, "reads": reconnect_reads}
    return row


def test_zkcost_charges_each_client_its_share_above_the_writer_alone():
    rows = [
        _cost_row(0, 2, reads=1),
        _cost_row(10, 212, reads=11, reconnect_reads=90),
        _cost_row(50, 1052, reads=51, reconnect_reads=450),
    ]
    ten, fifty = per_client(rows)
    assert ten["watches"] == 21 and fifty["watches"] == 21
    assert ten["sessions"] == 1
    assert ten["metric"]["reads"] == 1 and ten["metric"]["read_bytes"] == 10
    assert ten["reconnect"]["reads"] == 9 and fifty["reconnect"]["reads"] == 9
    assert fifty["watches_held"] == 1052


def test_zkcost_spreads_clients_over_workers_evenly():
    assert shares(10, 4) == [3, 3, 2, 2]
    assert shares(1, 4) == [1, 0, 0, 0]
    assert sum(shares(200, 3)) == 200


def test_the_extrapolation_scales_the_measured_constants_and_divides_by_sharing_a_session():
    counters = {"reads": 1.0, "read_bytes": 150.0, "bytes_sent": 150.0, "watches_fired": 1.0}
    results = {
        "services": 3,
        "instances": 10,
        "server_memory": {"bytes_per_session": 4096.0, "bytes_per_watch": 128.0},
        "per_client": [
            {
                "watches": 63.0,
                "metric": counters,
                "register": {**counters, "reads": 2.0},
                "reconnect": {**counters, "reads": 69.0, "bytes_sent": 69.0 * 200},
            }
        ],
    }
    fleet = Fleet(
        hosts=10, processes_per_host=20, services_followed=5, instances=100, services=50, servers=2
    )
    rows = {name: (shared_not, shared) for name, shared_not, shared in extrapolate(results, fleet)}
    assert rows["sessions"] == ("200", "10")
    assert rows["watches held"] == (f"{200 * 5 * 201:,}", f"{10 * 5 * 201:,}")
    assert rows["followers of one service"] == ("20", "1.00")  # 200 x 5 / 50 services
    assert rows["reads for a reconnect storm (every session re-syncs)"][0] == f"{200 * 5 * 203:,}"


def test_the_extrapolation_refuses_constants_that_break_its_watch_formula():
    results = {"services": 3, "instances": 10, "per_client": [{"watches": 64.0}]}
    fleet = Fleet(1, 1, 1, 1, 1, 1)
    with pytest.raises(SystemExit, match="64"):
        extrapolate(results, fleet)


def _run(values_at) -> tuple[list[float], list[float]]:
    """A 30-minute soak's samples, one every 10 s."""
    times = [10.0 * i for i in range(181)]
    return times, [values_at(t) for t in times]


def test_the_soak_calls_a_steady_leak_growing_and_its_interval_holds_the_slope():
    """Over 100 runs (seeded): called growing in nearly all, the 95 % interval holding the
    true slope in 90 or more."""
    called = held = 0
    for seed in range(100):
        noise = random.Random(seed)
        times, values = _run(lambda t, n=noise: 50_000 + 5_000 * t / 3600 + n.gauss(0, 300))
        verdict = judge(times, values, 1 / 3, relative=True)
        low, high = verdict["ci_per_hour"]
        called += verdict["verdict"] == "growing"
        held += low < 5_000 < high
    assert called >= 95 and held >= 90, (called, held)


def test_the_soak_calls_a_warm_up_that_levels_off_and_bounded_churn_within_noise():
    noise = random.Random(2)
    # still warming up for 5 minutes after the warm-up fitted out
    times, warming = _run(lambda t: 40 + 30 * min(t / 900, 1) + noise.gauss(0, 1))
    assert judge(times, warming, 1 / 3, relative=False)["verdict"] != "growing"
    level = 25.0
    churned = []
    for _ in times:  # a table that fills and empties as instances come and go
        level = min(50.0, max(0.0, 0.5 * level + 12.5 + noise.gauss(0, 8)))
        churned.append(level)
    verdict = judge(times, churned, 1 / 3, relative=False)
    low, high = verdict["ci_per_hour"]
    assert verdict["verdict"] == "within noise" and low < 0 < high
