"""The ``command`` source: run a program per instance and read a JSON object from its stdout.

Configuration::

    [services.source]
    type = "command"
    command = ["/usr/local/bin/queue-depth", "--json"]   # or one string, split like a shell

The program gets the instance's fields in its environment (``SENTINEL_SERVICE``,
``SENTINEL_PARTITION``, ``SENTINEL_LABEL``, ``SENTINEL_INSTANCE``, ``SENTINEL_HOST``,
``SENTINEL_PORT``, ``SENTINEL_SCHEME``, ``SENTINEL_URI``, ``SENTINEL_STATUS``,
``SENTINEL_ZONE``) and must print one JSON object of metric name to number or string, and exit
0. It is killed when the collection's timeout passes.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from typing import Any

from sentinel.collector.options import Options
from sentinel.collector.source import instance_environment
from sentinel.endpoint import Endpoint
from sentinel.errors import SourceError, SourceTimeout

MAX_STDERR_SHOWN = 500


class CommandSource:
    """Runs ``command`` once per instance and collection."""

    type = "command"

    def __init__(self, command: tuple[str, ...]) -> None:
        self.command = command

    @classmethod
    def from_options(cls, options: Options) -> CommandSource:
        """Read the ``[source]`` table."""
        value = options.get("command")
        if isinstance(value, str) and value.strip():
            return cls(tuple(shlex.split(value)))
        return cls(options.strings("command"))

    def collect(self, endpoint: Endpoint, timeout: float) -> dict[str, Any]:
        """Run the command and parse its output."""
        try:
            result = subprocess.run(
                self.command,
                env={**os.environ, **instance_environment(endpoint)},
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SourceTimeout(f"{self.command[0]} ran over {timeout:g}s and was killed") from None
        except OSError as exc:
            raise SourceError(f"cannot run {self.command[0]}: {exc}") from None
        if result.returncode != 0:
            raise SourceError(
                f"{self.command[0]} exited {result.returncode}: "
                f"{result.stderr.strip()[-MAX_STDERR_SHOWN:]}"
            )
        try:
            document = json.loads(result.stdout)
        except ValueError as exc:
            raise SourceError(f"{self.command[0]} printed no JSON: {exc}") from None
        if not isinstance(document, dict):
            raise SourceError(f"{self.command[0]} printed {type(document).__name__}, not an object")
        return document
