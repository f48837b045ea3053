"""A token bucket: at most ``rate`` events a second on average, ``burst`` at once.

Used to bound the reads a client sends ZooKeeper on its miss paths (Procedure 1's
read-through), so that a flood of unknown keys, or a whole fleet missing at once, costs the
ensemble a known number of reads per second and service.
"""

from __future__ import annotations

import threading
import time


class TokenBucket:
    """``take()`` succeeds at most ``burst`` times at once and ``rate`` times a second after.

    Thread-safe; the lock is held for a few arithmetic operations, never across I/O.
    """

    def __init__(self, rate: float, burst: float | None = None) -> None:
        if rate <= 0:
            raise ValueError("a token bucket needs a positive rate")
        self.rate = rate
        self.burst = max(burst if burst is not None else rate, 1.0)
        self._tokens = self.burst
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def take(self) -> bool:
        """Spend one token if there is one; False when the budget is used up."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True
