"""The words an instance's ineligibility is described with, in one place.

``Sentinel.explain()`` gives each instance excluded for its status the verdict
:func:`status_verdict` says; :class:`~sentinel.errors.NoInstanceAvailable`, ``sentinel
resolve`` and ``sentinel doctor`` say the same words of a partition with none up
(:func:`none_up`). An instance whose status a readiness check set is named with that check and
the result it published with the status (``docs/health.md``): registered but failing its check
is told from stopped, starting or drained.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from typing import Protocol

#: How many distinct reasons :func:`none_up` lists before it counts the rest.
SHOWN_REASONS = 3


class Described(Protocol):
    """What the words need of an instance: an ``Endpoint`` or an ``InstanceRecord``."""

    @property
    def status(self) -> str: ...

    @property
    def check_name(self) -> str | None: ...

    @property
    def check_result(self) -> str | None: ...


def status_verdict(instance: Described) -> str:
    """Why an instance whose status is not ``up`` is not served: ``status draining``, or,
    when its readiness check set the status, ``status down: failing its readiness check GET
    /ready (status 503)``."""
    name = instance.check_name
    if name is None or instance.status not in ("down", "starting"):
        return f"status {instance.status}"
    if instance.status == "starting":
        return f"status starting: its readiness check {name} has no result yet"
    result = instance.check_result or "no result published"
    return f"status down: failing its readiness check {name} ({result})"


#: The verdict of the status step as a whole (``sentinel resolve --json``'s ``steps``); each
#: instance it excludes has its own, :func:`status_verdict`.
NOT_UP = "status not up"


#: A partition (or an unsharded service) that no instance is registered in.
NO_LIVE_INSTANCE = "has no live instance"


def nothing_up(instances: Sequence[Described]) -> str:
    """What a partition none of whose ``instances`` is up has: ``has no live instance``, or
    ``has 2 instance(s) but none is eligible: none is up; 2 status down: ...``."""
    if not instances:
        return NO_LIVE_INSTANCE
    count = len(instances)
    return f"has {count} instance(s) but none is eligible: none is up; {none_up(instances)}"


def none_up(instances: Iterable[Described]) -> str:
    """What instances none of which is up are, most common first: ``2 status down: failing
    its readiness check GET /ready (status 503)``; past SHOWN_REASONS reasons, a count."""
    counts = collections.Counter(status_verdict(i) for i in instances if i.status != "up")
    parts = [f"{n} {verdict}" for verdict, n in counts.most_common(SHOWN_REASONS)]
    if len(counts) > SHOWN_REASONS:
        parts.append(f"{len(counts) - SHOWN_REASONS} other reason(s)")
    return "; ".join(parts)


def failing_checks(instances: Iterable[Described]) -> list[str]:
    """The names of the readiness checks that hold instances down, each once, in order."""
    return list(
        dict.fromkeys(i.check_name for i in instances if i.status == "down" and i.check_name)
    )
