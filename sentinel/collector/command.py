"""The ``command`` source: run a program per instance and read a JSON object from its stdout.

Configuration::

    [services.source]
    type = "command"
    command = ["/usr/local/bin/queue-depth", "--json"]   # or one string, split like a shell
    environment = ["PATH", "LANG", "PGSERVICEFILE"]     # default: PATH, LANG, LC_ALL, TZ, HOME
    max_output = 1048576                                 # bytes of stdout; default 1 MiB

The program gets an allow-listed environment, never the collector's own: the variables named
by ``environment`` that the collector has (default ``PATH``, ``LANG``, ``LC_ALL``, ``TZ``,
``HOME``), plus the instance's fields (``SENTINEL_SERVICE``, ``SENTINEL_PARTITION``,
``SENTINEL_LABEL``, ``SENTINEL_INSTANCE``, ``SENTINEL_HOST``, ``SENTINEL_PORT`` and every other
plain field of the endpoint: :func:`~sentinel.collector.source.instance_environment`).
``SENTINEL_*`` names cannot be allow-listed, so the collector's identity and keys
(``SENTINEL_ZK_IDENTITY``, ``SENTINEL_AUTH_KEY*``) never reach a command.

It must print one JSON object of metric name to number or string, and exit 0. It runs in a
process group of its own; when the collection's timeout passes, or it prints more than
``max_output`` bytes, the whole group (its children too) is killed and the collection fails.
Output is read in chunks, so the collector's memory stays bounded by ``max_output``.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from sentinel.collector.options import Options
from sentinel.collector.source import instance_environment
from sentinel.errors import SourceError, SourceTimeout
from sentinel.registry.endpoint import Endpoint

DEFAULT_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "TZ", "HOME")
DEFAULT_MAX_OUTPUT = 1024 * 1024
# Names a configuration may never pass on: the collector's own identity, keys and settings.
RESERVED_PREFIX = "SENTINEL_"
MAX_STDERR_SHOWN = 500
_CHUNK = 64 * 1024


class _OutputTooLarge(Exception):
    """Raised inside :meth:`CommandSource.collect` when stdout passes the cap."""


class CommandSource:
    """Runs ``command`` once per instance and collection."""

    type = "command"

    def __init__(
        self,
        command: tuple[str, ...],
        environment: tuple[str, ...] = DEFAULT_ENVIRONMENT,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> None:
        self.command = command
        self.environment = environment
        self.max_output = max_output

    @classmethod
    def from_options(cls, options: Options) -> CommandSource:
        """Read the ``[source]`` table."""
        value = options.get("command")
        if isinstance(value, str) and value.strip():
            command = tuple(shlex.split(value))
        else:
            command = options.strings("command")
        environment = options.get("environment", DEFAULT_ENVIRONMENT)
        if environment is not DEFAULT_ENVIRONMENT:
            if not isinstance(environment, list) or not all(
                isinstance(name, str) and name and "=" not in name for name in environment
            ):
                raise options.error(
                    "environment", f"expected a list of variable names, got {environment!r}"
                )
            reserved = [name for name in environment if name.startswith(RESERVED_PREFIX)]
            if reserved:
                raise options.error(
                    "environment",
                    f"{', '.join(reserved)}: {RESERVED_PREFIX}* variables are the collector's "
                    "own and are never passed to a command",
                )
            environment = tuple(environment)
        max_output = options.number("max_output", DEFAULT_MAX_OUTPUT, minimum=1)
        if not isinstance(max_output, int):
            raise options.error("max_output", f"expected a whole number of bytes, got {max_output}")
        return cls(command, environment, max_output)

    def environment_for(
        self, endpoint: Endpoint, parent: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """The command's whole environment: the allow-listed variables of ``parent`` (default
        the collector's) that are set, and the instance's ``SENTINEL_*`` fields."""
        parent = os.environ if parent is None else parent
        passed = {name: parent[name] for name in self.environment if name in parent}
        return {**passed, **instance_environment(endpoint)}

    def collect(self, endpoint: Endpoint, timeout: float) -> dict[str, Any]:
        """Run the command and parse its output."""
        name = self.command[0]
        deadline = time.monotonic() + timeout
        try:
            process = subprocess.Popen(
                self.command,
                env=self.environment_for(endpoint),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group, killed as one
            )
        except OSError as exc:
            raise SourceError(f"cannot run {name}: {exc}") from None
        try:
            stdout, stderr = self._read(process, deadline)
            returncode = process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._kill(process)
            raise SourceTimeout(f"{name} ran over {timeout:g}s and was killed") from None
        except _OutputTooLarge:
            self._kill(process)
            raise SourceError(
                f"{name} printed more than {self.max_output} bytes and was killed"
            ) from None
        except BaseException:
            self._kill(process)
            raise
        finally:
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        if returncode != 0:
            shown = stderr.decode("utf-8", "replace").strip()[-MAX_STDERR_SHOWN:]
            raise SourceError(f"{name} exited {returncode}: {shown}")
        try:
            document = json.loads(stdout)
        except (ValueError, RecursionError) as exc:
            raise SourceError(f"{name} printed no JSON: {exc.__class__.__name__}") from None
        if not isinstance(document, dict):
            raise SourceError(f"{name} printed {type(document).__name__}, not an object")
        return document

    def _read(self, process: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bytes]:
        """Read stdout (at most ``max_output`` bytes) and the tail of stderr until both end.

        Raises TimeoutExpired at the deadline and _OutputTooLarge past the cap; memory held is
        the cap plus one chunk, whatever the command prints.
        """
        assert process.stdout is not None and process.stderr is not None
        stdout = bytearray()
        stderr = bytearray()
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ, stdout)
            selector.register(process.stderr, selectors.EVENT_READ, stderr)
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise subprocess.TimeoutExpired(self.command, 0)
                for key, _ in selector.select(remaining):
                    chunk = os.read(key.fd, _CHUNK)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    buffer = key.data
                    buffer += chunk
                    if buffer is stdout and len(stdout) > self.max_output:
                        raise _OutputTooLarge
                    if buffer is stderr and len(stderr) > 2 * MAX_STDERR_SHOWN:
                        del stderr[: -2 * MAX_STDERR_SHOWN]
        return bytes(stdout), bytes(stderr)

    @staticmethod
    def _kill(process: subprocess.Popen[bytes]) -> None:
        """Kill the command's whole process group, then reap the command.

        The group is killed before the command is reaped, so its id cannot have been reused.
        """
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
