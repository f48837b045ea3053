"""The ``python`` source: a callable of your own, named by its dotted path (the plug-in point).

Configuration::

    [services.source]
    type = "python"
    callable = "mypackage.metrics:relay_queue"    # or "mypackage.metrics.relay_queue"
    [services.source.options]                     # extra keyword arguments (optional)
    queue = "active"

The callable is called as ``callable(endpoint, timeout=seconds, **options)`` with the
instance's :class:`~sentinel.registry.endpoint.Endpoint`, on a worker thread, and returns a mapping
of
metric name to number or string. Raise :class:`~sentinel.errors.SourceError` (or anything
else) to report a failure; honour ``timeout``, because a thread cannot be interrupted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

from sentinel.collector.options import Options
from sentinel.errors import SourceError
from sentinel.registry.endpoint import Endpoint


def resolve(target: str) -> Callable[..., Any]:
    """The object ``module:attr`` or ``module.attr`` names; ImportError or AttributeError."""
    module_name, sep, attribute = target.partition(":")
    if not sep:
        module_name, _, attribute = target.rpartition(".")
    obj: Any = import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return obj


class PythonSource:
    """Calls ``function(endpoint, timeout=..., **options)``."""

    type = "python"

    def __init__(self, function: Callable[..., Any], options: Mapping[str, Any]) -> None:
        self.function = function
        self.options = dict(options)

    @classmethod
    def from_options(cls, options: Options) -> PythonSource:
        """Read the ``[source]`` table; the callable is imported now, so a typo fails early."""
        target = options.string("callable")
        try:
            function = resolve(target)
        except (ImportError, AttributeError, ValueError) as exc:
            raise options.error("callable", f"cannot import {target!r}: {exc}") from None
        if not callable(function):
            raise options.error("callable", f"{target!r} is not callable")
        extra = options.table_of("options", None)
        return cls(function, {} if extra is None else extra.table)

    def collect(self, endpoint: Endpoint, timeout: float) -> Mapping[str, Any]:
        """Call the plug-in."""
        values = self.function(endpoint, timeout=timeout, **self.options)
        if not isinstance(values, Mapping):
            raise SourceError(f"{self.function!r} returned {type(values).__name__}, not a mapping")
        return values
