"""Start real PostgreSQL servers on loopback: a primary, and streaming replicas of it.

The PostgreSQL auth backend's tests, the metric collector's ``postgres`` source and the demo's
``--postgres`` mode need real servers, started the way an operator would: ``initdb``,
``pg_ctl``, and ``pg_basebackup -R`` for a replica. Binaries are found in this order:
``SENTINEL_PG_BINDIR``, the newest Debian ``/usr/lib/postgresql/<version>/bin``, then ``PATH``.

PostgreSQL refuses to run as root; when this process is root the server commands run as the
``postgres`` system user (created by Debian's package) and the data directories belong to it.

Example::

    with LocalPostgres() as primary:
        replica = primary.add_replica()
        print(primary.dsn(), replica.dsn())   # libpq connection strings for the superuser
"""

from __future__ import annotations

import logging
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from sentinel.errors import PostgresNotInstalled, PostgresStartFailed
from sentinel.testing.zookeeper import free_ports

log = logging.getLogger(__name__)

DEBIAN_ROOT = Path("/usr/lib/postgresql")
INSTALL_HINT = "install Debian's package ('apt-get update && apt-get install postgresql')"
SUPERUSER = "postgres"
# Test and demo servers: small, quick to start, and replicas may connect over loopback.
SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "replica",
    "max_wal_senders": "5",
    "hot_standby": "on",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "'16MB'",
    "max_connections": "40",
    "log_min_messages": "warning",
}
HBA = """\
local all all trust
host all all 127.0.0.1/32 scram-sha-256
host replication all 127.0.0.1/32 scram-sha-256
"""


def find_bindir(env: dict[str, str] | None = None) -> Path:
    """Return the directory holding ``initdb``, ``pg_ctl`` and ``pg_basebackup``."""
    env = os.environ if env is None else env
    candidates: list[Path] = []
    if env.get("SENTINEL_PG_BINDIR"):
        candidates.append(Path(env["SENTINEL_PG_BINDIR"]))
    if DEBIAN_ROOT.is_dir():
        versions = [p for p in DEBIAN_ROOT.iterdir() if p.name.isdigit()]
        candidates += [p / "bin" for p in sorted(versions, key=lambda p: int(p.name), reverse=True)]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for bindir in candidates:
        if all((bindir / tool).is_file() for tool in ("initdb", "pg_ctl", "pg_basebackup")):
            return bindir
    raise PostgresNotInstalled(f"no PostgreSQL server binaries found: {INSTALL_HINT}")


class LocalPostgres:
    """One PostgreSQL server on a free loopback port, in a data directory of its own.

    A primary is created by ``start()`` (``initdb``); a replica by ``primary.add_replica()``
    (``pg_basebackup -R``, so it streams from the primary and is read-only). ``stop()`` removes
    every directory this server created; a primary's ``stop()`` stops its replicas first.
    """

    def __init__(self, *, bindir: Path | None = None, _primary: LocalPostgres | None = None):
        self.bindir = bindir or find_bindir()
        self.primary = _primary
        self.port = free_ports(1)[0]
        self.replicas: list[LocalPostgres] = []
        # The superuser's password is only for this throw-away server; replicas share it.
        self.password = _primary.password if _primary else secrets.token_urlsafe(18)
        self.base_dir = Path(tempfile.mkdtemp(prefix="sentinel-pg-"))
        self.data_dir = self.base_dir / "data"
        self.log_path = self.base_dir / "server.log"
        self._running = False
        self._owner = pwd.getpwnam(SUPERUSER) if os.geteuid() == 0 else None
        if self._owner:
            os.chown(self.base_dir, self._owner.pw_uid, self._owner.pw_gid)

    def __repr__(self) -> str:
        role = "replica" if self.primary else "primary"
        return f"LocalPostgres({role}, port={self.port}, running={self._running})"

    def __enter__(self) -> LocalPostgres:
        return self.start() if not self._running else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def dsn(
        self, user: str = SUPERUSER, password: str | None = None, dbname: str = "postgres"
    ) -> str:
        """A libpq connection string; the superuser's password when none is given."""
        password = self.password if password is None and user == SUPERUSER else password
        parts = [f"host={self.host}", f"port={self.port}", f"user={user}", f"dbname={dbname}"]
        if password is not None:
            parts.append(f"password={password}")
        return " ".join(parts)

    def _run(self, tool: str, *args: str, input_text: str | None = None) -> str:
        command = [str(self.bindir / tool), *args]
        if self._owner:
            command = ["runuser", "-u", SUPERUSER, "--", *command]
        env = {**os.environ, "PGPASSWORD": self.password, "LC_ALL": "C"}
        result = subprocess.run(
            command,
            input=input_text,
            capture_output=True,
            text=True,
            env=env,
            cwd=self.base_dir,
            check=False,
            timeout=120,
        )
        if result.returncode != 0:
            raise PostgresStartFailed(
                f"{tool} failed (exit {result.returncode}): {result.stderr.strip()[-2000:]}"
                f"{self._log_tail()}"
            )
        return result.stdout

    def _log_tail(self) -> str:
        try:
            return "\nserver log:\n" + "\n".join(self.log_path.read_text().splitlines()[-20:])
        except OSError:
            return ""

    def _write_as_owner(self, path: Path, text: str) -> None:
        path.write_text(text)
        if self._owner:
            os.chown(path, self._owner.pw_uid, self._owner.pw_gid)

    def start(self) -> LocalPostgres:
        """Create the cluster (primary) and start the server; returns ``self``."""
        if self.primary is None and not self.data_dir.exists():
            pwfile = self.base_dir / "pwfile"
            self._write_as_owner(pwfile, self.password + "\n")
            self._run(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                SUPERUSER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                f"--pwfile={pwfile}",
                "--encoding=UTF8",
                "--no-instructions",
            )
            pwfile.unlink()
            self._write_as_owner(self.data_dir / "pg_hba.conf", HBA)
            settings = "".join(f"{key} = {value}\n" for key, value in SERVER_SETTINGS.items())
            with (self.data_dir / "postgresql.conf").open("a") as conf:
                conf.write(settings)
        self._run(
            "pg_ctl",
            "start",
            "-w",
            "-t",
            "60",
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_path),
            "-o",
            f"-p {self.port} -k {self.base_dir}",
        )
        self._running = True
        log.info("PostgreSQL %s serving on %s:%d", self, self.host, self.port)
        return self

    def add_replica(self) -> LocalPostgres:
        """Start a streaming replica of this primary (``pg_basebackup -R``) and return it."""
        if self.primary is not None:
            raise PostgresStartFailed("a replica of a replica is not supported here")
        replica = LocalPostgres(bindir=self.bindir, _primary=self)
        try:
            replica._run(
                "pg_basebackup",
                "-h",
                self.host,
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                "-D",
                str(replica.data_dir),
                "-R",
                "-X",
                "stream",
                "--checkpoint=fast",
            )
            replica.start()
        except BaseException:
            replica.stop()
            raise
        self.replicas.append(replica)
        return replica

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (and a primary's replicas) and remove its directories."""
        for replica in self.replicas:
            replica.stop(mode)
        self.replicas.clear()
        if self._running:
            try:
                self._run("pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data_dir))
            except PostgresStartFailed as exc:
                log.warning("could not stop %s: %s", self, exc)
            self._running = False
        shutil.rmtree(self.base_dir, ignore_errors=True)
