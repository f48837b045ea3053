"""The Spark cluster launcher's failures, without starting Spark: where Spark comes from, a
daemon that dies while starting (typed error, its output, nothing left running), and a port
taken meanwhile (the start begins again on new ports, a bounded number of times)."""

import stat
from pathlib import Path

import pytest

from sentinel.errors import LauncherError, SparkNotInstalled, SparkStartFailed
from sentinel.testing.helpers import wait_until
from sentinel.testing.spark import START_ATTEMPTS, LocalSparkCluster, find_spark_home

# A stand-in for bin/spark-class whose "daemon" leaves a child in its process group, notes
# the child's pid, says why it fails, and exits.
FAILING_SPARK_CLASS = """#!/bin/sh
sleep 300 &
echo "$!" >> "$SPARK_TEST_CHILDREN"
echo "$SPARK_TEST_FAILURE"
exit 1
"""


def running(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie does not (SIGKILL is delivered asynchronously, and an
    orphan's zombie may wait for a reaper that never comes in a container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture
def failing_home(tmp_path, monkeypatch):
    spark_class = tmp_path / "spark" / "bin" / "spark-class"
    spark_class.parent.mkdir(parents=True)
    spark_class.write_text(FAILING_SPARK_CLASS)
    spark_class.chmod(spark_class.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("SPARK_TEST_CHILDREN", str(tmp_path / "children"))
    return tmp_path / "spark"


def test_spark_comes_from_spark_home_or_the_pyspark_package(tmp_path):
    assert (find_spark_home({"PATH": "/usr/bin:/bin"}) / "bin" / "spark-class").is_file()
    with pytest.raises(SparkNotInstalled, match="no bin/spark-class"):
        find_spark_home({"SPARK_HOME": str(tmp_path)})
    with pytest.raises(SparkNotInstalled, match="no 'java'") as missing:
        find_spark_home({"PATH": str(tmp_path)})
    assert isinstance(missing.value, LauncherError)


def test_a_daemon_dying_at_start_is_a_typed_error_and_leaves_nothing_running(
    failing_home, monkeypatch, tmp_path
):
    monkeypatch.setenv("SPARK_TEST_FAILURE", "java.lang.OutOfMemoryError: no heap for you")
    cluster = LocalSparkCluster(spark_home=failing_home)

    with pytest.raises(SparkStartFailed, match="master exited while starting") as failure:
        cluster.start(timeout=30)

    assert "no heap for you" in str(failure.value)  # the daemon's own last words
    children = [int(pid) for pid in (tmp_path / "children").read_text().split()]
    assert len(children) == 1  # no retry: the port was not the problem
    assert wait_until(lambda: not running(children[0]), 10) is not None  # the group was swept
    assert not cluster.directory.exists()


def test_a_port_taken_meanwhile_starts_again_on_new_ports_a_bounded_number_of_times(
    failing_home, monkeypatch, tmp_path
):
    monkeypatch.setenv("SPARK_TEST_FAILURE", "java.net.BindException: Address already in use")

    with pytest.raises(SparkStartFailed, match="Address already in use"):
        LocalSparkCluster(spark_home=failing_home).start(timeout=30)

    children = [int(pid) for pid in (tmp_path / "children").read_text().split()]
    assert len(children) == START_ATTEMPTS
    assert wait_until(lambda: not any(running(pid) for pid in children), 10) is not None
