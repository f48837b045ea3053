"""The host agent as an attacker and a careless neighbour would try it (docs/agent.md, "Trust";
docs/auth.md, threat model): on a namespace secured by the CLI, a rotation counts an
agent-fed process exactly as one with its own session, a local peer speaks only for its own
process, a process sends nothing to a listener it does not trust, every answer is read-checked
as the asking identity, junk identities lock nobody out, and the documented examples admit
exactly the users and groups they name."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kazoo.client import KazooClient
from kazoo.security import make_digest_acl

from sentinel import Sentinel
from sentinel.agent.identities import MAX_IDENTITY_SESSIONS_PER_PEER
from sentinel.agent.server import AgentServer
from sentinel.agentlink import protocol
from sentinel.auth import ClientKeyring
from sentinel.auth.backends import FileBackend
from sentinel.auth.config import AuthConfig
from sentinel.auth.entries import confirmation_owners, live_processes
from sentinel.errors import AccessDenied, AgentNotTrusted, RotationFailed, SentinelError
from sentinel.events import AuthChanged
from sentinel.registry.layout import client_path, instance_path, sanitize_name
from sentinel.registry.records import ClientRecord, InstanceRecord, ServiceSpec
from sentinel.settings import default_client_id
from sentinel.shards.spec import policy_path
from sentinel.telemetry import AGENT_IDENTITIES_REFUSED
from sentinel.testing.helpers import wait_until
from tests.integration import test_attacks
from tests.integration.daemons import Daemon
from tests.integration.peers import as_user
from tests.integration.test_attacks import SERVICE, SecuredNamespace

secured = test_attacks.secured  # the fixture: a namespace secured by the CLI

pytestmark = [pytest.mark.integration, pytest.mark.faults]

APP = "billing-api"
APP_IDENTITY = f"{APP}:{APP}-password"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "agent.md"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")


def shared_directory(mode: int = 0o755) -> str:
    """A short directory (sun_path holds 108 bytes) other users may enter."""
    directory = tempfile.mkdtemp(prefix="agent-")
    os.chmod(directory, mode)
    return directory


@pytest.fixture
def socket_path() -> str:
    return os.path.join(shared_directory(), "agent.sock")


@pytest.fixture
def agent(secured: SecuredNamespace, socket_path: str) -> Iterator[AgentServer]:
    """An agent as docs/agent.md runs it: without an identity of its own."""
    session = secured.sentinel("host-agent", announce=False, agent=False)
    with AgentServer(session, socket_path, send_timeout=5.0) as server:
        yield server


@pytest.fixture
def ring(tmp_path: Path) -> Path:
    """The application's key ring, shared by its processes."""
    path = tmp_path / f"{APP}.keys"
    ClientKeyring.generate().save(path)
    return path


def published(secured: SecuredNamespace) -> None:
    """billing-db registered, billing-api enrolled and holding signed credential v1."""
    secured.role("publisher").register(SERVICE, "p1", "10.0.0.5", 5432, scheme="postgresql")
    secured.enroll(APP, APP_IDENTITY)


def agent_fed(secured: SecuredNamespace, socket_path: str, client_id: str, ring: Path) -> Sentinel:
    """A process of billing-api fed by the agent (its own identity and key ring)."""
    return secured.sentinel(
        client_id,
        identity=APP_IDENTITY,
        agent=socket_path,
        auth=AuthConfig(keys=str(ring), client=APP, signer=secured.signer.public_text),
    )


def with_credential(secured: SecuredNamespace, *processes: Sentinel) -> None:
    manager = secured.role("auth_manager", f"publisher-{uuid.uuid4().hex[:6]}")
    manager.credentials.publish(
        SERVICE, APP, {"user": "billing", "password": "v1"}, signer=secured.signer
    )
    for process in processes:
        assert wait_until(lambda p=process: p.get_service(SERVICE).auth is not None) is not None


