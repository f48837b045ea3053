"""The cache's counters, shared by its worker, its followers and its read-through."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CacheStats:
    """Counters of the cache's work, for tests, benchmarks and operators."""

    decode_errors: int = 0
    read_throughs: int = 0
    negative_hits: int = 0
    resyncs: int = 0
    watch_events: int = 0
    auth_errors: int = 0
    session_events: dict[str, int] = field(default_factory=dict)  # by state reached
    throttled_reads: int = 0
    clients_write_failures: int = 0  # /clients entries refused; retried in the background
    over_limit: int = 0  # nodes left unread: their section passed MAX_SECTION_NODES or _BYTES
    # Whole states asked of the host agent: a delta that did not follow the state held (a gap
    # in its numbers, or one that did not decode), or a backlog past its bound.
    agent_whole_states_asked: int = 0
    # Protection from mass loss (sentinel.cache.protection): instances served that the
    # registry no longer lists, by service (replaced whole on each change), and episodes begun.
    protected: dict[str, int] = field(default_factory=dict)
    protection_episodes: int = 0
