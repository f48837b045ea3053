"""Policies, balancers and credential backends by name, from the ``sentinel.policies`` /
``sentinel.balancers`` / ``sentinel.auth_backends`` entry points, so that the CLI and
configuration files can name third-party ones.

A package adds its own in its ``pyproject.toml``::

    [project.entry-points."sentinel.policies"]
    least_connections = "mypackage.policies:LeastConnections"
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from sentinel.errors import ValidationError

POLICIES = "sentinel.policies"
BALANCERS = "sentinel.balancers"
AUTH_BACKENDS = "sentinel.auth_backends"


def available(group: str) -> list[str]:
    """The names registered in an entry-point group."""
    return sorted(ep.name for ep in entry_points(group=group))


def load(group: str, name: str, **arguments: Any) -> Any:
    """Build the policy or balancer registered as ``name``, with ``arguments``.

    Raises :class:`ValidationError` for an unknown name (listing the known ones), or arguments
    its class does not take or refuses (its TypeError or ValueError).
    """
    found = entry_points(group=group, name=name)
    if not found:
        raise ValidationError(f"no {group} entry named {name!r}; known: {available(group)}")
    factory = next(iter(found)).load()
    try:
        return factory(**arguments)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{group} {name!r}: {exc}") from None


def load_policy(name: str, **arguments: Any) -> Any:
    """A selection policy by name, e.g. ``load_policy("min_lag", cutoff=5)``."""
    return load(POLICIES, name, **arguments)


def load_balancer(name: str, **arguments: Any) -> Any:
    """A balancer by name, e.g. ``load_balancer("sticky", key="tenant-42")``."""
    return load(BALANCERS, name, **arguments)
