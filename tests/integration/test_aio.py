"""sentinel.aio against the real ZooKeeper: events in order, a stalled consumer that never
delays the cache, and start, writes and close that never block the event loop."""

import asyncio
import logging
import re
import time
import weakref
from pathlib import Path

import pytest

from sentinel import Sentinel
from sentinel.aio import AsyncSentinel, EventsMissed
from sentinel.errors import ServiceNotFound
from sentinel.events import InstancesChanged
from sentinel.testing.helpers import TcpProxy, wait_until

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
# Loop lag tolerated while the client works off the loop: a loaded 2-core machine stays well
# under it; a blocking call over the slowed link below costs several times it.
LAG_BOUND = 0.1
LINK_DELAY = 0.01  # per relayed chunk, each way: a ZooKeeper round trip costs 20 ms


def weights(event):
    return [new.weight for _, new in getattr(event, "updated", ())]


async def released(ref, timeout=2.0):
    """Whether ``ref``'s object is freed within ``timeout``: the cache's worker thread may
    still hold the listener for the moment it takes to return from delivering an event."""
    deadline = time.monotonic() + timeout
    while ref() is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return ref() is None


def test_events_arrive_in_order_and_closing_the_stream_removes_its_listener(zookeeper, namespace):
    labels = [f"i{n}" for n in range(5)]

    async def main():
        async with AsyncSentinel(zookeeper.connect_string, "aio", namespace) as client:
            await client.ensure_service("api")
            received = []
            async with client.events("api") as events:  # follows "api" before any write
                first = None
                for n, label in enumerate(labels):
                    registration = await client.register(
                        "api", "p1", "127.0.0.1", 9000 + n, label=label
                    )
                    first = first or registration
                for weight in range(2, 7):
                    first = await client.update_registration(first, weight=weight)
                await client.deregister(first)
                async with asyncio.timeout(10):
                    async for event in events:
                        received.append(event)
                        if isinstance(event, InstancesChanged) and event.removed:
                            break
            feed = weakref.ref(events._feed)
            del events
            assert await released(feed), "the cache still holds the closed stream's listener"

            # A bare ``async for`` left by break: the dropped stream unlistens too.
            stream = client.events("api")
            feed = weakref.ref(stream._feed)
            await client.register("api", "p1", "127.0.0.1", 9100, label="late")
            async with asyncio.timeout(10):
                async for event in stream:
                    assert event.added[0].label == "late"
                    break
            del stream
            assert await released(feed)

            # A service it cannot follow ends the stream (closed, as above).
            stream = client.events("missing")
            with pytest.raises(ServiceNotFound):
                await anext(stream)
            assert await anext(stream, "ended") == "ended"

            # Closing the client ends a consumer that waits for an event; one consumer at a time.
            everything = client.events(None)
            waiting = asyncio.create_task(anext(everything, "ended"))
            await asyncio.sleep(0)  # it waits now (no service to follow first)
            with pytest.raises(RuntimeError, match="already waiting"):
                await anext(everything)
        assert await asyncio.wait_for(waiting, 5) == "ended"
        return received

    received = asyncio.run(main())
    assert all(isinstance(event, InstancesChanged) for event in received)  # nothing missed
    added = [e.label for event in received for e in event.added]
    assert added == labels
    seen = [w for event in received for w in weights(event)]
    # Coalesced maybe, never out of order. The last update may be folded into the removal
    # right after it (the node is gone when the cache reads it): then the removal follows the
    # last update seen, and nothing after it.
    assert seen == sorted(set(seen)) and set(seen) <= set(range(2, 7))
    assert [e.label for e in received[-1].removed] == [labels[0]]
    kinds = ["added" if e.added else "updated" if e.updated else "removed" for e in received]
    assert kinds == sorted(kinds, key=["added", "updated", "removed"].index)
    assert [e.label for e in received[-1].removed] == ["i0"]


def test_a_stalled_consumer_never_delays_the_cache_and_is_told_what_it_missed(
    make_client, zookeeper, namespace
):
    publisher = make_client("publisher")
    publisher.ensure_service("api")
    registration = publisher.register("api", "p1", "127.0.0.1", 9000, label="a")
    writes, held = 12, 4
    latencies, seen = [], []

    async def main():
        nonlocal registration
        async with (
            AsyncSentinel(zookeeper.connect_string, "slow", namespace) as client,
            client.events("api", maxsize=held) as events,
        ):
            arrived = {}

            def second_listener(event):  # sync, on the cache's worker thread
                seen.append(event)
                arrived.update(dict.fromkeys(weights(event), time.monotonic()))

            client.sync.listen("api", second_listener)
            # The consumer is stalled as badly as it gets: this coroutine blocks the loop
            # (a sync call in a coroutine) for every write and its arrival.
            for weight in range(2, 2 + writes):
                began = time.monotonic()
                registration = publisher.update_registration(registration, weight=weight)
                assert wait_until(lambda w=weight: w in arrived, 5) is not None
                latencies.append(arrived[weight] - began)
            # The loop runs again: the held events, the gap, then events as they come.
            async with asyncio.timeout(10):
                got = [await anext(events) for _ in range(held + 1)]
                await asyncio.to_thread(publisher.update_registration, registration, weight=99)
                got.append(await anext(events))
        return got

    got = asyncio.run(main())
    assert max(latencies) < 0.5, f"the second listener waited {max(latencies):.3f}s"
    assert len(seen) == writes + 1  # the second listener missed nothing
    assert [weights(e) for e in got[:held]] == [[w] for w in range(2, 2 + held)]
    assert got[held] == EventsMissed(writes - held)
    assert weights(got[-1]) == [99]


