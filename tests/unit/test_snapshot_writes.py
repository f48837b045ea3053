"""SnapshotWriter: a write encodes the services that changed, not the cache, and the file it
writes is the document :func:`dump_snapshot` describes, read back by :func:`load_snapshot`."""

import json

from sentinel.cache import ServiceSnapshot, snapshot_file
from sentinel.cache.snapshot_file import SnapshotWriter, dump_snapshot, load_snapshot
from sentinel.registry.records import ServiceSpec
from tests.unit.endpoints import endpoint

NAMESPACE, HOSTS = "/sentinel", "127.0.0.1:2181"


def service(name, labels):
    endpoints = {f"p1:{label}": endpoint(label, service=name) for label in labels}
    return ServiceSnapshot.first(ServiceSpec(name), endpoints, {}, frozenset())


def counting_instance_encodes(monkeypatch):
    """The services whose instances were encoded, one name per instance encoded."""
    encoded = []
    original = snapshot_file.instance_entry

    def instance_entry(node, endpoint):
        encoded.append(endpoint.service)
        return original(node, endpoint)

    monkeypatch.setattr(snapshot_file, "instance_entry", instance_entry)
    return encoded


def without_time(document):
    return {k: v for k, v in document.items() if k != "written_at"}


def test_a_write_encodes_only_the_services_whose_snapshot_changed(tmp_path, monkeypatch):
    path = tmp_path / "cache.json"
    snapshots = {f"s{i}": service(f"s{i}", ["a", "b", "c"]) for i in range(4)}
    writer = SnapshotWriter(path, snapshots, {}, NAMESPACE, HOSTS)
    encoded = counting_instance_encodes(monkeypatch)
    writer.write_now()
    assert sorted(encoded) == sorted(f"s{i}" for i in range(4) for _ in range(3))

    encoded.clear()
    snapshots["s2"] = snapshots["s2"].updated(
        frozenset(), endpoints={"p1:d": endpoint("d", service="s2")}
    )
    del snapshots["s3"]
    writer.write_now()
    assert encoded == ["s2"] * 4, "only the changed service is encoded again"
    assert writer.writes == 2

    # The file is the whole cache, as dump_snapshot describes it, and loads back.
    written = json.loads(path.read_bytes())
    assert without_time(written) == without_time(dump_snapshot(snapshots, {}, NAMESPACE, HOSTS))
    restored = load_snapshot(path, NAMESPACE, HOSTS).snapshots
    assert {name: set(s.endpoints) for name, s in restored.items()} == {
        "s0": {"p1:a", "p1:b", "p1:c"},
        "s1": {"p1:a", "p1:b", "p1:c"},
        "s2": {"p1:a", "p1:b", "p1:c", "p1:d"},
    }
    assert restored["s2"].endpoints["p1:d"] == snapshots["s2"].endpoints["p1:d"]


def test_an_unchanged_or_equally_rebuilt_cache_is_not_written_again(tmp_path, monkeypatch):
    path = tmp_path / "cache.json"
    snapshots = {"s0": service("s0", ["a"]), "s1": service("s1", ["a", "b"])}
    writer = SnapshotWriter(path, snapshots, {}, NAMESPACE, HOSTS)
    writer.write_now()
    encoded = counting_instance_encodes(monkeypatch)
    writer.write_now()
    assert (writer.writes, encoded) == (1, []), "nothing changed: nothing encoded or written"

    snapshots["s1"] = service("s1", ["a", "b"])  # a new snapshot of the same content
    writer.write_now()
    assert (writer.writes, encoded) == (1, ["s1", "s1"])

    writer.forget()  # a first write again: the whole cache
    writer.write_now()
    assert writer.writes == 2 and len(encoded) == 5
