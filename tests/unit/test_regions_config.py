"""The regions configuration: one parser for code, the environment and the CLI; typed errors
that name the field; no password in a document or a repr."""

from __future__ import annotations

import json
import pickle
import re

import pytest

from sentinel import Sentinel
from sentinel.auth.acl import ANONYMOUS
from sentinel.cli import build_parser
from sentinel.cli.fanout import targets
from sentinel.cli.regions import apply
from sentinel.connection import client_arguments
from sentinel.errors import RegionConfigError, ValidationError
from sentinel.regions import Region, Regions
from sentinel.zk.tls import TlsConfig

DOCUMENT = {
    "local": "east",
    "regions": {
        "east": {"hosts": "127.0.0.1:2181", "namespace": "/prod"},
        "west": {
            "hosts": "10.1.0.1:2281,10.1.0.2:2281",
            "tls": {"ca": "/etc/zk/west-ca.pem"},
            "identity_env": "WEST_IDENTITY",
        },
    },
}
ENV = {"WEST_IDENTITY": "svc:s3cret"}
IN_CODE = Regions(
    "east",
    [
        Region("east", "127.0.0.1:2181", namespace="/prod"),
        Region(
            "west",
            "10.1.0.1:2281,10.1.0.2:2281",
            tls=TlsConfig(ca="/etc/zk/west-ca.pem"),
            identity="svc:s3cret",
        ),
    ],
)


def test_code_environment_file_and_cli_build_the_same_value(tmp_path, monkeypatch):
    text = json.dumps(DOCUMENT)
    file = tmp_path / "regions.json"
    file.write_text(text)
    assert Regions.parse(DOCUMENT, env=ENV) == IN_CODE
    assert Regions.from_env({"SENTINEL_REGIONS": text, **ENV}) == IN_CODE
    assert Regions.from_env({"SENTINEL_REGIONS": str(file), **ENV}) == IN_CODE
    monkeypatch.setenv("WEST_IDENTITY", "svc:s3cret")
    args = build_parser().parse_args(["ls", "--regions", str(file)])
    apply(args)
    assert args.regions_config == IN_CODE
    assert (args.zk, args.namespace) == ("127.0.0.1:2181", "/prod")
    assert [r.name for r in IN_CODE.others] == ["west"]
    assert pickle.loads(pickle.dumps(IN_CODE)) == IN_CODE