def census(secured: SecuredNamespace) -> dict[str, object]:
    """The processes a rotation of billing-api counts, and the version each applied."""
    zk = secured.kazoo(secured.identities["auth_manager"])
    return live_processes(zk, SERVICE, owners=confirmation_owners(zk, [APP])).get(APP, {})


def rotate(secured: SecuredNamespace, tmp_path: Path, timeout: float):
    manager = secured.role("auth_manager", f"rotator-{uuid.uuid4().hex[:6]}")
    backend = FileBackend(tmp_path / f"credentials-{uuid.uuid4().hex[:6]}.json")
    return manager.credentials.rotate(SERVICE, APP, backend, timeout=timeout, signer=secured.signer)


# --- processes run as other processes, or other users ------------------------------------------

CLIENT = r"""
import json, sys
from sentinel import Sentinel
from sentinel.auth.config import AuthConfig
args = json.loads(sys.argv[1])
auth = None
if args.get("keys"):
    auth = AuthConfig(keys=args["keys"], client=args["auth_client"], signer=args["signer"])
try:
    client = Sentinel(
        args["hosts"], args["client_id"], args["namespace"], identity=args.get("identity"),
        auth=auth, connect_timeout=args.get("timeout", 10), prometheus_registry=None,
        **({"agent": args["socket"]} if args.get("socket") else {}),
    ).start()
    endpoint = client.get_service(args["service"])
    print(json.dumps({"host": endpoint.host}), flush=True)
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
    sys.exit()
if args.get("stay"):
    sys.stdin.read()  # until the test kills it
"""


# This interpreter may sit where other users cannot reach (a pyenv under /root): processes of
# other users run the system's Python of the same version with this checkout's packages.
SITE = next((Path(sys.prefix) / "lib").glob("python3.*/site-packages"))
OTHER_PYTHON = ["/usr/bin/python3", "-Sc", f"import site; site.addsitedir({str(SITE)!r})\n"]


