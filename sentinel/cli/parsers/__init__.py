"""Each command group's argument parser, apart from its implementation.

A module here imports :mod:`sentinel.cli.options` and a few light modules, never the command's
implementation (:mod:`sentinel.cli.inspect`, :mod:`sentinel.cli.agent`...): each command names
its handler as ``"module:function"`` and the module is imported when that command runs.
"""

from sentinel.cli.parsers import (
    agent,
    auth,
    backup,
    collector,
    deps,
    devzk,
    doctor,
    failover,
    inspect,
    publish,
    rotation,
    service,
    shard,
    ui,
    watch,
)

# In the order of `sentinel --help`.
COMMAND_GROUPS = (
    devzk,
    inspect,
    publish,
    rotation,
    failover,
    service,
    watch,
    deps,
    doctor,
    shard,
    backup,
    auth,
    collector,
    agent,
    ui,
)
