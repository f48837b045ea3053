"""A real HAProxy (Debian's package) in front of Sentinel services, configured only with the
agent's DNS, for the tests of ``sentinel agent --dns``: its configuration (the one
docs/dns.md shows, rendered for the test's ports), the process, its runtime API read on a
Unix stats socket (``show servers state``).
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.peers.foreground import ForegroundProcess

# The documented example's addresses, replaced by the test's own (docs/dns.md shows them).
DOCUMENTED_DNS = "127.0.0.1:8600"
DOCUMENTED_STATS = "/run/haproxy/sentinel.sock"
DOCUMENTED_SERVICES = {"orders": 8080}

# Server slots per backend: more than any test registers instances of one service.
SLOTS = 8

# HAProxy ignores the answers' TTL: its timers alone say when a change reaches it (seconds).
TIMEOUT_RESOLVE = 0.5  # between two queries for a name
TIMEOUT_RETRY = 0.5  # before a query without an answer is sent again
RESOLVE_RETRIES = 3  # queries sent before HAProxy acts on an error, an empty answer or NXDOMAIN
HOLD_OBSOLETE = 0.5  # how long a record gone from the answers keeps its server

# The seconds a change takes to reach HAProxy at most, past the agent's own: an instance
# added, at the next query; one gone (drained, down, deregistered), at the next query plus
# `hold obsolete`; a service's last one gone (an empty answer), after the retries HAProxy
# sends before it believes an empty answer.
ADDITION_BOUND = TIMEOUT_RESOLVE
REMOVAL_BOUND = TIMEOUT_RESOLVE + HOLD_OBSOLETE
EMPTIED_BOUND = TIMEOUT_RESOLVE + RESOLVE_RETRIES * TIMEOUT_RETRY

# `hold valid` <= `timeout resolve`, else a valid answer is reused that long; `hold nx` and
# `hold other` are how soon HAProxy asks again after NXDOMAIN or an empty answer (a service
# coming back); `hold timeout` keeps the servers while the agent does not answer at all (an
# agent restarting), `hold refused` while it refuses.
RESOLVERS = f"""\
resolvers sentinel
    # The agent's DNS over TCP: HAProxy does not retry a truncated UDP answer over TCP.
    nameserver agent tcp@{{dns}}
    accepted_payload_size 8192
    resolve_retries {RESOLVE_RETRIES}
    timeout retry {TIMEOUT_RETRY * 1000:.0f}ms
    # HAProxy ignores the answers' TTL: these timers alone say when a change reaches it.
    timeout resolve {TIMEOUT_RESOLVE * 1000:.0f}ms
    hold valid {TIMEOUT_RESOLVE * 1000:.0f}ms
    hold obsolete {HOLD_OBSOLETE * 1000:.0f}ms
    hold nx 500ms
    hold other 500ms
    hold refused 30s
    hold timeout 30s
"""

SERVICE = """\
frontend {service}
    bind 127.0.0.1:{port}
    default_backend {service}

backend {service}
    balance roundrobin
    server-template {service} {slots} _{service}._tcp.sentinel resolvers sentinel \
init-addr none resolve-opts allow-dup-ip resolve-prefer ipv4
"""

GLOBAL = """\
global
    stats socket {stats} mode 600 level admin

defaults
    mode http
    timeout connect 1s
    timeout client 10s
    timeout server 10s
"""


def config(dns: str, stats: str, services: dict[str, int], slots: int = SLOTS) -> str:
    """HAProxy's configuration: the agent's DNS at ``dns`` (host:port), the runtime API on
    the Unix socket ``stats``, and for each service a frontend on its port in ``services``
    whose backend holds ``slots`` servers from the service's SRV records."""
    return "\n".join(
        [
            GLOBAL.format(stats=stats),
            RESOLVERS.format(dns=dns),
            *(SERVICE.format(service=s, port=p, slots=slots) for s, p in services.items()),
        ]
    )


def documented_config() -> str:
    """The configuration docs/dns.md shows (a test checks the page holds it as written)."""
    return config(DOCUMENTED_DNS, DOCUMENTED_STATS, DOCUMENTED_SERVICES)


def haproxy_binary() -> str | None:
    """The haproxy program (run.sh installs Debian's package), or None."""
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")


# HAProxy's SRV_ADMF_* bits that hold a server out: maintenance (forced, inherited, from
# the configuration, from the resolver) and drain (forced, inherited).
OUT_OF_ROTATION = 0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x20


@dataclass(frozen=True)
class Server:
    """One server slot of a backend, as ``show servers state`` reports it."""

    name: str
    address: str  # "0.0.0.0" or "-" while the slot holds no record
    port: int
    weight: int  # the effective weight HAProxy balances by
    operational: int  # 0 stopped, 2 running (3 starting, 1 stopping)
    admin: int  # SRV_ADMF_* bits (OUT_OF_ROTATION; 0x40: its name came from DNS)

    @property
    def in_rotation(self) -> bool:
        return self.operational == 2 and not self.admin & OUT_OF_ROTATION


class HAProxy(ForegroundProcess):
    """HAProxy run in the foreground with :func:`config`'s configuration for the agent's DNS
    at ``dns`` and ``services`` (name -> frontend port), its stats socket in a directory of
    its own. A context manager."""

    def __init__(self, dns: str, services: dict[str, int]) -> None:
        binary = haproxy_binary()
        if binary is None:
            raise FileNotFoundError("haproxy is not installed (run.sh installs Debian's package)")
        directory = Path(tempfile.mkdtemp(prefix="haproxy-"))
        self.stats = str(directory / "stats.sock")
        self.config = config(dns, self.stats, services)
        (directory / "haproxy.cfg").write_text(self.config)
        super().__init__(
            "haproxy", [binary, "-db", "-f", str(directory / "haproxy.cfg")], directory
        )

    def start(self) -> HAProxy:
        check = subprocess.run([*self._command, "-c"], capture_output=True, text=True)
        if check.returncode != 0:
            raise ValueError(f"haproxy refuses its configuration:\n{check.stdout}{check.stderr}")
        self._launch(self._answers, "did not open its stats socket")
        return self

    def _answers(self) -> bool:
        try:
            self.command("show info")
        except OSError:
            return False
        return True

    def command(self, line: str) -> str:
        """One command of the runtime API; its whole answer."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(self.stats)
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def servers(self, backend: str) -> list[Server]:
        """Every server slot of ``backend`` (``show servers state``: a version line, a
        header of field names, a line per server)."""
        lines = self.command(f"show servers state {backend}").splitlines()
        header = lines[1].lstrip("# ").split()
        found = []
        for line in lines[2:]:
            if not line.strip():
                continue
            row = dict(zip(header, line.split(), strict=False))
            found.append(
                Server(
                    row["srv_name"],
                    row["srv_addr"],
                    int(row["srv_port"]),
                    int(row["srv_uweight"]),
                    int(row["srv_op_state"]),
                    int(row["srv_admin_state"]),
                )
            )
        return found

    def valid_answers(self) -> int:
        """How many valid answers HAProxy has had from the agent (``show resolvers``)."""
        answer = self.command("show resolvers sentinel")
        return int(re.search(r"^\s*valid:\s*(\d+)", answer, re.M).group(1))  # type: ignore[union-attr]

    def rotation(self, backend: str) -> dict[tuple[str, int], int]:
        """The servers ``backend`` sends requests to: (address, port) -> weight."""
        return {(s.address, s.port): s.weight for s in self.servers(backend) if s.in_rotation}
