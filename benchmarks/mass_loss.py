"""Both failure modes of a mass expiry, measured: ``python -m benchmarks.mass_loss``.

What protection from mass loss (``CacheConfig(mass_loss_protection=...)``) trades: a *blip*,
where ZooKeeper expires many live publishers' sessions at once (the server paused past their
session timeout) and they register again as soon as it answers, against a *crash*, where the
publishers' processes died while it was paused and their instances never come back.

Each run pauses a ZooKeeper of its own for ``--pause`` seconds (publishers' sessions: 2 s), and
two readers with 30 s sessions (which outlive the pause) watch the service from when it is
resumed: one without protection (today's client) and one with it (``hold`` as given). Blips and
crashes alternate run by run. Per scenario the table gives how long the unprotected reader
missed at least one instance and had none at all, when the last instance was listed again
(blip) or whether any was (crash), the fewest instances the protecting reader served, and how
long it served instances the registry no longer listed.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable

from benchmarks.common import percentiles, report
from sentinel import CacheConfig, Sentinel
from sentinel.cache.protection import MassLossProtection
from sentinel.testing.helpers import PublisherProcess, wait_until
from sentinel.testing.zookeeper import LocalZooKeeper

SERVICE = "orders"
NAMESPACE = "/bench-mass-loss"
PUBLISHER_SESSION = 2.0
READER_SESSION = 30.0


def _observe(
    on: Sentinel, off: Sentinel, count: int, seconds: float, done: Callable[[int], bool]
) -> dict[str, float | int | None]:
    """Sample both readers every 2 ms from now for ``seconds`` at most, until ``done(listed by
    the unprotected reader)``; what each saw."""
    start = time.monotonic()
    missing_from = none_from = back_at = None
    missing = empty = protected_for = 0.0
    fewest, last = count, start
    while (now := time.monotonic()) - start < seconds:
        listed = len(off.cached_instances(SERVICE))
        served = on.cached_instances(SERVICE)
        step = now - last
        last = now
        if listed < count:
            missing += step
            missing_from = missing_from if missing_from is not None else now - start
        if listed == 0:
            empty += step
            none_from = none_from if none_from is not None else now - start
        if any(e.protected for e in served):
            protected_for += step
        fewest = min(fewest, sum(e.status == "up" for e in served))
        if missing_from is not None and done(listed):
            back_at = now - start
            break
        time.sleep(0.002)
    return {
        "missing": missing,
        "empty": empty,
        # Nothing missing at all: the deletions and re-creations reached the reader together.
        "back": 0.0 if missing_from is None else back_at,
        "fewest_served": fewest,
        "protected_for": protected_for,
    }


def _pause(zookeeper: LocalZooKeeper, seconds: float, meanwhile: Callable[[], None]) -> None:
    server = zookeeper.members[0]
    server.pause()
    try:
        meanwhile()
        time.sleep(seconds)
    finally:
        server.resume()


def _blip(
    zookeeper: LocalZooKeeper, on: Sentinel, off: Sentinel, count: int, pause: float
) -> dict[str, float | int | None]:
    publishers = []
    try:
        for i in range(count):
            client = Sentinel(
                zookeeper.connect_string,
                f"blip-{i}",
                NAMESPACE,
                session_timeout=PUBLISHER_SESSION,
                announce=False,
            ).start()
            publishers.append(client)
            client.register(SERVICE, "p", "127.0.0.1", 9000 + i, label=f"blip-{i}")
        _wait_listed(on, off, count)
        _pause(zookeeper, pause, lambda: None)
        return _observe(on, off, count, 20.0, lambda listed: listed == count)
    finally:
        for client in publishers:
            client.close()


def _crash(
    zookeeper: LocalZooKeeper,
    on: Sentinel,
    off: Sentinel,
    count: int,
    pause: float,
    hold: float,
) -> dict[str, float | int | None]:
    publishers = [
        PublisherProcess(
            zookeeper.connect_string, NAMESPACE, SERVICE, "p", f"crash-{i}", PUBLISHER_SESSION
        )
        for i in range(count)
    ]
    try:
        _wait_listed(on, off, count)

        def kill_all() -> None:
            for publisher in publishers:
                publisher.kill()

        _pause(zookeeper, pause, kill_all)
        # Watched past the hold: whether any instance came back, and how long the protecting
        # reader served the dead ones.
        return _observe(on, off, count, hold + 5.0, lambda listed: False)
    finally:
        for publisher in publishers:
            publisher.kill()


def _waited(condition: Callable[[], object], timeout: float, what: str) -> None:
    if wait_until(condition, timeout) is None:
        raise SystemExit(f"not within {timeout:g}s: {what}")


def _wait_listed(on: Sentinel, off: Sentinel, count: int) -> None:
    _waited(
        lambda: all(
            len(r.cached_instances(SERVICE)) == count
            and not any(e.protected for e in r.cached_instances(SERVICE))
            for r in (on, off)
        ),
        30,
        "every instance listed, none protected",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishers", type=int, default=8)
    parser.add_argument("--runs", type=int, default=4, help="of each scenario and pause")
    parser.add_argument("--pauses", default="3,6", help="seconds the server is paused")
    parser.add_argument("--hold", type=float, default=10.0, help="the protecting reader's")
    # A blip's run is watched for 20 s from the resumption; a crash's for the hold and 5 s.
    args = parser.parse_args()
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    logging.getLogger("sentinel").setLevel(logging.ERROR)
    pauses = [float(p) for p in args.pauses.split(",")]
    protection = MassLossProtection(hold=args.hold)
    samples: dict[tuple[str, float], list[dict[str, float | int | None]]] = {}
    with LocalZooKeeper() as zookeeper:
        setup = Sentinel(zookeeper.connect_string, "setup", NAMESPACE).start()
        setup.ensure_service(SERVICE)
        setup.close()
        readers = {
            name: Sentinel(
                zookeeper.connect_string,
                f"reader-{name}",
                NAMESPACE,
                session_timeout=READER_SESSION,
                announce=False,
                cache=CacheConfig(mass_loss_protection=config),
            ).start()
            for name, config in (("on", protection), ("off", None))
        }
        on, off = readers["on"], readers["off"]
        for reader in readers.values():
            reader.prefetch(SERVICE)
        for _ in range(args.runs):
            for pause in pauses:
                for scenario in ("blip", "crash"):  # alternated, so load falls on both alike
                    if scenario == "blip":
                        run = _blip(zookeeper, on, off, args.publishers, pause)
                    else:
                        run = _crash(zookeeper, on, off, args.publishers, pause, args.hold)
                    samples.setdefault((scenario, pause), []).append(run)
                    _waited(
                        lambda: (
                            not off.cached_instances(SERVICE) and not on.cached_instances(SERVICE)
                        ),
                        args.hold + 30,
                        "the service empty between runs",
                    )
        for reader in readers.values():
            reader.close()
    rows = []
    for (scenario, pause), runs in samples.items():

        def spread(field: str, runs: list[dict[str, float | int | None]] = runs) -> str:
            values = [r[field] for r in runs]
            if any(v is None for v in values):
                return f"never ({sum(v is None for v in values)}/{len(values)} runs)"
            stats = percentiles([float(v) for v in values])  # type: ignore[arg-type]
            return f"{stats['p50']:.2f} / {stats['max']:.2f}"

        rows.append(
            [
                scenario,
                f"{pause:g}",
                len(runs),
                spread("missing"),
                spread("empty"),
                spread("back"),
                min(int(r["fewest_served"] or 0) for r in runs),
                spread("protected_for"),
            ]
        )
    report(
        "mass_loss",
        f"Mass expiry of {args.publishers} publishers (sessions {PUBLISHER_SESSION:g} s), "
        f"seconds from the server's resumption, p50 / max of the runs; protecting reader: "
        f"hold {args.hold:g} s",
        [
            "scenario",
            "pause s",
            "runs",
            "unprotected: some missing",
            "unprotected: none left",
            "all listed again after",
            "protecting: fewest served",
            "protecting: served unlisted",
        ],
        rows,
        {
            "publishers": args.publishers,
            "hold": args.hold,
            "runs": {f"{s}@{p:g}": r for (s, p), r in samples.items()},
        },
    )


if __name__ == "__main__":
    main()
