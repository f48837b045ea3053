"""Which ZooKeeper the launcher picks, and what it says when there is none (no server runs)."""

import subprocess
import sys

import pytest

from sentinel.errors import ZooKeeperNotInstalled
from sentinel.testing import zookeeper
from sentinel.testing.zookeeper import LocalZooKeeper, find_installation


@pytest.fixture
def no_system_zookeeper(monkeypatch, tmp_path):
    """Hide Debian's package and any Docker engine, so only the environment decides."""
    monkeypatch.setattr(zookeeper, "DEBIAN_JAR", tmp_path / "absent.jar")
    monkeypatch.setattr(zookeeper, "_docker_answers", lambda: False)


def test_explicit_classpath_comes_first(tmp_path):
    found = find_installation(
        {"SENTINEL_ZK_CLASSPATH": "/x/zk.jar", "PATH": "/usr/bin", "ZOOKEEPER_HOME": str(tmp_path)}
    )
    assert (found.kind, found.classpath, found.source) == (
        "java",
        "/x/zk.jar",
        "SENTINEL_ZK_CLASSPATH",
    )


def test_zookeeper_home_uses_the_release_jars(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "zookeeper-3.8.4.jar").touch()
    (tmp_path / "lib" / "slf4j-api.jar").touch()
    found = find_installation({"ZOOKEEPER_HOME": str(tmp_path), "PATH": "/usr/bin"})
    entries = found.classpath.split(":")
    assert entries[0] == str(tmp_path / "conf")
    assert str(tmp_path / "lib" / "zookeeper-3.8.4.jar") in entries
    assert found.source == f"ZOOKEEPER_HOME={tmp_path}"


def test_zookeeper_home_without_jars_is_an_error(tmp_path):
    with pytest.raises(ZooKeeperNotInstalled, match="holds no jars"):
        find_installation({"ZOOKEEPER_HOME": str(tmp_path), "PATH": "/usr/bin"})


def test_debian_package_is_used_when_present(monkeypatch, tmp_path):
    jar = tmp_path / "zookeeper.jar"
    jar.touch()
    monkeypatch.setattr(zookeeper, "DEBIAN_JAR", jar)
    found = find_installation({"PATH": "/usr/bin"})
    assert found.kind == "java" and found.classpath.split(":")[0] == str(jar)


def test_docker_is_the_last_resort(monkeypatch, no_system_zookeeper):
    monkeypatch.setattr(zookeeper, "_docker_answers", lambda: True)
    found = find_installation({"PATH": "/usr/bin"})
    assert (found.kind, found.image) == ("docker", zookeeper.DOCKER_IMAGE)


def test_nothing_found_says_what_to_install(no_system_zookeeper):
    with pytest.raises(ZooKeeperNotInstalled, match="apt-get install zookeeper") as info:
        find_installation({"PATH": "/usr/bin"})
    assert "ZOOKEEPER_HOME" in str(info.value) and "Docker" in str(info.value)


def test_starting_without_any_installation_raises_before_creating_processes(
    no_system_zookeeper, monkeypatch
):
    monkeypatch.delenv("ZOOKEEPER_HOME", raising=False)
    monkeypatch.delenv("SENTINEL_ZK_CLASSPATH", raising=False)
    zk = LocalZooKeeper()
    with pytest.raises(ZooKeeperNotInstalled):
        zk.start()
    assert zk.members == []
    zk.stop()


def test_ensemble_of_docker_containers_is_refused():
    docker = zookeeper.Installation("docker", "test", image="zookeeper:3.8")
    with pytest.raises(zookeeper.LauncherError, match="ensembles need a local"):
        LocalZooKeeper(size=3, installation=docker)


def test_free_ports_are_distinct():
    ports = zookeeper.free_ports(9)
    assert len(set(ports)) == 9 and all(1024 < port < 65536 for port in ports)


def test_importing_the_client_does_not_load_the_launcher():
    # The launcher lives in sentinel.testing; a client only resolves hosts (devserver).
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, sentinel.client, sentinel.devserver, sentinel.integrations.spark; "
            "print(sorted(m for m in sys.modules if m.startswith('sentinel.testing')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"
