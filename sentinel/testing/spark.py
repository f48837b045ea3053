"""Start a real Spark standalone cluster on loopback: a master and workers, each a JVM of its own.

In local mode (``local[N]``) the tasks' Python workers hang off the driver's own JVM. A
standalone cluster runs an application as a deployment does: a master
(``org.apache.spark.deploy.master.Master``) and workers (``org.apache.spark.deploy.worker.Worker``)
are separate JVMs, each worker starts one executor JVM per application, and each executor forks
its own Python worker daemon. The ``pyspark`` wheel carries all of it (``bin/spark-class`` and
the jars), so the cluster runs the installation the driver uses: ``$SPARK_HOME`` when it is set,
else the ``pyspark`` package's directory, which is where ``pyspark`` itself looks. Java 17 or
later must be on ``PATH`` or in ``JAVA_HOME``.

Example::

    with LocalSparkCluster(workers=2) as cluster:
        spark = (SparkSession.builder.master(cluster.master_url)
                 .config(map=cluster.driver_conf)
                 .getOrCreate())

Every daemon listens on free ports of 127.0.0.1 and logs to a file under the cluster's
temporary directory (``master.log``, ``worker-1.log``...; executors' output is under
``work/``), which :meth:`LocalSparkCluster.stop` removes. Each daemon runs in a process group of
its own, so that stopping a worker also ends the executors it started, even when the worker had
to be killed. PySpark's Python worker daemon moves to a process group of its own, out of that
reach: it exits when its standard input, its executor's pipe, closes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sentinel.errors import SparkNotInstalled, SparkStartFailed
from sentinel.testing.zookeeper import free_ports

log = logging.getLogger(__name__)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
INSTALL_HINT = "install the 'spark' extra (pip install -e '.[spark]') and Java 17+"
# Read by the master and the workers from the cluster's own SPARK_CONF_DIR, so that a user's
# spark-defaults.conf does not reach them. A taken port fails the daemon (and the start begins
# again on new ports) rather than moving silently to the next one, away from master_url.
# The master's REST submission server is off: it would listen on the fixed port 6066.
DAEMON_DEFAULTS = {"spark.port.maxRetries": "0", "spark.master.rest.enabled": "false"}
DAEMON_MEMORY = "512m"  # heap of the master and worker JVMs: they only schedule
# Short-lived JVMs on a small machine: the client compiler only and one GC thread halve the CPU
# a cluster takes to start (measured: 28 s to 14 s of CPU for a master and two workers).
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
PORT_TAKEN = "Address already in use"  # in the log of a daemon whose port was taken
START_ATTEMPTS = 3


def find_spark_home(env: Mapping[str, str] | None = None) -> Path:
    """The Spark installation to run: ``$SPARK_HOME``, else the ``pyspark`` package's directory.

    Raises :class:`SparkNotInstalled` when neither holds ``bin/spark-class`` or no ``java``
    is found.
    """
    env = os.environ if env is None else env
    if env.get("SPARK_HOME"):
        home = Path(env["SPARK_HOME"])
    else:
        try:
            import pyspark
        except ImportError:
            raise SparkNotInstalled(f"pyspark is not installed: {INSTALL_HINT}") from None
        home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").is_file():
        raise SparkNotInstalled(f"{home} has no bin/spark-class: {INSTALL_HINT}")
    java_home = env.get("JAVA_HOME")
    if not (java_home and (Path(java_home) / "bin" / "java").is_file()) and not shutil.which(
        "java", path=env.get("PATH")
    ):
        raise SparkNotInstalled(f"no 'java' on PATH or in JAVA_HOME: {INSTALL_HINT}")
    return home


class SparkDaemon:
    """One master or worker JVM, started by ``bin/spark-class``, in a process group of its own."""

    def __init__(self, name: str, command: list[str], env: Mapping[str, str], log_path: Path):
        self.name = name
        self.log_path = log_path
        with open(log_path, "ab") as log_file:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=log_path.parent,
                start_new_session=True,
            )

    def __repr__(self) -> str:
        return f"<SparkDaemon {self.name} pid={self.pid}>"

    @property
    def pid(self) -> int:
        """The JVM's process id (spark-class execs the JVM, so it is the process started)."""
        return self._process.pid

    def _exited(self) -> bool:
        # waitid(WNOWAIT) looks without reaping (Popen.poll() would reap): see stop().
        if self._process.returncode is not None:
            return True
        return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def is_running(self) -> bool:
        """Whether the JVM has not exited."""
        return not self._exited()

    def log_text(self) -> str:
        """What the daemon logged so far."""
        try:
            return self.log_path.read_text("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        """The last lines the daemon logged, for error messages."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (a worker's shutdown hook ends its executors), SIGKILL after ``timeout``;
        then SIGKILL whatever is left of the process group (its executors; not their Python
        worker daemons, which leave the group and end with their executor), and reap the JVM."""
        if self._process.returncode is not None:
            return
        # The JVM stays unreaped until the sweep: an unreaped process keeps its pid, hence the
        # group's id, from being reused, so the sweep can only reach what this daemon started
        # (its executors), even after the JVM itself died.
        if not self._exited():
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while not self._exited() and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self._process.wait()


class LocalSparkCluster:
    """A Spark standalone cluster on 127.0.0.1: one master and ``workers`` workers.

    Each worker offers ``cores`` cores and ``memory`` to applications, so an application gets
    one executor per worker. A context manager: :meth:`start` waits until the master counts
    every worker alive; :meth:`stop` ends every JVM (the executors' too) and removes
    :attr:`directory`.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        cores: int = 1,
        memory: str = "1g",
        spark_home: Path | None = None,
    ) -> None:
        if workers < 1 or cores < 1:
            raise ValueError("a cluster needs at least one worker with at least one core")
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self._spark_home = spark_home
        self.directory = Path(tempfile.mkdtemp(prefix="sentinel-spark-"))
        self.daemons: list[SparkDaemon] = []
        self._master_port = self._web_port = 0

    def __enter__(self) -> LocalSparkCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<LocalSparkCluster {self.master_url} workers={self.workers}>"

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>``, for ``SparkSession.builder.master``."""
        return f"spark://127.0.0.1:{self._master_port}"

    @property
    def web_url(self) -> str:
        """The master's web UI (``/json/`` describes the cluster)."""
        return f"http://127.0.0.1:{self._web_port}"

    @property
    def driver_conf(self) -> dict[str, str]:
        """Settings for a driver on this machine: executors reach it on loopback; a job waits
        until every worker's executor has registered, so that all of them get tasks; the
        driver's and executors' JVMs are tuned as the daemons are (the driver's only when
        these settings launch it, as ``SparkSession.builder`` does)."""
        options = " ".join(JVM_OPTIONS)
        return {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.cores.max": str(self.workers * self.cores),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.driver.extraJavaOptions": options,
            "spark.executor.extraJavaOptions": options,
        }

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the worker JVMs (executors are their children)."""
        return [daemon.pid for daemon in self.daemons if daemon.name.startswith("worker")]

    def status(self, timeout: float = 2.0) -> dict[str, Any]:
        """The master's own description of the cluster (its web UI's ``/json/``)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=timeout) as answer:
            status: dict[str, Any] = json.load(answer)
        return status

    def _answer(self) -> dict[str, Any]:
        """The master's status; empty while it does not answer, or when what answers on its
        web port is not this cluster's master (the port was taken meanwhile)."""
        try:
            status = self.status(timeout=1.0)
        except (OSError, ValueError):
            return {}
        return status if status.get("url") == self.master_url else {}

    def alive_workers(self) -> int:
        """Workers the master counts alive (0 while it does not answer)."""
        return int(self._answer().get("aliveworkers", 0))

    def _environment(self, home: Path) -> dict[str, str]:
        conf_dir = self.directory / "conf"
        conf_dir.mkdir(exist_ok=True)
        defaults = "".join(f"{key} {value}\n" for key, value in DAEMON_DEFAULTS.items())
        (conf_dir / "spark-defaults.conf").write_text(defaults)
        return {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_DAEMON_JAVA_OPTS": " ".join(JVM_OPTIONS),
        }

    def _launch(self, home: Path, env: Mapping[str, str], deadline: float) -> None:
        """Start the master; once it serves, the workers (a worker that finds no master
        retries only 5 to 15 s later)."""
        master_port, web_port, *ports = free_ports(2 + 2 * self.workers)
        self._master_port, self._web_port = master_port, web_port
        spark_class = str(home / "bin" / "spark-class")
        loopback = ("--host", "127.0.0.1")
        command = [spark_class, MASTER_CLASS, *loopback, "--port", str(master_port)]
        command += ["--webui-port", str(web_port)]
        master = SparkDaemon("master", command, env, self.directory / "master.log")
        self.daemons = [master]
        self._wait(lambda: self._answer().get("status") == "ALIVE", deadline, "the master")
        for i in range(self.workers):
            work_dir = self.directory / "work" / f"worker-{i + 1}"
            work_dir.mkdir(parents=True, exist_ok=True)
            command = [spark_class, WORKER_CLASS, *loopback, "--port", str(ports[2 * i])]
            command += ["--webui-port", str(ports[2 * i + 1]), "--cores", str(self.cores)]
            command += ["--memory", self.memory, "--work-dir", str(work_dir), self.master_url]
            self.daemons.append(
                SparkDaemon(f"worker-{i + 1}", command, env, self.directory / f"worker-{i + 1}.log")
            )
        self._wait(
            lambda: self.alive_workers() == self.workers, deadline, "every worker to register"
        )

    def _wait(self, condition: Callable[[], bool], deadline: float, what: str) -> None:
        """Poll ``condition``; SparkStartFailed when a daemon exits or ``deadline`` passes."""
        while not condition():
            for daemon in self.daemons:
                if not daemon.is_running():
                    raise SparkStartFailed(
                        f"Spark {daemon.name} exited while starting; last output:\n"
                        f"{daemon.log_tail()}"
                    )
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {d.name}:\n{d.log_tail(10)}" for d in self.daemons)
                raise SparkStartFailed(
                    f"Spark at {self.master_url}: timed out waiting for {what} "
                    f"({self.alive_workers()} of {self.workers} workers alive); last output:\n"
                    f"{tails}"
                )
            time.sleep(0.1)

    def start(self, timeout: float = 90.0) -> LocalSparkCluster:
        """Start the master, then the workers, and wait until the master counts every worker
        alive; SparkStartFailed (with the daemons' last output) if that takes over ``timeout``
        seconds or a daemon exits. A port another process took between its choice and the
        daemon's bind costs a retry with new ports (twice at most). Every JVM started is
        stopped if the start fails."""
        home = self._spark_home or find_spark_home()
        env = self._environment(home)
        started = time.monotonic()
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._launch(home, env, started + timeout)
                break
            except SparkStartFailed:
                taken = any(PORT_TAKEN in daemon.log_text() for daemon in self.daemons)
                self._stop_daemons()
                if not taken or attempt == START_ATTEMPTS:
                    self.stop()
                    raise
                log.info("a Spark port was taken meanwhile; starting again on new ports")
            except BaseException:
                self.stop()
                raise
        log.info(
            "Spark standalone cluster at %s: %d worker(s) alive after %.1fs (%s)",
            self.master_url,
            self.workers,
            time.monotonic() - started,
            home,
        )
        return self

    def _stop_daemons(self) -> None:
        # Workers first: each ends its executors; the master has nothing left to hand out.
        for daemon in reversed(self.daemons):
            daemon.stop()
        self.daemons = []

    def stop(self) -> None:
        """Stop every worker (and their executors), then the master; remove the directory."""
        self._stop_daemons()
        shutil.rmtree(self.directory, ignore_errors=True)


__all__ = ["LocalSparkCluster"]
