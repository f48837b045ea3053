"""Flap damping of a check's results: consecutive-result thresholds in both directions.

This is Consul's rule (``failures_before_critical`` / ``success_before_passing``): a state
changes only after ``failures_before_down`` failures in a row, or ``successes_before_up``
passes in a row, and any result of the other kind starts the count again. A state therefore
lasts at least that many intervals, which bounds the writes one instance can cause under any
noise to one per ``min(failures_before_down, successes_before_up)`` intervals, and an endpoint
that fails at random now and then rarely goes down: with 3 failures needed, 1 % of failures
takes it down once in a million results (docs/health.md works the numbers). The first
result sets the state at once: before it the state is unknown (the instance is published
``starting``, not served), and there is nothing to protect from a flap.
"""

from __future__ import annotations

UP = "up"
DOWN = "down"


class Damper:
    """The damped state of one check: feed it results with :meth:`observe`. Not thread-safe:
    one check's results arrive one at a time (the scheduler never runs a check twice at once)."""

    __slots__ = ("_failures_before_down", "_streak", "_successes_before_up", "state")

    def __init__(self, failures_before_down: int, successes_before_up: int) -> None:
        self._failures_before_down = failures_before_down
        self._successes_before_up = successes_before_up
        self._streak = 0  # results in a row that disagree with the state
        self.state: str | None = None  # None until the first result

    def observe(self, passed: bool) -> str | None:
        """Take one result; the new state if it changed (``up`` or ``down``), else None."""
        wanted = UP if passed else DOWN
        if self.state == wanted:
            self._streak = 0
            return None
        self._streak += 1
        needed = self._successes_before_up if passed else self._failures_before_down
        if self.state is not None and self._streak < needed:
            return None
        self.state, self._streak = wanted, 0
        return wanted
