"""Debian's nginx (1.22) in front of a Sentinel service through the agent's DNS, for the tests
of ``sentinel agent --dns``: the configuration docs/dns.md shows (A records resolved at
request time: a variable in ``proxy_pass``), rendered for the test's ports, and the process.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from tests.peers.foreground import ForegroundProcess

# The documented example's addresses, replaced by the test's own (docs/dns.md shows them).
DOCUMENTED_DNS = "127.0.0.1:8600"
DOCUMENTED_LISTEN = 8080
DOCUMENTED_SERVICE = "orders"
DOCUMENTED_PORT = 9000

# How long nginx keeps an answer (it would keep it for the answer's TTL without `valid`).
VALID = 1.0

CONFIG = """\
events {{}}

http {{
    # The agent's DNS; valid= overrides the answers' TTL (the agent's --dns-ttl, 5 s).
    resolver {dns} valid={valid:.0f}s ipv6=off;

    server {{
        listen 127.0.0.1:{listen};
        location / {{
            # A variable: nginx resolves the name when a request needs it, not once at start.
            set $backend {service}.sentinel;
            proxy_pass http://$backend:{port};
        }}
    }}
}}
"""

# nginx 1.27.3's (and NGINX Plus's) `upstream` that follows SRV records: Debian 12's 1.22
# refuses it.
UPSTREAM_CONFIG = """\
events {{}}

http {{
    resolver {dns} valid={valid:.0f}s ipv6=off;

    upstream {service} {{
        zone {service} 64k;
        # service={service} asks for _{service}._tcp.sentinel: SRV, ports and weights.
        server sentinel service={service} resolve;
    }}

    server {{
        listen 127.0.0.1:{listen};
        location / {{
            proxy_pass http://{service};
        }}
    }}
}}
"""


def config(dns: str, listen: int, service: str, port: int) -> str:
    """nginx's configuration: requests to 127.0.0.1:``listen`` go to ``service``'s
    instances (A records from the agent's DNS at ``dns``, host:port), all on ``port``."""
    return CONFIG.format(dns=dns, valid=VALID, listen=listen, service=service, port=port)


def documented_config() -> str:
    """The Debian-nginx configuration docs/dns.md shows."""
    return config(DOCUMENTED_DNS, DOCUMENTED_LISTEN, DOCUMENTED_SERVICE, DOCUMENTED_PORT)


def documented_upstream_config() -> str:
    """The nginx >= 1.27.3 configuration docs/dns.md shows (not run by Debian's nginx)."""
    return UPSTREAM_CONFIG.format(
        dns=DOCUMENTED_DNS, valid=VALID, listen=DOCUMENTED_LISTEN, service=DOCUMENTED_SERVICE
    )


def nginx_binary() -> str | None:
    """The nginx program (run.sh installs Debian's nginx-light), or None."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")


class Nginx(ForegroundProcess):
    """nginx run in the foreground, one process, with the configuration ``text``, which
    listens on 127.0.0.1:``listen`` (its pid file, logs and temporary files in a directory of
    its own). A context manager."""

    def __init__(self, text: str, listen: int) -> None:
        self.listen = listen
        binary = nginx_binary()
        if binary is None:
            raise FileNotFoundError("nginx is not installed (run.sh installs Debian's package)")
        directory = Path(tempfile.mkdtemp(prefix="nginx-"))
        (directory / "nginx.conf").write_text(text)
        command = [
            binary,
            "-p",
            f"{directory}/",
            "-c",
            str(directory / "nginx.conf"),
            "-e",
            "stderr",
            "-g",
            f"daemon off; master_process off; pid {directory}/nginx.pid;",
        ]
        super().__init__("nginx", command, directory)

    def check(self) -> subprocess.CompletedProcess[str]:
        """``nginx -t``: whether nginx accepts the configuration, and what it said."""
        return subprocess.run([*self._command, "-t"], capture_output=True, text=True)

    def start(self) -> Nginx:
        """Serve; returns once it accepts connections."""
        checked = self.check()
        if checked.returncode != 0:
            raise ValueError(f"nginx refuses its configuration:\n{checked.stderr}")

        def listening() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", self.listen)) == 0

        self._launch(listening, f"does not listen on {self.listen}")
        return self