def test_the_region_variable_overrides_the_document_and_the_cli_connects_to_its_entry(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("WEST_IDENTITY", "svc:s3cret")
    regions = Regions.from_env(
        {"SENTINEL_REGIONS": json.dumps(DOCUMENT), "SENTINEL_REGION": "west", **ENV}
    )
    assert regions.local == "west" and [r.name for r in regions.others] == ["east"]
    args = build_parser().parse_args(["--region", "west", "ls", "--regions", json.dumps(DOCUMENT)])
    apply(args)
    assert args.zk == "10.1.0.1:2281,10.1.0.2:2281"
    assert args.region_tls == TlsConfig(ca="/etc/zk/west-ca.pem")
    assert args.region_identity == "svc:s3cret"
    # what is given on the command line wins over the region's entry
    args = build_parser().parse_args(
        [
            "ls",
            "--region",
            "west",
            "--zk",
            "h:1",
            "--namespace",
            "/x",
            "--regions",
            json.dumps(DOCUMENT),
        ]
    )
    apply(args)
    assert (args.zk, args.namespace) == ("h:1", "/x")
    args = build_parser().parse_args(["ls", "--region", "north", "--regions", json.dumps(DOCUMENT)])
    with pytest.raises(RegionConfigError, match="no region 'north'"):
        apply(args)


def test_the_client_takes_its_connection_from_its_regions_entry_unless_given():
    client = Sentinel(regions=IN_CODE, prometheus_registry=None)
    assert (client.hosts, client.namespace, client.regions) == ("127.0.0.1:2181", "/prod", IN_CODE)
    given = Sentinel("127.0.0.9:2181", namespace="/x", regions=IN_CODE, prometheus_registry=None)
    assert (given.hosts, given.namespace) == ("127.0.0.9:2181", "/x")
    assert Sentinel("127.0.0.1:2181", regions=False, prometheus_registry=None).regions is None


def test_no_regions_in_the_environment_means_one_region(monkeypatch):
    monkeypatch.delenv("SENTINEL_REGIONS", raising=False)
    monkeypatch.delenv("SENTINEL_REGION", raising=False)
    assert Regions.from_env() is None
    assert Regions.from_env({"SENTINEL_REGION": "east"}) == Regions("east")


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"regions": {}}, "local"),
        ({"local": "e", "regions": []}, "regions"),
        ({"local": "e", "extra": 1}, "regions document"),
        ({"local": "e/x"}, "local"),
        ({"local": "e", "regions": {"w": {}}}, "regions.w.hosts"),
        ({"local": "e", "regions": {"w": {"hosts": "a b:1"}}}, "regions.w.hosts"),
        ({"local": "e", "regions": {"w": {"hosts": "h:99999"}}}, "regions.w.hosts"),
        (
            {"local": "e", "regions": {"w": {"hosts": "h:1", "namespace": "x"}}},
            "regions.w.namespace",
        ),
        ({"local": "e", "regions": {"w": {"hosts": "h:1", "tls": {"ca": 3}}}}, "regions.w.tls.ca"),
        ({"local": "e", "regions": {"w": {"hosts": "h:1", "tls": {"cert": "c"}}}}, "regions.w.tls"),
        ({"local": "e", "regions": {"w": {"hosts": "h:1", "tls": "yes"}}}, "regions.w.tls"),
        ({"local": "e", "regions": {"w": {"hosts": "h:1", "identity": "u:p"}}}, "regions.w"),
        (
            {"local": "e", "regions": {"w": {"hosts": "h:1", "identity_env": "UNSET_X"}}},
            "regions.w.identity_env",
        ),
        ({"local": "e", "regions": {"w": "h:1"}}, "regions.w"),
        ({"local": "e", "regions": {"-w": {"hosts": "h:1"}}}, "regions"),
        ([], "regions document"),
    ],
)
def test_bad_input_is_a_typed_error_naming_the_field(document, field):
    with pytest.raises(RegionConfigError) as caught:
        Regions.parse(document, env={})
    assert caught.value.field == field
    assert isinstance(caught.value, ValidationError)


def test_a_local_region_the_configuration_does_not_hold_is_refused_with_the_one_meant(tmp_path):
    """``"local": "esat"`` beside ``east`` and ``west``: the client would take its own region
    for one to fail over to. Refused where the file is loaded, naming the regions and the
    closest one (two letters swapped: ``east``, not ``west``); in code and through
    ``$SENTINEL_REGION`` too. A configuration of no region names none to check against."""
    path = tmp_path / "regions.json"
    path.write_text(json.dumps({**DOCUMENT, "local": "esat"}))
    message = "local: no region 'esat'; configured: ['east', 'west']; did you mean 'east'?"
    with pytest.raises(RegionConfigError) as caught:
        Regions.from_text(str(path), env=ENV)
    assert (str(caught.value), caught.value.field) == (message, "local")
    overridden = {"SENTINEL_REGIONS": json.dumps(DOCUMENT), "SENTINEL_REGION": "esat", **ENV}
    with pytest.raises(RegionConfigError, match=re.escape(message)):
        Regions.from_env(overridden)
    with pytest.raises(RegionConfigError, match=r"configured: \['east', 'west'\]$"):
        Regions("north", IN_CODE.regions)  # nothing close: the names alone
    assert Regions("esat").regions == {}


def test_bad_text_is_refused_before_it_is_parsed(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b"{" + b" " * 70_000 + b"}")
    for text, why in [
        ("", "empty"),
        ("{nope", "not JSON"),
        (str(tmp_path / "missing"), "cannot read"),
        (str(big), "longer than"),
        ("[" * 100_000, "cannot read"),
    ]:
        with pytest.raises(RegionConfigError, match=why):
            Regions.from_text(text)
    deep = "{" + '"a":{' * 10_000 + "}" * 10_001
    with pytest.raises(RegionConfigError):
        Regions.from_text(deep[:60_000])


