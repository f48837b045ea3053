"""Old names kept for one release: each warns with :class:`DeprecationWarning` and calls the
new one, so code written against the previous release runs unchanged meanwhile."""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable
from typing import Any


def moved(old: str, new: str) -> Callable[..., Any]:
    """A method named ``old`` that warns and calls ``self.<new>`` (a dotted path: a role
    object's method, ``shard_maps.create``), with the same arguments."""
    target = operator.attrgetter(new)

    def alias(self: Any, *args: Any, **kwargs: Any) -> Any:
        warnings.warn(
            f"{type(self).__name__}.{old}() is deprecated: use .{new}() (the old name goes in "
            "the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return target(self)(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old
    alias.__doc__ = f"Deprecated: use ``{new}``, which takes the same arguments."
    return alias