class _SlowSteps(logging.Handler):
    """The durations asyncio's debug mode reports for loop steps over its threshold."""

    def __init__(self) -> None:
        super().__init__()
        self.durations: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"took ([0-9.]+) seconds", record.getMessage())
        if found:
            self.durations.append(float(found.group(1)))


async def longest_step(work):
    """Run ``work()`` with asyncio's debug mode timing each step the loop runs (a callback, a
    task's step up to its next ``await``); the longest step over a quarter of the bound, 0
    if none, and how long the work took. A step is what holds the loop: a call that blocks
    shows as one long step, while the time the machine leaves the loop's thread unscheduled
    between steps (a loaded machine, other threads holding the interpreter) is in none."""
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = LAG_BOUND / 4
    steps = _SlowSteps()
    logging.getLogger("asyncio").addHandler(steps)
    try:
        began = time.monotonic()
        await asyncio.create_task(work())  # its steps are timed (and logged) apart from ours
        took = time.monotonic() - began
    finally:
        logging.getLogger("asyncio").removeHandler(steps)
    return max(steps.durations, default=0.0), took


def test_start_writes_and_close_never_block_the_loop(zookeeper, namespace, raw_zk, caplog):
    host, port = zookeeper.connect_string.split(":")
    proxy = TcpProxy(host, int(port), delay=LINK_DELAY)

    def client(kind):
        return kind(proxy.address, f"{kind.__name__.lower()}", namespace, prometheus_registry=None)

    async def blocking():  # the contrast: the sync client called on the loop
        with client(Sentinel) as sync:
            sync.ensure_service("api")

    async def awaited():
        async with client(AsyncSentinel) as aio:
            await aio.ensure_service("api")
            registration = await aio.register("api", "p1", "127.0.0.1", 9000)
            await aio.update_metrics(registration, {"lag": 1})
            await aio.prefetch("api")
            assert aio.get_service("api").port == 9000  # warm: a plain call
            await aio.deregister(registration, wait=0.01)

    async def cancelled_start():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(cancelled.start(), LINK_DELAY)

    try:
        cancelled = client(AsyncSentinel)
        with caplog.at_level(logging.INFO, logger="sentinel.client"):
            asyncio.run(cancelled_start())
        # The start ran to its end on its thread (it said it connected), and was undone.
        assert f"{proxy.address}{namespace} as asyncsentinel" in caplog.text
        assert cancelled.sync.connection_state == "closed"
        blocked, _ = asyncio.run(longest_step(blocking))
        held, took = asyncio.run(longest_step(awaited))
    finally:
        proxy.close()
    assert blocked > 2 * LAG_BOUND, f"the blocking start held the loop only {blocked:.3f}s"
    assert took > 2 * LAG_BOUND  # the work was long; the loop went on meanwhile
    assert held < LAG_BOUND, f"one step held the loop {held:.3f}s (blocking: {blocked:.3f}s)"


def test_deregister_waits_on_the_loop(zookeeper, namespace):
    async def main():
        async with AsyncSentinel(zookeeper.connect_string, "aio", namespace) as aio:
            first = await aio.register("api", "p1", "127.0.0.1", 9000)
            second = await aio.register("api", "p1", "127.0.0.1", 9001)
            began = time.monotonic()
            assert await aio.deregister(first, wait=0.2) is True
            assert time.monotonic() - began >= 0.2
            assert await aio.deregister(second) is True
            return (await aio.read_service("api")).instances

    assert asyncio.run(main()) == ()


def test_the_documented_example_runs_and_prints_what_it_says(zookeeper, namespace, capsys):
    section = DOC.read_text().split("\n## asyncio: `sentinel.aio`\n", 1)[1].split("\n## ", 1)[0]
    (example,) = re.findall(r"```python\n(.*?)```", section, re.S)
    exec(example, {"hosts": zookeeper.connect_string, "namespace": namespace})
    assert capsys.readouterr().out.split("\n") == ["joined: a", "8080", ""]
