"""A ``sentinel ... --json`` daemon run as a real process, for the daemon tests."""

from __future__ import annotations

import json
import os
import subprocess
import threading

from sentinel.testing.zookeeper import LocalZooKeeper
from tests.conftest import SENTINEL


class Daemon:
    """A ``sentinel ... --json`` daemon process (acting as ``identity``, if given); its JSON
    lines are collected as they come."""

    def __init__(
        self,
        zookeeper: LocalZooKeeper,
        namespace: str,
        *args: str,
        identity: str | None = None,
        program: list[str] | None = None,
        user: list[str] | None = None,
    ):
        self.process = subprocess.Popen(
            [
                *(user or []),  # tests.integration.peers.as_user: to run as another user
                *(program or [SENTINEL]),
                *args,
                "--json",
                "--session-timeout",
                "2",
                "--zk",
                zookeeper.connect_string,
                "--namespace",
                namespace,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **({"SENTINEL_ZK_IDENTITY": identity} if identity else {})},
        )
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.events.append(json.loads(line))

    def saw(self, kind: str, **details: object) -> bool:
        return any(
            e["event"] == kind and all(e.get(k) == v for k, v in details.items())
            for e in self.events
        )

    def stop(self) -> str:
        """Kill the process; returns what it wrote on stderr."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(5)
        self.process.stdout.close()
        stderr = self.process.stderr.read()
        self.process.stderr.close()
        return stderr
