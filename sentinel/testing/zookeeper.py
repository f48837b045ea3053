"""Start real ZooKeeper servers on loopback: one standalone server, or an ensemble of several.

The CLI's development server, the test suite, the benchmarks and the demo all start ZooKeeper
through this module. It looks for a server in this order:

1. ``SENTINEL_ZK_CLASSPATH`` (an explicit Java classpath) or ``ZOOKEEPER_HOME`` (an Apache
   ZooKeeper release: its ``lib/`` and top-level jars);
2. Debian's ``zookeeper`` package (``/usr/share/java/zookeeper.jar``; its manifest lists the
   jars it needs, and the default NIO connection factory needs none of Netty's codecs);
3. the official ``zookeeper`` image through the ``docker`` package, when an engine answers
   (standalone servers only).

Example::

    with LocalZooKeeper() as zk:            # standalone, on a free loopback port
        print(zk.connect_string)            # "127.0.0.1:41233"

    with LocalZooKeeper(size=3) as zk:      # an ensemble; each member can be killed or paused
        zk.leader().kill()

    with LocalZooKeeper(tls=True, plaintext=False) as zk:   # TLS only (secureClientPort)
        Sentinel(zk.secure_connect_string, tls=zk.tls_client_config)

With ``tls=True`` each server also listens on a ``secureClientPort`` (Netty's connection
factory, which TLS needs) with a throwaway CA made at start (:mod:`sentinel.zk.certificates`):
PEM key and trust stores, a server certificate for ``localhost`` and ``127.0.0.1``, and a
client certificate for clients to present. ``tls_client_auth`` is ZooKeeper's
``ssl.clientAuth``: ``need`` (the default, as in ZooKeeper: a client without a certificate
signed by the CA is refused), ``want`` or ``none``. ``plaintext=False`` closes the plain port,
so that nothing can reach the server without TLS; readiness probes then speak TLS too.

``sasl_users={"publisher": "<password>", ...}`` turns on SASL DIGEST-MD5 authentication: a JAAS
file (mode 0600) with ZooKeeper's ``DigestLoginModule`` and those users, and the SASL provider,
so that clients with identity ``sasl:publisher:<password>`` get ``sasl:publisher`` ACL rights.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from sentinel.errors import LauncherError, ZooKeeperNotInstalled, ZooKeeperStartFailed
from sentinel.zk.certificates import LocalPki, make_local_pki, write_file
from sentinel.zk.tls import TlsConfig

log = logging.getLogger(__name__)

DEBIAN_JAR = Path("/usr/share/java/zookeeper.jar")
# Debian ships slf4j-simple separately; with it the server logs warnings instead of nothing.
DEBIAN_LOG_BINDING = Path("/usr/share/java/slf4j-simple.jar")
# Netty jars Debian's manifest leaves out but Netty's connection factory (TLS) needs: the SSL
# handler is a codec, and the transport resolves addresses. They come with libnetty-java, a
# dependency of the package.
DEBIAN_NETTY_JARS = tuple(
    Path(f"/usr/share/java/{name}.jar")
    for name in ("netty-codec", "netty-resolver", "netty-transport-native-unix-common")
)
NETTY_FACTORY = "org.apache.zookeeper.server.NettyServerCnxnFactory"
CLIENT_AUTH_CHOICES = ("need", "want", "none")
SASL_PROVIDER = "org.apache.zookeeper.server.auth.SASLAuthenticationProvider"
SASL_LOGIN_MODULE = "org.apache.zookeeper.server.auth.DigestLoginModule"
DOCKER_IMAGE = "zookeeper:3.8"
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
INSTALL_HINT = (
    "install Debian's package ('apt-get update && apt-get install zookeeper'), "
    "set ZOOKEEPER_HOME to an Apache ZooKeeper release, or start a Docker engine"
)
# A short tick keeps session timeouts of one second possible (the minimum is two ticks), which
# the tests and the fault benchmarks need; production ensembles keep their own settings.
DEFAULT_CONFIG = {
    "tickTime": "500",
    "initLimit": "20",
    "syncLimit": "10",
    "minSessionTimeout": "1000",
    "maxSessionTimeout": "60000",
    "maxClientCnxns": "0",
    "admin.enableServer": "false",
    "4lw.commands.whitelist": "*",
    "reconfigEnabled": "false",
}
# ZooKeeper keeps its last 500 committed proposals in memory for followers that catch up;
# multi-op shard-map writes of up to 512 KB each need far more than a small default heap.
JVM_OPTIONS = (
    "-Xmx1g",
    "-XX:+UseSerialGC",
    "-Djava.awt.headless=true",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
    "-Dzookeeper.preAllocSize=4096",
)
# For servers that live seconds to minutes (a test's): the JIT's client compiler alone, which
# about halves the CPU a server takes (docs/testing-history.md, "Shards, order and workers");
# added by the test suite, not by default, so that benchmarks measure the JVM as deployed.
CLIENT_COMPILER_ONLY = "-XX:TieredStopAtLevel=1"
#: The path of a class-data archive (:func:`write_class_archive`) that the test suite's
#: servers start with (``./run.sh test`` writes one per run).
CLASS_ARCHIVE_ENV = "SENTINEL_ZK_CLASS_ARCHIVE"


def short_lived_jvm_options(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """JVM options for servers that live seconds to minutes (a test's): the client compiler
    alone, and the class-data archive named by ``$SENTINEL_ZK_CLASS_ARCHIVE`` when it exists.
    Not the default, so that benchmarks measure the JVM as deployed."""
    archive = (os.environ if env is None else env).get(CLASS_ARCHIVE_ENV)
    shared = (f"-XX:SharedArchiveFile={archive}",) if archive and os.path.isfile(archive) else ()
    return (CLIENT_COMPILER_ONLY, *shared)


def write_class_archive(path: str | os.PathLike[str], timeout: float = 60.0) -> bool:
    """Write the classes a ZooKeeper server loads into an application class-data archive at
    ``path`` (one server started, used and stopped with the JVM's ``-XX:ArchiveClassesAtExit``);
    return whether the archive was written.

    A server started with ``-XX:SharedArchiveFile=path`` and the same class path maps those
    classes instead of reading and verifying them again: less CPU per start, which counts
    where hundreds of short-lived servers start (a test suite's; docs/testing-history.md). A JVM
    that cannot use the archive (another class path or JVM) starts as it would without it.
    """
    from kazoo.client import KazooClient

    target = Path(path)
    with LocalZooKeeper(jvm_options=(f"-XX:ArchiveClassesAtExit={target}",)) as zk:
        client = KazooClient(zk.connect_string)
        client.start(timeout)
        try:  # the request paths' classes too, not only start-up's
            client.create("/class-archive", b"x", ephemeral=True)
            client.get_children("/", watch=lambda event: None)
            client.set("/class-archive", b"y")
            client.delete("/class-archive")
        finally:
            client.stop()
            client.close()
    return target.is_file()


def four_letter_word(
    host: str, port: int, word: str, timeout: float = 1.0, context: ssl.SSLContext | None = None
) -> str:
    """Send a four-letter command (``ruok``, ``srvr``, ``mntr``...) and return the answer;
    over TLS with ``context`` (to a ``secureClientPort``)."""
    chunks = []
    with contextlib.ExitStack() as stack:
        conn = stack.enter_context(socket.create_connection((host, port), timeout=timeout))
        if context is not None:
            conn = stack.enter_context(context.wrap_socket(conn, server_hostname=host))
        conn.sendall(word.encode("ascii"))
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except ssl.SSLEOFError:  # the server closes without TLS's close_notify: the answer ended
            pass
    return b"".join(chunks).decode("utf-8", "replace")


def _wait_stopped(group: int, timeout: float) -> bool:
    """Whether every thread of every process in process group ``group`` is stopped (``T`` in
    ``/proc``) within ``timeout`` seconds; True at once where there is no ``/proc``."""
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for stat in proc.glob("[0-9]*/task/[0-9]*/stat"):
            with contextlib.suppress(OSError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == group:  # pgrp, after state and ppid
                    states.append(fields[0])
        if all(state in "Tt" for state in states):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def server_mode(
    host: str, port: int, timeout: float = 1.0, context: ssl.SSLContext | None = None
) -> str | None:
    """``standalone``, ``leader`` or ``follower`` while the server serves clients, else None."""
    try:
        answer = four_letter_word(host, port, "srvr", timeout, context)
    except OSError:
        return None
    for line in answer.splitlines():
        if line.startswith("Mode: "):
            return line.removeprefix("Mode: ").strip()
    return None


def free_ports(count: int) -> list[int]:
    """Ask the kernel for ``count`` distinct free loopback ports."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


@dataclass(frozen=True)
class Installation:
    """How to run a ZooKeeper server: a Java classpath, or a Docker image."""

    kind: str  # "java" or "docker"
    source: str  # where it was found, for messages
    java: str | None = None
    classpath: str | None = None
    image: str | None = None


def _java_binary(env: Mapping[str, str]) -> str | None:
    java_home = env.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    return shutil.which("java")


def _release_classpath(home: Path) -> str:
    jars = sorted(home.glob("*.jar")) + sorted((home / "lib").glob("*.jar"))
    if not jars:
        raise ZooKeeperNotInstalled(f"ZOOKEEPER_HOME={home} holds no jars in . or lib/")
    return os.pathsep.join([str(home / "conf"), *map(str, jars)])


def _docker_answers() -> bool:
    try:
        import docker
    except ImportError:
        return False
    try:
        docker.from_env(timeout=2).ping()
    except Exception:  # any failure means "no usable engine"; the caller says what to install
        return False
    return True


def find_installation(env: Mapping[str, str] | None = None) -> Installation:
    """Find a ZooKeeper server to run, in the module's documented order.

    Raises :class:`ZooKeeperNotInstalled` with what to install when there is none.
    """
    env = os.environ if env is None else env
    java = _java_binary(env)
    explicit = env.get("SENTINEL_ZK_CLASSPATH")
    home = env.get("ZOOKEEPER_HOME")
    if explicit or home:
        if java is None:
            raise ZooKeeperNotInstalled("no 'java' on PATH or in JAVA_HOME; install Java 11+")
        if explicit:
            return Installation("java", "SENTINEL_ZK_CLASSPATH", java, explicit)
        return Installation("java", f"ZOOKEEPER_HOME={home}", java, _release_classpath(Path(home)))
    if DEBIAN_JAR.is_file() and java is not None:
        extra = (DEBIAN_LOG_BINDING, *DEBIAN_NETTY_JARS)
        jars = [DEBIAN_JAR, *(jar for jar in extra if jar.is_file())]
        return Installation(
            "java", f"Debian package ({DEBIAN_JAR})", java, ":".join(map(str, jars))
        )
    if _docker_answers():
        return Installation("docker", f"Docker image {DOCKER_IMAGE}", image=DOCKER_IMAGE)
    missing = "Java" if DEBIAN_JAR.is_file() else "ZooKeeper"
    raise ZooKeeperNotInstalled(
        f"no ZooKeeper server to start ({missing} not found): {INSTALL_HINT}"
    )


class ZooKeeperServer:
    """One ZooKeeper server process: standalone, or one member of an ensemble.

    It can be stopped (SIGTERM), killed (SIGKILL), paused (SIGSTOP), resumed (SIGCONT) and
    restarted with the same data directory and ports, which is what fault tests need.
    ``client_port`` is None when the plain port is closed; ``secure_port`` is the TLS port
    (None without TLS), probed with ``probe_tls`` when there is no plain port.
    """

    def __init__(
        self,
        installation: Installation,
        directory: Path,
        myid: int,
        client_port: int | None,
        config: Mapping[str, str],
        *,
        secure_port: int | None = None,
        probe_tls: TlsConfig | None = None,
        jvm_options: tuple[str, ...] = (),
    ) -> None:
        self.installation = installation
        self.directory = directory
        self.myid = myid
        self.client_port = client_port
        self.secure_port = secure_port
        self._probe_context = None if probe_tls is None else probe_tls.ssl_context()
        self._jvm_options = jvm_options
        self._config = dict(config)
        self._process: subprocess.Popen[bytes] | None = None
        self._container = None

    def __repr__(self) -> str:
        ports = f"{self.client_port or '-'}/{self.secure_port or '-'}"
        return f"<ZooKeeperServer myid={self.myid} 127.0.0.1:{ports} pid={self.pid}>"

    @property
    def connect_string(self) -> str:
        """``host:port`` of this member's plain port; LauncherError when it is closed."""
        if self.client_port is None:
            raise LauncherError(
                f"member {self.myid} has no plain port (plaintext=False): "
                "use secure_connect_string over TLS"
            )
        return f"127.0.0.1:{self.client_port}"

    @property
    def secure_connect_string(self) -> str:
        """``host:port`` of this member's TLS port; LauncherError without TLS."""
        if self.secure_port is None:
            raise LauncherError(f"member {self.myid} was started without TLS (tls=True)")
        return f"127.0.0.1:{self.secure_port}"

    @property
    def _probe(self) -> tuple[int, ssl.SSLContext | None]:
        """The port readiness probes use, and their TLS context (None: plain)."""
        if self.client_port is not None:
            return self.client_port, None
        assert self.secure_port is not None
        return self.secure_port, self._probe_context

    @property
    def log_path(self) -> Path:
        """Where the server's own output goes."""
        return self.directory / "server.log"

    @property
    def config_path(self) -> Path:
        """The ``zoo.cfg`` this member runs with."""
        return self.directory / "zoo.cfg"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (None in Docker or when stopped)."""
        return self._process.pid if self._process and self._process.poll() is None else None

    def is_running(self) -> bool:
        """Whether the process (or container) exists; a paused server is still running."""
        if self._container is not None:
            self._container.reload()
            return self._container.status in ("running", "paused")
        return self._process is not None and self._process.poll() is None

    def mode(self, timeout: float = 1.0) -> str | None:
        """``standalone``/``leader``/``follower`` while serving, else None (``srvr``)."""
        port, context = self._probe
        return server_mode("127.0.0.1", port, timeout, context)

    def launch(self) -> None:
        """Start the process without waiting for it to serve (see :meth:`wait_serving`)."""
        if self.is_running():
            raise LauncherError(f"{self!r} is already running")
        data_dir = self.directory / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / "myid").write_text(f"{self.myid}\n")
        self._config["dataDir"] = str(data_dir)
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in self._config.items()))
        if self.installation.kind == "docker":
            self._launch_container()
            return
        command = [
            self.installation.java or "java",
            *JVM_OPTIONS,
            *self._jvm_options,
            "-cp",
            self.installation.classpath or "",
            MAIN_CLASS,
            str(self.config_path),
        ]
        with open(self.log_path, "ab") as log_file:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,
            )
        log.debug("started %r", self)

    def _launch_container(self) -> None:
        import docker

        self._container = docker.from_env().containers.run(
            self.installation.image,
            detach=True,
            ports={"2181/tcp": ("127.0.0.1", self.client_port)},
            environment={
                "ZOO_TICK_TIME": self._config["tickTime"],
                "ZOO_MAX_CLIENT_CNXNS": "0",
                "ZOO_4LW_COMMANDS_WHITELIST": "*",
                "ZOO_ADMINSERVER_ENABLED": "false",
            },
            labels={"sentinel.launcher": str(self.directory)},
        )

    def log_tail(self, lines: int = 30) -> str:
        """The last lines the server printed, for error messages."""
        if self._container is not None:
            return self._container.logs(tail=lines).decode("utf-8", "replace")
        try:
            text = self.log_path.read_text("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _data_directory_answering(self) -> str | None:
        """The data directory of the server answering on this member's port (None when it did
        not say): a port picked free can be picked by another launcher (another test worker)
        before either JVM binds it, and the one that lost the port then sees the other answer."""
        port, context = self._probe
        try:
            answer = four_letter_word("127.0.0.1", port, "conf", 0.5, context)
        except OSError:
            return None
        for line in answer.splitlines():
            if line.startswith("dataDir="):  # ZooKeeper appends its format's version-2
                return os.path.dirname(line.removeprefix("dataDir="))
        return None

    def wait_serving(self, timeout: float) -> str:
        """Wait until ``srvr`` reports a mode; ZooKeeperStartFailed if it dies or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            mode = self.mode(timeout=0.5)
            if mode is not None:
                if self.installation.kind == "docker":
                    return mode  # the container's data directory has a path of its own
                answering = self._data_directory_answering()
                if answering == str(self.directory / "data"):
                    return mode
                if answering is not None:
                    raise ZooKeeperStartFailed(
                        f"ZooKeeper member {self.myid}: the server answering on port "
                        f"{self._probe[0]} is another's (Address already in use)"
                    )
            if not self.is_running():
                raise ZooKeeperStartFailed(
                    f"ZooKeeper member {self.myid} exited while starting; last output:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.05)
        raise ZooKeeperStartFailed(
            f"ZooKeeper member {self.myid} did not serve on port {self._probe[0]} within "
            f"{timeout:.0f}s; last output:\n{self.log_tail()}"
        )

    def _signal(self, signum: signal.Signals) -> None:
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signum)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM), then kill if it has not exited within ``timeout``."""
        if self._container is not None:
            with contextlib.suppress(Exception):
                self._container.remove(force=True)
            self._container = None
            return
        if self._process is None:
            return
        self._signal(signal.SIGCONT)  # a paused JVM cannot handle SIGTERM
        self._signal(signal.SIGTERM)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._process = None

    def kill(self) -> None:
        """Kill at once (SIGKILL), as a crash would; the data directory stays for a restart."""
        if self._container is not None:
            self._container.kill()
            return
        if self._process is not None:
            self._signal(signal.SIGKILL)
            self._process.wait()

    def pause(self, timeout: float = 10.0) -> None:
        """Freeze the server (SIGSTOP): connections stay open but nothing answers. Returns
        once every thread of the server's process group is stopped: the signal is delivered
        asynchronously, and a thread still running could answer a request sent just after."""
        if self._container is not None:
            self._container.pause()
            return
        self._signal(signal.SIGSTOP)
        if self._process is not None and not _wait_stopped(self._process.pid, timeout):
            raise LauncherError(f"{self!r} did not stop within {timeout:g}s of SIGSTOP")

    def resume(self) -> None:
        """Thaw a paused server (SIGCONT)."""
        if self._container is not None:
            self._container.unpause()
        else:
            self._signal(signal.SIGCONT)

    def restart(self, timeout: float = 30.0) -> None:
        """Start again after stop or kill (same ports and data); wait until it serves."""
        if self._container is not None:
            self._container.start()
        else:
            self._process = None
            self.launch()
        self.wait_serving(timeout)


def _checked_sasl_users(users: Mapping[str, str]) -> dict[str, str]:
    """``users`` if each name and password can be written into a JAAS file as they are."""
    for user, password in users.items():
        if not user.isidentifier() or not password or any(c in password for c in '"\\\n'):
            raise ValueError(
                f"SASL user {user!r}: names are identifiers, passwords non-empty without quotes, "
                "backslashes or newlines"
            )
    return dict(users)


_running: set[LocalZooKeeper] = set()
_running_lock = threading.Lock()


@atexit.register
def _stop_leftovers() -> None:
    with _running_lock:
        leftovers = list(_running)
    for zk in leftovers:
        zk.stop()


class LocalZooKeeper:
    """A real ZooKeeper on loopback: standalone (``size=1``) or an ensemble (``size=3``).

    Servers get free ports and their own data directories under ``directory`` (a temporary
    directory by default, removed on :meth:`stop`). A context manager; servers it owns are
    also stopped when the interpreter exits, unless ``detach=True`` (the CLI's dev server).

    ``tls=True`` adds a TLS port to each server (:attr:`secure_connect_string`, with
    :attr:`tls_client_config` for clients); ``tls_client_auth`` is ``need``, ``want`` or
    ``none`` (ZooKeeper's ``ssl.clientAuth``); ``plaintext=False`` closes the plain port.
    ``sasl_users`` (user -> password) enables SASL DIGEST-MD5 logins for those users.
    ``jvm_options`` are added to every member's JVM command line.
    """

    def __init__(
        self,
        size: int = 1,
        *,
        directory: str | os.PathLike[str] | None = None,
        installation: Installation | None = None,
        config: Mapping[str, str] | None = None,
        detach: bool = False,
        tls: bool = False,
        plaintext: bool = True,
        tls_client_auth: str = "need",
        sasl_users: Mapping[str, str] | None = None,
        jvm_options: tuple[str, ...] = (),
    ) -> None:
        if size < 1:
            raise ValueError("an ensemble needs at least one server")
        if not plaintext and not tls:
            raise ValueError("a server without its plain port needs tls=True")
        if tls_client_auth not in CLIENT_AUTH_CHOICES:
            raise ValueError(f"tls_client_auth must be one of {', '.join(CLIENT_AUTH_CHOICES)}")
        if size > 1 and installation is not None and installation.kind == "docker":
            raise LauncherError("ensembles need a local ZooKeeper installation, not Docker")
        self.size = size
        self.detach = detach
        self._installation = installation
        self._owns_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="sentinel-zk-")).absolute()
        self._extra_config = dict(config or {})
        self.tls = tls
        self.plaintext = plaintext
        self.tls_client_auth = tls_client_auth
        self.pki: LocalPki | None = None
        self._sasl_users = _checked_sasl_users(sasl_users or {})
        self._jvm_options = tuple(jvm_options)
        self.members: list[ZooKeeperServer] = []

    def __enter__(self) -> LocalZooKeeper:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __iter__(self) -> Iterator[ZooKeeperServer]:
        return iter(self.members)

    @property
    def connect_string(self) -> str:
        """Comma-separated ``host:port`` of every member's plain port, for kazoo's ``hosts``
        (LauncherError when ``plaintext=False``)."""
        return ",".join(member.connect_string for member in self.members)

    @property
    def secure_connect_string(self) -> str:
        """Comma-separated ``host:port`` of every member's TLS port (LauncherError without
        ``tls=True``)."""
        return ",".join(member.secure_connect_string for member in self.members)

    @property
    def tls_client_config(self) -> TlsConfig:
        """What a client needs to connect over TLS: the CA, a client certificate and its key."""
        if self.pki is None:
            raise LauncherError("this ZooKeeper was not started with tls=True")
        return self.pki.client_config()

    def _tls_config(self, secure_port: int) -> dict[str, str]:
        """``zoo.cfg`` settings of a TLS port with the throwaway CA's PEM stores."""
        assert self.pki is not None
        return {
            "serverCnxnFactory": NETTY_FACTORY,
            "secureClientPort": str(secure_port),
            "secureClientPortAddress": "127.0.0.1",
            "ssl.keyStore.location": str(self.pki.server_keystore),
            "ssl.keyStore.type": "PEM",
            "ssl.trustStore.location": str(self.pki.ca),
            "ssl.trustStore.type": "PEM",
            "ssl.clientAuth": self.tls_client_auth,
            # Client certificates become x509 identities (the provider is not loaded by default).
            "authProvider.x509": "org.apache.zookeeper.server.auth.X509AuthenticationProvider",
        }

    def _sasl_setup(self) -> tuple[dict[str, str], tuple[str, ...]]:
        """``zoo.cfg`` settings and JVM options of SASL logins (none without ``sasl_users``)."""
        if not self._sasl_users:
            return {}, ()
        users = "".join(
            f'\n  user_{user}="{password}"' for user, password in self._sasl_users.items()
        )
        jaas = write_file(
            self.directory / "jaas.conf",
            f"Server {{\n  {SASL_LOGIN_MODULE} required{users};\n}};\n".encode(),
            0o600,
        )
        return {"authProvider.sasl": SASL_PROVIDER}, (f"-Djava.security.auth.login.config={jaas}",)

    def _member_configs(
        self, extra: Mapping[str, str]
    ) -> list[tuple[int | None, int | None, dict[str, str]]]:
        ports = free_ports((4 if self.tls else 3) * self.size)
        client_ports, quorum_ports = ports[: self.size], ports[self.size : 3 * self.size]
        secure_ports: list[int | None] = list(ports[3 * self.size :]) or [None] * self.size
        peers = {
            f"server.{myid}": f"127.0.0.1:{quorum_ports[2 * myid - 2]}:{quorum_ports[2 * myid - 1]}"
            for myid in range(1, self.size + 1)
        }
        members = []
        for client_port, secure_port in zip(client_ports, secure_ports, strict=True):
            config = {**DEFAULT_CONFIG, **extra}
            if self.plaintext:
                config.update(clientPort=str(client_port), clientPortAddress="127.0.0.1")
            if secure_port is not None:
                config.update(self._tls_config(secure_port))
            config.update(peers if self.size > 1 else {})
            config.update(self._extra_config)
            members.append((client_port if self.plaintext else None, secure_port, config))
        return members

    def start(self, timeout: float = 60.0) -> LocalZooKeeper:
        """Start every member and wait until all serve; retry once if a port was taken."""
        installation = self._installation or find_installation()
        if self.tls and installation.kind == "docker":
            raise LauncherError("TLS needs a local ZooKeeper installation, not Docker")
        if self.tls and self.pki is None:
            self.pki = make_local_pki(self.directory / "tls")
        probe_tls = None if self.pki is None else self.pki.client_config()
        sasl_config, sasl_options = self._sasl_setup()
        jvm_options = (*self._jvm_options, *sasl_options)
        for attempt in (1, 2):
            self.members = []
            for i, (port, secure_port, config) in enumerate(self._member_configs(sasl_config)):
                member_dir = self.directory / f"member-{i + 1}"
                if attempt > 1:
                    shutil.rmtree(member_dir, ignore_errors=True)  # nothing from a failed try
                self.members.append(
                    ZooKeeperServer(
                        installation,
                        member_dir,
                        i + 1,
                        port,
                        config,
                        secure_port=secure_port,
                        probe_tls=probe_tls,
                        jvm_options=jvm_options,
                    )
                )
            if not self.detach:
                with _running_lock:
                    _running.add(self)
            try:
                for member in self.members:
                    member.launch()
                deadline = time.monotonic() + timeout
                for member in self.members:
                    member.wait_serving(max(deadline - time.monotonic(), 1.0))
            except ZooKeeperStartFailed as exc:
                self.stop(remove_directory=False)
                if attempt == 2 or "Address already in use" not in str(exc):
                    raise
                log.info("a ZooKeeper port was taken meanwhile; retrying with new ports")
            else:
                break
        log.info(
            "ZooKeeper (%d member(s), %s) serving on %s%s",
            self.size,
            installation.source,
            self.connect_string if self.plaintext else "no plain port",
            f", TLS on {self.secure_connect_string}" if self.tls else "",
        )
        return self

    def leader(self, timeout: float = 30.0) -> ZooKeeperServer:
        """The member that leads (or the standalone server), waiting for an election."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for member in self.members:
                if member.mode(timeout=0.5) in ("leader", "standalone"):
                    return member
            time.sleep(0.05)
        raise LauncherError(f"no member of {self.connect_string} leads after {timeout:.0f}s")

    def stop(self, *, remove_directory: bool = True) -> None:
        """Stop every member; remove the directory if this object created it."""
        for member in self.members:
            member.stop()
        with _running_lock:
            _running.discard(self)
        if remove_directory and self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)


__all__ = ["LocalZooKeeper", "four_letter_word"]
