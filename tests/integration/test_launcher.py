"""The launcher against real ZooKeeper processes: standalone and a 3-member ensemble."""

import pytest

import sentinel.testing.zookeeper as zookeeper_launcher
from sentinel import Sentinel
from sentinel.errors import ConnectionInterrupted
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import (
    CLASS_ARCHIVE_ENV,
    LocalZooKeeper,
    four_letter_word,
    short_lived_jvm_options,
    write_class_archive,
)

pytestmark = pytest.mark.integration


def test_standalone_server_answers_and_stops(tmp_path):
    zk = LocalZooKeeper(directory=tmp_path / "zk").start()
    member = zk.members[0]
    try:
        assert member.mode() == "standalone"
        assert four_letter_word("127.0.0.1", member.client_port, "ruok") == "imok"
        assert member.pid is not None and member.config_path.is_file()
    finally:
        zk.stop()
    assert not member.is_running() and member.mode() is None
    assert (tmp_path / "zk").is_dir(), "a directory the caller gave must be kept"


def test_temporary_directory_is_removed_on_stop():
    with LocalZooKeeper() as zk:
        directory = zk.directory
        assert directory.is_dir()
    assert not directory.exists()


def test_a_server_starts_from_the_class_archive_a_first_server_wrote(tmp_path, monkeypatch):
    # A JVM that dumps an archive must start from the JDK's own, not from the suite's archive.
    monkeypatch.setattr(
        zookeeper_launcher,
        "JVM_OPTIONS",
        tuple(o for o in zookeeper_launcher.JVM_OPTIONS if "SharedArchiveFile" not in o),
    )
    archive = tmp_path / "zookeeper.jsa"
    assert write_class_archive(archive)
    options = short_lived_jvm_options({CLASS_ARCHIVE_ENV: str(archive)})
    assert f"-XX:SharedArchiveFile={archive}" in options
    # -Xshare:on: a JVM that cannot map the archive refuses to start rather than loading the
    # classes again, so a server answering here is one that used it.
    with LocalZooKeeper(jvm_options=(*options, "-Xshare:on")) as zk:
        assert four_letter_word("127.0.0.1", zk.members[0].client_port, "ruok") == "imok"
    assert short_lived_jvm_options({CLASS_ARCHIVE_ENV: str(tmp_path / "none.jsa")}) == (
        short_lived_jvm_options({})
    ), "an archive that is not there is not named"


def test_paused_server_stops_answering_until_resumed(zookeeper):
    member = zookeeper.members[0]
    member.pause()
    try:
        assert member.mode(timeout=0.3) is None
        assert member.is_running()
    finally:
        member.resume()
    assert wait_until(lambda: member.mode() == "standalone", timeout=10) is not None


@pytest.mark.slow
def test_ensemble_survives_losing_its_leader_and_the_member_rejoins():
    with LocalZooKeeper(size=3) as ensemble:
        modes = sorted(member.mode() for member in ensemble)
        assert modes == ["follower", "follower", "leader"]
        with Sentinel(hosts=ensemble.connect_string, client_id="ha", session_timeout=6.0) as c:
            before = c.register("api", "p1", "h", 80)
            old_leader = ensemble.leader()
            old_leader.kill()
            assert not old_leader.is_running()
            new_leader = ensemble.leader()
            assert new_leader is not old_leader

            def still_served():
                labels = [i.label for i in c.read_service("api").instances]
                return labels == [before.label]

            assert wait_until(still_served, timeout=20, ignore=(ConnectionInterrupted,))
            after = c.register("api", "p2", "h", 81)
            assert {i.partition for i in c.read_service("api").instances} == {"p1", "p2"}

            old_leader.restart()
            assert old_leader.mode() == "follower"
            assert ensemble.leader() is new_leader
            c.deregister(after)


def test_a_port_another_server_took_first_is_given_up_for_new_ports(zookeeper, monkeypatch):
    # Two test workers can pick the same free port before either JVM binds it; the one that
    # loses it must not take the winner's answer to ``srvr`` for its own and serve nothing.
    taken = zookeeper.members[0].client_port
    picks = iter([[taken, *zookeeper_launcher.free_ports(2)]])
    real_free_ports = zookeeper_launcher.free_ports
    monkeypatch.setattr(
        zookeeper_launcher, "free_ports", lambda count: next(picks, None) or real_free_ports(count)
    )
    with LocalZooKeeper() as second:
        port = second.members[0].client_port
        assert port != taken
        assert f"dataDir={second.directory}/member-1/data/version-2" in four_letter_word(
            "127.0.0.1", port, "conf"
        )
