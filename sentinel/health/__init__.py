"""Health that follows the application: readiness checks and their damping.

:class:`HealthCheck` (:mod:`sentinel.health.checks`) is what ``Sentinel.register(...,
health=...)`` and the collector's ``health`` source take; see ``docs/health.md``.
"""

from sentinel.health.checks import HealthCheck

__all__ = ["HealthCheck"]
