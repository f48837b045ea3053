"""Several regions, one ZooKeeper ensemble each (``docs/regions.md``).

* :mod:`~sentinel.regions.config`: which region a client is in and how it reaches the others;
* :mod:`~sentinel.regions.identity`: which password goes to which region's ensemble;
* :mod:`~sentinel.regions.remotes`: the sessions to other regions, opened lazily, and their
  measured round-trip times;
* :mod:`~sentinel.regions.router`: which region answers a lookup the local one cannot.

A service's failover rule is :class:`~sentinel.registry.failover.Failover` (in its spec).
"""

from sentinel.regions.config import Region, Regions
from sentinel.registry.failover import LOCAL_ONLY, Failover

__all__ = ["LOCAL_ONLY", "Failover", "Region", "Regions"]
