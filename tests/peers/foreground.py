"""A proxy the DNS tests run in the foreground (HAProxy, nginx), from a directory of its own:
started once it is ready, stopped with what it wrote on stderr, the directory removed."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

from sentinel.testing.helpers import wait_until


class ForegroundProcess:
    """``command`` run in the foreground; ``name`` in the errors. A context manager whose
    ``start`` is the subclass's: it calls :meth:`_launch` with its own readiness probe."""

    def __init__(self, name: str, command: list[str], directory: Path) -> None:
        self._name = name
        self._command = command
        self._directory = directory
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        raise NotImplementedError

    def _launch(self, ready: Callable[[], bool], not_ready: str) -> None:
        """Start the process and return once ``ready()``; RuntimeError saying ``not_ready``
        (or the exit) with the process's stderr if it is not within 10 s."""
        self._process = subprocess.Popen(
            self._command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

        def running_and_ready() -> bool:
            assert self._process is not None
            if self._process.poll() is not None:
                code = self._process.returncode
                raise RuntimeError(f"{self._name} exited ({code}): {self.stop()}")
            return ready()

        if wait_until(running_and_ready, 10) is None:
            raise RuntimeError(f"{self._name} {not_ready}: {self.stop()}")

    def stop(self) -> str:
        """End the process; returns what it wrote on stderr."""
        stderr = ""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.terminate()
            _, err = self._process.communicate(timeout=10)
            stderr = err.decode(errors="replace")
        shutil.rmtree(self._directory, ignore_errors=True)
        return stderr

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
