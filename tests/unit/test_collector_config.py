"""The collector's configuration, its sources' pure parts, and how members share instances."""

import re
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml

from sentinel.collector.command import CommandSource
from sentinel.collector.config import load_config, parse_config
from sentinel.collector.prometheus import PrometheusSource, Selector
from sentinel.collector.runner import owner
from sentinel.errors import SourceError, SourceTimeout, ValidationError
from sentinel.registry.endpoint import Endpoint

PROMETHEUS = {"type": "prometheus", "metrics": {"replication_lag": "pg_lag_seconds"}}


def config(**service):
    return {"services": [{"service": "db", "source": PROMETHEUS, **service}]}


def plugin(endpoint, timeout, scale=1):
    """A python source for the tests: the port, scaled."""
    return {"port": endpoint.port * scale}


def test_toml_with_every_source_type(tmp_path):
    path = tmp_path / "collector.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            cluster = "eu-1"
            workers = 4

            [[services]]
            service = "db"
            interval = "2s"
            jitter = "250ms"
            timeout = 1.5
            partitions = ["p1"]
            [services.source]
            type = "postgres"
            password_env = "MONITOR_PASSWORD"

            [[services]]
            service = "relay"
            interval = "1m"
            [services.source]
            type = "command"
            command = "{sys.executable} -c 'print(1)'"

            [[services]]
            service = "web"
            [services.source]
            type = "prometheus"
            port = 9100
            [services.source.metrics]
            queue = 'mail_queue{{queue="active"}}'

            [[services]]
            service = "custom"
            [services.source]
            type = "python"
            callable = "tests.unit.test_collector_config:plugin"
            options = {{ scale = 2 }}
            """
        )
    )
    loaded = load_config(path)
    assert loaded.cluster == "eu-1" and loaded.workers == 4
    db, relay, web, custom = loaded.services
    assert (db.interval, db.jitter, db.timeout) == (2.0, 0.25, 1.5)
    assert db.wants("p1") and not db.wants("p2")
    assert db.source.type == "postgres" and db.source.password_env == "MONITOR_PASSWORD"
    assert relay.interval == 60.0 and relay.jitter == 6.0 and relay.timeout == 5.0
    assert relay.source.command == (sys.executable, "-c", "print(1)")
    assert web.interval == 10.0 and relay.wants("anything")
    assert web.source.metrics == {"queue": Selector("mail_queue", (("queue", "active"),))}
    assert custom.source.options == {"scale": 2}


def test_yaml_reads_like_toml(tmp_path):
    toml, yaml = tmp_path / "c.toml", tmp_path / "c.yaml"
    toml.write_text(
        'cluster = "c"\n[[services]]\nservice = "db"\ninterval = "3s"\n'
        '[services.source]\ntype = "prometheus"\nmetrics = { lag = "pg_lag" }\n'
    )
    yaml.write_text(
        "cluster: c\nservices:\n  - service: db\n    interval: 3s\n"
        "    source: {type: prometheus, metrics: {lag: pg_lag}}\n"
    )
    a, b = load_config(toml), load_config(yaml)
    assert (a.cluster, a.services[0].interval, a.services[0].source.metrics) == (
        b.cluster,
        b.services[0].interval,
        b.services[0].source.metrics,
    )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (config(source={"type": "snmp"}), "unknown source 'snmp'; known: command, postgres"),
        ({"services": [{"source": PROMETHEUS}]}, "missing required field 'service'"),
        ({"services": [{"service": "db"}]}, "missing required field 'source'"),
        (config(source={"type": "prometheus"}), "missing required field 'metrics'"),
        (config(source={"type": "command"}), "missing required field 'command'"),
        (config(interval="5 parsecs"), "interval: '5 parsecs' is not a positive duration"),
        (config(interval=0), "interval: 0 is not a positive duration"),
        (config(interval=-1), "interval: -1 is not a positive duration"),
        (config(interval=True), "interval: True is not a positive duration"),
        (config(interval="1s", jitter="1s"), "jitter: 1s must be less than the interval"),
        (config(interval="1s", timeout="2s"), "timeout: 2s must not exceed the interval"),
        (config(intervall="1s"), "unknown field(s) 'intervall'"),
        (config(service="bad/name"), "services[0].service"),
        (config(partitions="p1"), "partitions: expected a non-empty list of strings"),
        ({"services": []}, "services: expected a non-empty list"),
        ({"services": [{"service": "db", "source": PROMETHEUS}] * 2}, "listed twice: db"),
        (
            config(source={"type": "prometheus", "metrics": {"lag": "bad selector{"}}),
            "metrics.lag: 'bad selector{' is not a sample selector",
        ),
        (
            config(source={"type": "python", "callable": "no.such.module:f"}),
            "source.callable: cannot import 'no.such.module:f'",
        ),
        ({"services": [{"service": "db", "source": PROMETHEUS}], "workers": 0}, "workers"),
    ],
)
def test_invalid_configurations_say_where_and_what(document, message):
    with pytest.raises(ValidationError) as caught:
        parse_config(document, "c.toml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("c.toml")


def test_unreadable_files(tmp_path):
    with pytest.raises(ValidationError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "c.ini").write_text("x")
    with pytest.raises(ValidationError, match=r"must end in \.toml, \.yaml or \.yml"):
        load_config(tmp_path / "c.ini")
    (tmp_path / "c.toml").write_text("services = [")
    with pytest.raises(ValidationError, match="not valid TOML"):
        load_config(tmp_path / "c.toml")


def test_rendezvous_moves_only_a_dead_members_instances():
    keys = [f"db/p{i % 4}:r{i}" for i in range(300)]
    members = ["c:a", "c:b", "c:c"]
    before = {key: owner(key, members) for key in keys}
    assert set(before.values()) == set(members)  # everyone gets work
    after = {key: owner(key, ["c:a", "c:c"]) for key in keys}
    moved = {key for key in keys if before[key] != after[key]}
    assert moved == {key for key in keys if before[key] == "c:b"}
    assert owner("db/p1:r1", []) is None


def test_selectors_match_on_name_and_the_labels_they_name():
    selector = Selector.parse('mail_queue{queue="active", host="a"}')
    assert selector.matches("mail_queue", {"queue": "active", "host": "a", "extra": "x"})
    assert not selector.matches("mail_queue", {"queue": "deferred", "host": "a"})
    assert not selector.matches("mail_queues", {"queue": "active", "host": "a"})
    assert Selector.parse("up") == Selector("up")


def endpoint(port=80):
    return Endpoint(
        service="relay",
        partition="p1",
        label="r1",
        scheme="smtp",
        host="10.0.0.1",
        port=port,
        uri=f"smtp://10.0.0.1:{port}",
        status="up",
        weight=1,
        zone=None,
        properties={},
        registered_at=0.0,
    )


def command(code):
    return CommandSource((sys.executable, "-c", code))


def test_command_source_sees_the_instance_and_parses_json():
    code = (
        "import json, os; print(json.dumps({'queue': int(os.environ['SENTINEL_PORT']), "
        "'who': os.environ['SENTINEL_INSTANCE']}))"
    )
    assert command(code).collect(endpoint(25), timeout=10) == {"queue": 25, "who": "p1:r1"}


@pytest.mark.parametrize(
    ("code", "error", "message"),
    [
        ("import time; time.sleep(30)", SourceTimeout, "ran over 0.5s and was killed"),
        ("import sys; sys.exit('no queue here')", SourceError, "exited 1: no queue here"),
        ("print('not json')", SourceError, "printed no JSON"),
        ("print('[1, 2]')", SourceError, "printed list, not an object"),
    ],
)
def test_command_source_failures(code, error, message):
    timeout = 0.5 if error is SourceTimeout else 10
    with pytest.raises(error, match=message):
        command(code).collect(endpoint(), timeout=timeout)


def test_prometheus_source_url_uses_the_instance_unless_told():
    source = PrometheusSource({"lag": Selector("lag")})
    assert source.url(endpoint(9187)) == "http://10.0.0.1:9187/metrics"
    other = PrometheusSource({"lag": Selector("lag")}, path="/m", port=9100, scheme="https")
    assert other.url(endpoint(9187)) == "https://10.0.0.1:9100/m"


def test_the_documented_example_is_valid():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "collector.md").read_text()
    (toml_text,) = re.findall(r"```toml\n(.*?)```", doc, re.S)
    (yaml_text,) = re.findall(r"```yaml\n(.*?)```", doc, re.S)
    documented = parse_config(tomllib.loads(toml_text), "docs/collector.md")
    assert [s.source.type for s in documented.services] == ["postgres", "prometheus", "command"]
    from_yaml = parse_config(yaml.safe_load(yaml_text)).services[0]
    assert vars(from_yaml.source) == vars(documented.services[0].source)
    assert (from_yaml.interval, from_yaml.jitter, from_yaml.timeout) == (5.0, 0.5, 2.0)


def test_python_source_calls_the_plugin_with_its_options():
    document = config(
        source={
            "type": "python",
            "callable": "tests.unit.test_collector_config.plugin",
            "options": {"scale": 3},
        }
    )
    source = parse_config(document).services[0].source
    assert source.collect(endpoint(7), timeout=1) == {"port": 21}
    source.function = lambda endpoint, timeout, scale: [scale]
    with pytest.raises(SourceError, match="returned list, not a mapping"):
        source.collect(endpoint(7), timeout=1)