def run_client(args: dict, *, user: list[str] | None = None, env=None) -> dict:
    """One lookup by a client in a process of its own (as another user, with ``user``)."""
    python = (
        [sys.executable, "-c", CLIENT]
        if user is None
        else [*user, *OTHER_PYTHON[:2], OTHER_PYTHON[2] + CLIENT]
    )
    done = subprocess.run(
        [*python, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",  # a directory every user may enter
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


FORGER = r"""
import json, os, socket, sys
from sentinel.agentlink import protocol
path, hello, record = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(path)
try:
    protocol.send(s, hello)
    if protocol.receive(s, protocol.MAX_REPLY_BYTES, protocol.REPLIES) is None:
        print("refused at hello"); sys.exit()
    if record.get("pid") is None:
        record["pid"] = os.getpid()
    service = record.pop("service")
    protocol.send(s, {"op": "announce", "service": service, "record": json.dumps(record)})
    protocol.send(s, {"op": "follow", "id": 1, "service": service})
    while True:  # answered only if the announce was accepted
        message = protocol.receive(s, protocol.MAX_REPLY_BYTES, protocol.REPLIES)
        if message is None:
            print("dropped"); break
        if message.get("id") == 1:
            print("kept"); break
except OSError:
    print("dropped")
"""


def forge(socket_path: str, namespace: str, client: str, identity, record: dict) -> str:
    """A local peer (a process of its own) says hello as ``client`` and announces ``record``."""
    hello = {
        "op": "hello",
        "version": protocol.VERSION,
        "namespace": namespace,
        "client": client,
        "auth_client": record.get("auth_client"),
        "identity": identity,
    }
    done = subprocess.run(
        [sys.executable, "-c", FORGER, socket_path, json.dumps(hello), json.dumps(record)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# --- rotations ---------------------------------------------------------------------------------


@pytest.mark.parametrize("identity", [None, "billing-batch:batch-password", APP_IDENTITY])
def test_a_forged_announce_is_refused_and_confirms_nothing(
    secured, agent, socket_path, ring, tmp_path, identity
):
    """A local peer names the victim's client id, another process's pid, or a credential
    version nobody issued: each is refused, whatever identity it shows (none, another
    client's, the victim's own as a compromised sibling would), and the rotation still waits
    for the victim."""
    published(secured)
    secured.enroll("billing-batch", "billing-batch:batch-password")
    victim = agent_fed(secured, socket_path, f"{APP}-1", ring)
    with_credential(secured, victim)
    zk = secured.kazoo()
    entry = client_path(SERVICE, f"{APP}-1")

    def applied() -> bool:
        return zk.exists(entry) is not None and b'"auth_version":1' in zk.get(entry)[0]

    assert wait_until(applied) is not None

    def record(client_id: str, pid: int | None, version: int) -> dict:
        path = client_path(SERVICE, client_id)
        forged = ClientRecord(SERVICE, client_id, pid=pid, auth_client=APP, auth_version=version)
        return {**json.loads(forged.to_bytes(path)), "service": SERVICE}

    namespace = secured.namespace
    # the victim's client id, its own pid, any version
    assert (
        forge(socket_path, namespace, f"{APP}-1", identity, record(f"{APP}-1", None, 1))
        == "refused at hello"
    )
    # its own client id, the victim's pid
    assert (
        forge(socket_path, namespace, "intruder", identity, record("intruder", os.getpid(), 1))
        == "dropped"
    )
    # its own client id and pid, a version above every one issued
    assert (
        forge(socket_path, namespace, "intruder", identity, record("intruder", None, 2**53 - 1))
        == "dropped"
    )
    assert applied()
    assert census(secured) == {f"{APP}-1": 1}
    # The victim holds its switch: the rotation waits for it, and fails safe at its timeout.
    release = threading.Event()
    victim.listen(SERVICE, lambda e: isinstance(e, AuthChanged) and release.wait(30))
    try:
        with pytest.raises(RotationFailed) as caught:
            rotate(secured, tmp_path, timeout=1.5)
    finally:
        release.set()
    assert caught.value.step == "confirm"
    assert caught.value.laggards == (f"{APP}-1",)


def test_a_rotation_waits_for_an_agent_fed_process_as_for_its_own_session(
    secured, agent, socket_path, ring, tmp_path
):
    """The process takes SWITCH seconds to rebuild its pool (its AuthChanged listener): the
    old credential is revoked only after it switched."""
    switch = 5.0
    published(secured)
    process = agent_fed(secured, socket_path, f"{APP}-1", ring)
    with_credential(secured, process)
    switched: list[float] = []

    def rebuild(event: object) -> None:
        if isinstance(event, AuthChanged):
            threading.Event().wait(switch)  # the application's own switch
            switched.append(time.monotonic())

    process.listen(SERVICE, rebuild)
    result = rotate(secured, tmp_path, timeout=30)
    revoked_at = time.monotonic()
    assert switched and switched[0] <= revoked_at
    assert result.confirmed_in >= switch
    assert result.revoked == {APP: (1,)}


def test_a_dead_processs_entry_goes_at_once_and_auth_status_lists_agent_fed_processes(
    secured, agent, socket_path, ring, tmp_path, cli_in_process, zookeeper
):
    published(secured)
    sibling = agent_fed(secured, socket_path, f"{APP}-2", ring)
    with_credential(secured, sibling)
    doomed = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLIENT,
            json.dumps(
                {
                    "hosts": zookeeper.connect_string,
                    "namespace": secured.namespace,
                    "client_id": f"{APP}-1",
                    "identity": APP_IDENTITY,
                    "keys": str(ring),
                    "auth_client": APP,
                    "signer": secured.signer.public_text,
                    "socket": socket_path,
                    "service": SERVICE,
                    "stay": True,
                }
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert json.loads(doomed.stdout.readline()) == {"host": "10.0.0.5"}
        both = {f"{APP}-1": 1, f"{APP}-2": 1}
        assert wait_until(lambda: census(secured) == both) is not None
        status = cli_in_process("auth", "status", "--service", SERVICE, "--json")
        assert status.returncode == 0, status.stderr
        [row] = [r for r in json.loads(status.stdout) if r["client"] == APP]
        assert row["processes"] == both
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        # Its session's end would take the session timeout: the agent saw the socket close.
        assert wait_until(lambda: census(secured) == {f"{APP}-2": 1}, timeout=3) is not None
    finally:
        if doomed.poll() is None:
            doomed.kill()
        doomed.wait(10)
        doomed.stdout.close()
        doomed.stdin.close()
    assert rotate(secured, tmp_path, timeout=10).revoked == {APP: (1,)}
    # The identity's last process here leaves: every entry it had is gone from ZooKeeper.
    sibling.close()
    zk = secured.kazoo()
    gone = lambda: all(  # noqa: E731
        zk.exists(client_path(SERVICE, f"{APP}-{i}")) is None for i in (1, 2)
    )
    assert wait_until(gone, timeout=3) is not None


# --- the process checks who listens -----------------------------------------------------------

SQUATTER = r"""
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(8)
print("listening", flush=True)
conn, _ = s.accept()
conn.settimeout(5)
received = b""
try:
    while chunk := conn.recv(65536):
        received += chunk
except OSError:
    pass
print(len(received), flush=True)
"""


def start_through(zookeeper, secured: SecuredNamespace, path: str) -> Sentinel:
    """A process with an identity, started through the agent socket at ``path``."""
    return Sentinel(
        zookeeper.connect_string,
        "victim",
        secured.namespace,
        identity=APP_IDENTITY,
        agent=path,
        connect_timeout=2,
        prometheus_registry=None,
    ).start()


@needs_root
def test_a_squatters_socket_gets_nothing_from_a_process(secured, zookeeper):
    """Another user listens first in a directory anyone may write: the process refuses it
    before its hello (which would carry its identity), and the agent refuses to serve there."""
    directory = shared_directory(0o777)
    path = os.path.join(directory, "agent.sock")
    squatter = subprocess.Popen(
        [*as_user(65534, 65534), "/usr/bin/python3", "-c", SQUATTER, path],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert squatter.stdout.readline().strip() == "listening"
        with pytest.raises(AgentNotTrusted, match="listener runs as uid 65534"):
            start_through(zookeeper, secured, path)
        assert squatter.stdout.readline().strip() == "0"  # not a byte
    finally:
        squatter.kill()
        squatter.wait(10)
        squatter.stdout.close()
    session = secured.sentinel("host-agent", announce=False, agent=False)
    with pytest.raises(SentinelError, match="others than root and this user"):
        AgentServer(session, os.path.join(directory, "real.sock")).start()


@needs_root
def test_a_socket_file_of_another_user_is_refused(secured, agent, socket_path, zookeeper):
    os.chown(socket_path, 65534, 65534)  # the listener is right, the file is not
    with pytest.raises(AgentNotTrusted, match="socket belongs to uid 65534"):
        start_through(zookeeper, secured, socket_path)


# --- read checks and identity sessions ----------------------------------------------------------


def _raw_request(path: str, namespace: str, client: str, identity, request: dict) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(path)
        hello = {
            "op": "hello",
            "version": protocol.VERSION,
            "namespace": namespace,
            "client": client,
            "auth_client": None,
            "identity": identity,
        }
        protocol.send(sock, hello)
        assert protocol.receive(sock, protocol.MAX_REPLY_BYTES, protocol.REPLIES) is not None
        protocol.send(sock, {**request, "id": 7})
        while True:
            answer = protocol.receive(sock, protocol.MAX_REPLY_BYTES, protocol.REPLIES)
            assert answer is not None
            if answer.get("id") == 7:
                return answer


RESTRICTED = [make_digest_acl("agent", "pw", all=True), make_digest_acl("alice", "pw", read=True)]


@pytest.fixture
def owner(zookeeper, namespace) -> Iterator[KazooClient]:
    """A session of the identity the agent runs as, in an open namespace."""
    zk = KazooClient(f"{zookeeper.connect_string}{namespace}", auth_data=[("digest", "agent:pw")])
    zk.start(timeout=10)
    zk.ensure_path("/")
    yield zk
    zk.stop()
    zk.close()


def test_partition_applies_the_read_check_of_the_identity_asking(
    make_client, owner, namespace, socket_path
):
    """A shard map only the agent's identity and alice may read: bob and an anonymous
    process cannot enumerate its keys through the agent's identity."""
    admin = make_client("admin", announce=False, agent=False)
    admin.shard_maps.ensure("tenants", "directory", partitions=["p1", "p2"])
    admin.shard_maps.assign_many("tenants", {"acme": "p1"})
    admin.ensure_service("orders-db", scheme="postgresql", shard_policy="tenants")
    restricted = [
        make_digest_acl("agent", "pw", all=True),
        make_digest_acl("alice", "pw", read=True),
    ]
    owner.set_acls(policy_path("tenants"), restricted)
    session = make_client("host-agent", announce=False, agent=False, identity="agent:pw")
    ask = {"op": "partition", "service": "orders-db", "key": "acme"}
    with AgentServer(session, socket_path):
        answer = _raw_request(socket_path, namespace, "alice", "alice:pw", ask)
        assert answer["partition"] == "p1"
        for name, identity in (("bob", "bob:pw"), ("anonymous", None)):
            answer = _raw_request(socket_path, namespace, name, identity, ask)
            assert answer["op"] == "error" and answer["type"] == "AccessDenied", answer
            assert "/shard_info/tenants" in answer["message"]


STATUS = "import sys; from sentinel.cli import main; sys.exit(main())"


@needs_root
def test_agent_status_shows_another_user_only_what_its_identity_may_read(secured, socket_path):
    """A restricted service (alice and the agent's identity may read it) and a public one,
    followed by two processes: one both, one only the restricted one. Another user asking
    ``sentinel agent status`` as bob sees the first with the public service only and not the
    second at all (its pid and client id would say that something follows what bob may not
    read); asking as alice, both with what they follow; root, everything. Before, another user
    saw every process's pid and client id and no service, whatever its identity."""
    published(secured)
    publisher = secured.role("publisher")
    publisher.register("private", "p1", "10.0.9.9", 80, scheme="http")
    owner = secured.kazoo(secured.identities["publisher"])
    restricted = [
        *(a for a in owner.get_acls("/services/private")[0] if a.id.scheme != "world"),
        make_digest_acl("alice", "pw", read=True),
        make_digest_acl("host-agent", "pw", read=True),
    ]
    owner.set_acls("/services/private", restricted)
    session = secured.sentinel("host-agent", identity="host-agent:pw", announce=False, agent=False)
    asker = 64030
    with AgentServer(session, socket_path, allowed_uids=[asker]):
        both = secured.sentinel("both", identity="alice:pw", agent=socket_path, announce=False)
        both.prefetch(SERVICE)
        both.prefetch("private")
        hidden = secured.sentinel("hidden", identity="alice:pw", agent=socket_path, announce=False)
        hidden.prefetch("private")
        anonymous = secured.sentinel("bob-probe", agent=socket_path, announce=False)
        with pytest.raises(AccessDenied):  # the restriction holds for a process of no identity
            anonymous.get_service("private")

        def status(identity: str | None, user: list[str] | None) -> list[tuple]:
            options = ["--json", "--socket", socket_path, "--namespace", secured.namespace]
            done = subprocess.run(
                [
                    *(user or []),
                    *OTHER_PYTHON[:2],
                    OTHER_PYTHON[2] + STATUS,
                    *["agent", "status", *options],
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                cwd="/",
                env={
                    "PATH": "/usr/bin:/bin",
                    "PYTHONDONTWRITEBYTECODE": "1",
                    **({"SENTINEL_ZK_IDENTITY": identity} if identity else {}),
                },
            )
            assert done.returncode == 0, done.stderr
            processes = json.loads(done.stdout)["processes"]
            return sorted((p["client"], tuple(p["services"])) for p in processes)

        another_user = as_user(asker, asker)
        assert status("bob:pw", another_user) == [("both", (SERVICE,))]
        assert status("alice:pw", another_user) == [
            ("both", (SERVICE, "private")),
            ("hidden", ("private",)),
        ]
        assert status(None, None) == [
            ("bob-probe", ()),
            ("both", (SERVICE, "private")),
            ("hidden", ("private",)),
        ]


@pytest.mark.parametrize("pinned", [False, True], ids=["idle", "each keeping an entry"])
def test_junk_identities_from_one_peer_lock_no_identity_out(
    make_client, owner, namespace, socket_path, zookeeper, pinned
):
    """70 connections of one user, each with an identity of its own, all kept open: the
    agent holds at most its per-user bound of identity sessions. Idle ones are evicted, so a
    legitimate identity of the same user is served next; junk identities that each keep a
    live entry hold that user's bound (its next identity is refused, counted), and another
    user's identity is still served."""
    if pinned and os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    spec_path = "/services/private"
    owner.ensure_path("/services")
    owner.create(spec_path, ServiceSpec("private").to_bytes(spec_path), acl=RESTRICTED)
    node = instance_path("private", "p1", "a")
    owner.create(node, InstanceRecord("private", "p1", "a", "10.0.9.9", 80).to_bytes(node))
    session = make_client("host-agent", announce=False, agent=False, identity="agent:pw")
    junk: list[socket.socket] = []
    refused = AGENT_IDENTITIES_REFUSED._value.get()
    with AgentServer(session, socket_path, allowed_uids=[64020]) as server:
        try:
            for i in range(70):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                junk.append(sock)
                sock.settimeout(20)
                sock.connect(socket_path)
                hello = {
                    "op": "hello",
                    "version": 1,  # no heartbeats: kept however long the test takes
                    "namespace": namespace,
                    "client": f"junk-{i}",
                    "auth_client": None,
                    "identity": f"junk-{i}:pw",
                }
                protocol.send(sock, hello)
                protocol.receive(sock, protocol.MAX_REPLY_BYTES, protocol.REPLIES)
                if pinned:
                    path = client_path("private", f"junk-{i}")
                    record = ClientRecord("private", f"junk-{i}", pid=os.getpid())
                    protocol.send(
                        sock,
                        {
                            "op": "announce",
                            "service": "private",
                            "record": record.to_bytes(path).decode(),
                        },
                    )
                protocol.send(sock, {"op": "follow", "id": 1, "service": "private"})
                answer = protocol.receive(sock, protocol.MAX_REPLY_BYTES, protocol.REPLIES)
                assert answer["type"] == "AccessDenied"
            alice = make_client("alice", agent=socket_path, identity="alice:pw")
            if pinned:
                with pytest.raises(AccessDenied):
                    alice.get_service("private")
                assert AGENT_IDENTITIES_REFUSED._value.get() > refused
                lookup = {
                    "hosts": zookeeper.connect_string,
                    "namespace": namespace,
                    "client_id": "alice-2",
                    "identity": "alice:pw",
                    "service": "private",
                    "socket": socket_path,
                }
                another_user = as_user(64020, 64020)
                assert run_client(lookup, user=another_user) == {"host": "10.0.9.9"}
            else:
                assert alice.get_service("private").host == "10.0.9.9"
            mine = [uid for uid, _ in server._identities._sessions if uid == os.geteuid()]
            assert len(mine) <= MAX_IDENTITY_SESSIONS_PER_PEER
        finally:
            for sock in junk:
                sock.close()


# A local peer of another user that says hello under many client ids (version 1: no heartbeat
# keeps them), and holds them; then, told a client id, a service and a record on stdin,
# announces that record on the connection of that id and says whether it was answered after.
CLAIMER = r"""
import json, resource, socket, struct, sys
path, namespace, ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

def send(sock, message):
    frame = json.dumps(message).encode()
    sock.sendall(struct.pack(">I", len(frame)) + frame)

def receive(sock):
    def exactly(count):
        data = b""
        while len(data) < count:
            chunk = sock.recv(count - len(data))
            if not chunk:
                return None
            data += chunk
        return data
    head = exactly(4)
    body = head and exactly(struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)

held = {}
for client in ids:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(path)
    send(sock, {"op": "hello", "version": 1, "namespace": namespace, "client": client,
                "auth_client": None, "identity": None})
    held[client] = sock
print(sum((receive(sock) or {}).get("op") == "welcome" for sock in held.values()), flush=True)
order = json.loads(sys.stdin.readline())
sock = held[order["client"]]
send(sock, {"op": "announce", "service": order["service"], "record": order["record"]})
send(sock, {"op": "follow", "id": 1, "service": order["service"]})
while True:
    message = receive(sock)
    if message is None or message.get("id") == 1:
        print("dropped" if message is None else "answered", flush=True)
        break
sys.stdin.read()  # holds every id until the test ends it
"""


@needs_root
def test_another_users_claims_of_client_ids_lock_none_of_roots_processes_out(
    make_client, namespace, socket_path
):
    """Issue 50, item 2: uid 65534, allowed on the socket, says hello as 1,000 client ids of
    the default form, ``<hostname>-<pid>`` for the pids around this process's, and holds
    them (version 1: no heartbeat asked). A client id is its user's: this process (root), with
    the default id, is still served at once, and its ``/clients`` entry is its own; the other
    user's announce of the same id afterwards changes nothing of it (the agent serves that
    process, and keeps its entries only where no other process's are kept under the id)."""
    admin = make_client("admin", announce=False, agent=False)
    admin.ensure_service(SERVICE)
    admin.register(SERVICE, "p1", "10.0.0.5", 5432, label="a")
    mine = default_client_id()
    ids = [
        sanitize_name(f"{socket.gethostname()}-{pid}")
        for pid in range(max(2, os.getpid() - 500), os.getpid() + 500)
    ]
    assert mine in ids
    session = make_client("host-agent", announce=False, agent=False)
    with AgentServer(session, socket_path, allowed_uids=[65534]):
        claimer = subprocess.Popen(
            [
                *as_user(65534, 65534),
                *["/usr/bin/python3", "-c", CLAIMER, socket_path, namespace, json.dumps(ids)],
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        try:
            assert claimer.stdout.readline().strip() == str(len(ids))  # every one welcomed
            victim = make_client(None, agent=socket_path, connect_timeout=5.0)
            assert victim.get_service(SERVICE).host == "10.0.0.5"
            zk = admin.session.zk
            entry = client_path(SERVICE, mine)

            def kept_for() -> int | None:
                data = zk.exists(entry) and zk.get(entry)[0]
                return data and ClientRecord.from_bytes(SERVICE, mine, entry, data).pid

            assert wait_until(lambda: kept_for() == os.getpid()) is not None
            forged = ClientRecord(SERVICE, mine, pid=claimer.pid).to_bytes(entry).decode()
            order = {"client": mine, "service": SERVICE, "record": forged}
            claimer.stdin.write(json.dumps(order) + "\n")
            claimer.stdin.flush()
            assert claimer.stdout.readline().strip() == "answered"  # served, its entry not kept
            assert kept_for() == os.getpid()
        finally:
            claimer.kill()
            claimer.wait(10)
            claimer.stdin.close()
            claimer.stdout.close()


# --- the documented examples --------------------------------------------------------------------


def _block(language: str, containing: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", DOCS.read_text(), re.S)
    return next(b for b in blocks if containing in b)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_agent(zookeeper, namespace: str, args: list[str], uid: int, gid: int) -> Daemon:
    args = [str(_free_port()) if a == "9466" else a for a in args]
    program = [
        *OTHER_PYTHON[:2],
        OTHER_PYTHON[2] + "import sys; from sentinel.cli import main; sys.exit(main())",
    ]
    daemon = Daemon(zookeeper, namespace, *args, program=program, user=as_user(uid, gid))
    if not wait_until(lambda: daemon.saw("serving"), 30):
        pytest.fail(f"the agent did not start: {daemon.stop()}")
    return daemon


def _served(make_client, namespace) -> None:
    admin = make_client("admin", announce=False, agent=False)
    admin.register("orders-db", "p1", "10.0.1.1", 5432, label="a")


@needs_root
def test_the_systemd_example_admits_its_group_by_supplementary_membership(
    zookeeper, namespace, make_client
):
    unit = _block("ini", "ExecStart")
    command = " ".join(unit.split("ExecStart=", 1)[1].split("\n")[:2]).replace("\\", " ")
    args = shlex.split(command)[1:]  # after the executable
    runtime = os.path.join(shared_directory(), "run")
    os.mkdir(runtime)
    directory = os.path.join(runtime, re.search(r"RuntimeDirectory=(\S+)", unit).group(1))
    agent_uid = agent_gid = 64010  # User=sentinel, Group=sentinel
    os.mkdir(directory, int(re.search(r"RuntimeDirectoryMode=(\d+)", unit).group(1), 8))
    os.chown(directory, agent_uid, agent_gid)  # as systemd makes it
    args = [a.replace("/run/", f"{runtime}/") for a in args]
    group = int(args[args.index("--allow-gid") + 1])
    path = args[args.index("--socket") + 1]
    _served(make_client, namespace)
    daemon = _start_agent(zookeeper, namespace, args, agent_uid, agent_gid)
    try:
        lookup = {
            "hosts": zookeeper.connect_string,
            "namespace": namespace,
            "client_id": "app",
            "service": "orders-db",
            "socket": path,
            "timeout": 5,
        }
        env = {"SENTINEL_AGENT_USER": str(agent_uid)}
        member = as_user(64011, 64011, groups=(group,))  # the group is a supplementary one
        assert run_client(lookup, user=member, env=env) == {"host": "10.0.1.1"}
        stranger = run_client(lookup, user=as_user(64012, 64012), env=env)
        assert stranger["error"] == "AgentUnavailable", stranger
    finally:
        daemon.stop()


@needs_root
def test_the_pod_example_admits_its_application_user(zookeeper, namespace, make_client):
    pod = yaml.safe_load(_block("yaml", "sentinel-agent"))
    sidecar, app = pod["containers"]
    volume = shared_directory(0o777)  # an emptyDir: every container may write it
    mount = sidecar["volumeMounts"][0]["mountPath"]
    args = [a.replace(mount, volume) for a in sidecar["args"]]
    agent_uid = sidecar["securityContext"]["runAsUser"]
    _served(make_client, namespace)
    daemon = _start_agent(zookeeper, namespace, args, agent_uid, agent_uid)
    try:
        env = {e["name"]: str(e["value"]).replace(mount, volume) for e in app["env"]}
        lookup = {
            "hosts": zookeeper.connect_string,
            "namespace": namespace,
            "client_id": "app",
            "service": "orders-db",
            "timeout": 5,
        }
        uid = app["securityContext"]["runAsUser"]
        assert run_client(lookup, user=as_user(uid, uid), env=env) == {"host": "10.0.1.1"}
        other = run_client(lookup, user=as_user(uid + 1, uid + 1), env=env)
        assert other["error"] == "AgentUnavailable", other
    finally:
        daemon.stop()
