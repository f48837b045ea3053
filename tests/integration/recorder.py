"""A listener that keeps what it hears, for tests that wait on events rather than sleeping."""

import threading


class Recorder:
    """Collects events from a listener; a test waits for the one, or the count, it expects."""

    def __init__(self):
        self.events = []
        self._changed = threading.Condition()

    def __call__(self, event):
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def wait(self, predicate, timeout=10.0):
        """The first event matching ``predicate``; fail after ``timeout`` seconds."""
        with self._changed:
            found = self._changed.wait_for(
                lambda: next((e for e in self.events if predicate(e)), None), timeout
            )
        assert found, f"no matching event within {timeout}s; got {self.events}"
        return found

    def wait_for(self, count, timeout=10.0):
        """The first ``count`` events; fail after ``timeout`` seconds."""
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.events) >= count, timeout), self.events
            return self.events[:count]
