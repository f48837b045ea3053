"""Policies, balancers and credential backends by name, from the ``sentinel.policies`` /
``sentinel.balancers`` / ``sentinel.auth_backends`` entry points, so that the CLI and
configuration files can name third-party ones.

A package adds its own in its ``pyproject.toml``::

    [project.entry-points."sentinel.policies"]
    least_connections = "mypackage.policies:LeastConnections"
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from typing import Any, cast

from sentinel.errors import ValidationError
from sentinel.strategies import Balancer, Endpoints, SelectionPolicy

POLICIES = "sentinel.policies"
BALANCERS = "sentinel.balancers"
AUTH_BACKENDS = "sentinel.auth_backends"


def _entry_points(**selection: str) -> Any:
    # importlib.metadata loads only when a plug-in is asked for: `sentinel --help` and every
    # command that names none would pay for it at start.
    from importlib.metadata import entry_points

    return entry_points(**selection)


def available(group: str) -> list[str]:
    """The names registered in an entry-point group."""
    return sorted(ep.name for ep in _entry_points(group=group))


def load(group: str, name: str, **arguments: Any) -> Any:
    """Build the policy or balancer registered as ``name``, with ``arguments``.

    Raises :class:`ValidationError` for an unknown name (listing the known ones), or arguments
    its class does not take or refuses (its TypeError or ValueError).
    """
    found = _entry_points(group=group, name=name)
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


# Policies and balancers named in get_service's arguments, built once: scanning the entry points
# takes milliseconds, a lookup a microsecond. Built with no arguments, so one object serves
# every call that names it (a policy is stateless; a balancer is shared as the default one is).
_named: dict[tuple[str, str], Any] = {}

_POLICY_FORMS = (
    "a SelectionPolicy instance such as MinLag(cutoff=5), a callable from endpoints to "
    "endpoints, or the name of a registered policy"
)
_BALANCER_FORMS = "a Balancer instance such as RoundRobin(), or the name of a registered balancer"


def as_policy(value: object) -> SelectionPolicy | Callable[[Endpoints], Endpoints]:
    """A ``policy`` argument as the policy to apply: a policy instance or a callable as given,
    a registered name (``"min_lag"``, as the CLI takes) as the policy it names.

    Anything else (a class, a number, an unknown name) raises :class:`ValidationError` naming
    the accepted forms; the message shows the value's type, never a dump of it.
    """
    if isinstance(value, SelectionPolicy):
        return value
    if isinstance(value, str):
        return cast(SelectionPolicy, _by_name(POLICIES, "policy", value, _POLICY_FORMS))
    if callable(value) and not isinstance(value, type):
        return cast("Callable[[Endpoints], Endpoints]", value)
    raise ValidationError(_refusal("policy", value, _POLICY_FORMS, POLICIES))


def as_balancer(value: object) -> Balancer:
    """A ``balancer`` argument as the balancer to use: an instance (a :class:`Balancer`, or any
    object with a ``pick`` method) as given, a registered name (``"power_of_two"``) as the
    balancer it names. Anything else raises :class:`ValidationError` as :func:`as_policy`.
    """
    if isinstance(value, Balancer):
        return value
    if isinstance(value, str):
        return cast(Balancer, _by_name(BALANCERS, "balancer", value, _BALANCER_FORMS))
    if not isinstance(value, type) and callable(getattr(value, "pick", None)):
        return cast(Balancer, value)  # duck-typed: a pick method is all a balancer needs
    raise ValidationError(_refusal("balancer", value, _BALANCER_FORMS, BALANCERS))


def _by_name(group: str, what: str, name: str, forms: str) -> Any:
    built = _named.get((group, name))
    if built is None:
        if name not in available(group):
            raise ValidationError(_refusal(what, name, forms, group))
        built = _named.setdefault((group, name), load(group, name))
    return built


def _refusal(what: str, value: object, forms: str, group: str) -> str:
    """Why ``value`` is no ``what``: its short form (a class by name; reprlib bounds the rest,
    so an object holding endpoints is not dumped), the accepted forms and the known names."""
    if isinstance(value, type):
        shown = f"the class {value.__qualname__} (pass an instance: {value.__qualname__}(...))"
    elif isinstance(value, str):
        shown = f"{reprlib.repr(value)}, which no plug-in registers"
    else:
        shown = f"{reprlib.repr(value)} of type {type(value).__name__}"
    return f"{what}={shown}: give {forms} ({', '.join(available(group))})"


__all__ = ["load_balancer", "load_policy"]
