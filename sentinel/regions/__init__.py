"""Several regions, one ZooKeeper ensemble each (``docs/regions.md``).

* :mod:`~sentinel.regions.config`: which region a client is in and how it reaches the others.
"""

from sentinel.regions.config import Region, Regions

__all__ = ["Region", "Regions"]