def test_in_code_values_are_checked_and_the_password_never_shows():
    with pytest.raises(RegionConfigError) as caught:
        Regions("east", [Region("w", "h:1"), Region("w", "h:2")])
    assert caught.value.field == "regions.w"
    with pytest.raises(RegionConfigError, match=r"regions\.w\.identity"):
        Region("w", "h:1", identity="no-colon")
    with pytest.raises(RegionConfigError, match=r"regions\.w\.tls"):
        Region("w", "h:1", tls="/ca.pem")  # type: ignore[arg-type]
    with pytest.raises(RegionConfigError, match="regions"):
        Regions("east", ["w"])  # type: ignore[list-item]
    with pytest.raises(RegionConfigError, match="regions"):
        Sentinel("127.0.0.1:2181", regions="east", prometheus_registry=None)  # type: ignore[arg-type]
    assert "s3cret" not in repr(IN_CODE) + repr(IN_CODE.others) + str(IN_CODE.region("west"))


def test_another_regions_session_never_gets_this_regions_password(monkeypatch):
    """$SENTINEL_ZK_IDENTITY is the local ensemble's password: a session to another region
    whose entry names no identity is anonymous there, never sent it."""
    monkeypatch.setenv("SENTINEL_ZK_IDENTITY", "local:pw")
    regions = Regions("east", [Region("east", "h:1"), IN_CODE.region("west")])
    for_west = client_arguments(regions.identity_of(regions.region("west")))
    assert for_west["auth_data"] == [("digest", "svc:s3cret")]  # its own, named by its entry
    bare = Regions("east", [Region("east", "h:1"), Region("north", "h:3")])
    assert "auth_data" not in client_arguments(bare.identity_of(bare.region("north")))
    assert client_arguments(bare.identity_of(bare.region("east")))["auth_data"] == [
        ("digest", "local:pw")
    ]
    args = build_parser().parse_args(["doctor", "--region", "all"])
    args.regions_config = bare
    by_region = {t.region: t.args.region_identity for t in targets(args)}
    assert by_region["north"] == ANONYMOUS
    assert "auth_data" not in client_arguments(by_region["north"])


def test_a_command_acting_in_another_region_keeps_its_home_and_its_password_home(monkeypatch):
    """``--region north`` from east: the command connects to north anonymously (north names
    no identity), and its home, whose password $SENTINEL_ZK_IDENTITY is, stays east, the
    document's ``local`` (or $SENTINEL_REGION's): a failover or a copy from east still
    presents it there (issue 50, item 4)."""
    monkeypatch.setenv("SENTINEL_ZK_IDENTITY", "local:pw")
    monkeypatch.delenv("SENTINEL_REGION", raising=False)
    document = json.dumps(
        {"local": "east", "regions": {"east": {"hosts": "h:1"}, "north": {"hosts": "h:3"}}}
    )
    args = build_parser().parse_args(["ls", "--region", "north", "--regions", document])
    apply(args)
    regions = args.regions_config
    assert (regions.local, regions.home, args.zk) == ("north", "east", "h:3")
    assert args.region_identity == ANONYMOUS
    assert regions.identity_of(regions.region("east")) is None  # the default: east's own
    assert regions.identity_of(regions.region("north")) == ANONYMOUS
    assert pickle.loads(pickle.dumps(regions)) == regions != regions.acting_in("east")
    assert "home='east'" in repr(regions)
    # Without a home named anywhere, the region acted in is all there is to go by.
    shared = json.dumps({"regions": {"east": {"hosts": "h:1"}, "north": {"hosts": "h:3"}}})
    args = build_parser().parse_args(["ls", "--region", "north", "--regions", shared])
    apply(args)
    assert args.regions_config.home == "north" and args.region_identity is None
    monkeypatch.setenv("SENTINEL_REGION", "east")
    apply(args)
    assert args.regions_config.home == "east" and args.region_identity == ANONYMOUS


def test_a_curator_publishers_acls_follow_the_identity_its_session_uses(monkeypatch):
    """The ACLs it writes and the identity its session sends are one decision: anonymous
    (``ANONYMOUS``) is anonymous in both, even with $SENTINEL_ZK_IDENTITY set."""
    from sentinel.curator import CuratorPublisher

    monkeypatch.setenv("SENTINEL_ZK_IDENTITY", "local:pw")
    anonymous = CuratorPublisher("127.0.0.1:1", identity=ANONYMOUS)
    assert not anonymous._identified and anonymous._base_acl is None
    assert not anonymous._zk.auth_data
    from_env = CuratorPublisher("127.0.0.1:1")
    assert from_env._identified and from_env._zk.auth_data == {("digest", "local:pw")}
