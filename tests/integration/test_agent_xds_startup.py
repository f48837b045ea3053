"""``sentinel agent --xds`` where it cannot serve: one typed error naming the address, exit 4
(docs/cli.md), and no ``serving`` line before it."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator

import pytest

from sentinel.agent.xds import XdsServer
from sentinel.errors import AddressInUse

pytestmark = pytest.mark.integration


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another process (here, a socket of the test's) listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_an_xds_port_already_taken_is_one_error_before_anything_says_serving(cli, taken_port):
    directory = tempfile.mkdtemp(prefix="xds-taken-")
    address = f"127.0.0.1:{taken_port}"
    for output in ([], ["--json"]):
        result = cli("agent", "--socket", f"{directory}/agent.sock", "--xds", address, *output)
        assert result.returncode == 4, result
        assert "serving" not in result.stdout
        assert result.stderr.splitlines() == [
            f"sentinel: error: xDS: {address} is taken by another process: stop it, or give "
            "--xds another address (a Unix socket, unix:PATH, cannot be taken by another user)"
        ]
    os.rmdir(directory)  # nothing was made there


def test_the_xds_server_refuses_a_taken_port_with_a_typed_error(make_client, taken_port):
    agent = make_client("host-agent", announce=False, agent=False)
    with pytest.raises(AddressInUse, match=f"127.0.0.1:{taken_port} is taken"):
        XdsServer(agent, f"127.0.0.1:{taken_port}").start()


def test_an_agent_socket_another_agent_serves_is_exit_4_before_serving(cli, make_client):
    make_client().ensure_namespace()
    directory = tempfile.mkdtemp(prefix="agent-taken-")
    path = f"{directory}/agent.sock"
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(path)
        live.listen()
        result = cli("agent", "--socket", path)
    assert result.returncode == 4, result
    assert "serving" not in result.stdout
    assert result.stderr.splitlines() == [f"sentinel: error: an agent already serves {path}"]
    os.unlink(path)
    os.rmdir(directory)
