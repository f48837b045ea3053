"""Deprecated: the Spark integration moved to :mod:`sentinel.integrations.spark`.

This module re-exports it for one release and warns on import.
"""

import warnings

from sentinel.integrations.spark import *  # noqa: F403

warnings.warn(
    "sentinel.spark moved to sentinel.integrations.spark; the old name goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
