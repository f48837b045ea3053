"""Each source's rate of queries to the agent's DNS server: a token bucket per source.

A source is what the server says it is (a loopback client's socket, another host's address);
:data:`MAX_SOURCES` of them are remembered, the least recently seen forgotten past that (a
source forgotten starts again with a full bucket: a flood from ever new sources is bounded by
what the server reads, not by this table). The check is a dictionary lookup and some
arithmetic: what a flood costs before anything of its packets is parsed.
"""

from __future__ import annotations

import time
from collections import OrderedDict

#: Sources remembered.
MAX_SOURCES = 4096


class Rates:
    """``rate`` queries a second from each source, ``burst`` at once. The owner's loop's
    alone (not thread-safe)."""

    def __init__(self, rate: float, burst: float) -> None:
        self._rate = rate
        self._burst = burst
        self._buckets: OrderedDict[object, list[float]] = OrderedDict()  # tokens, when

    def admit(self, source: object) -> bool:
        """Whether ``source`` may send one more query now (one token taken if so)."""
        now = time.monotonic()
        bucket = self._buckets.get(source)
        if bucket is None:
            if len(self._buckets) >= MAX_SOURCES:
                self._buckets.popitem(last=False)
            bucket = self._buckets[source] = [self._burst, now]
        else:
            self._buckets.move_to_end(source)
        tokens = min(self._burst, bucket[0] + (now - bucket[1]) * self._rate)
        bucket[1] = now
        if tokens < 1.0:
            bucket[0] = tokens
            return False
        bucket[0] = tokens - 1.0
        return True
