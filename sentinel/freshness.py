"""How old published metrics may be before nothing trusts them: one number for the metric
policies, ``explain``/``sentinel resolve`` and ``sentinel doctor``.

A collector publishes each instance's metrics every :data:`DEFAULT_COLLECT_INTERVAL` seconds
unless configured otherwise (``interval``). Metrics not refreshed for
:data:`STALE_AFTER_INTERVALS` of those intervals mean the collector stopped, or cannot reach the
instance: the value still in ZooKeeper says how the instance was, not how it is (a replica whose
collector died at lag 0.1 s may be 50 s behind now). The metric policies therefore exclude such
an instance by default, and say so ("stale") when asked why.

Three intervals, not one: a collection may land up to a tenth of an interval late (jitter),
take up to its timeout, and fail once or twice (a slow scrape, a ZooKeeper reconnection)
without the collector being gone; the third missed publication is no longer bad luck.
"""

from __future__ import annotations

# The collector's default ``interval`` (seconds between two publications of one instance).
DEFAULT_COLLECT_INTERVAL = 10.0
# Publications an instance may miss before its metrics are stale.
STALE_AFTER_INTERVALS = 3
# The default ``max_age`` of the metric policies and ``sentinel doctor --stale-after``: 30 s.
METRICS_MAX_AGE = STALE_AFTER_INTERVALS * DEFAULT_COLLECT_INTERVAL
# The verdict explain() and ``sentinel resolve`` give an instance excluded for its metrics' age.
STALE = "stale"
