import pytest

from sentinel.errors import InvalidName, ValidationError
from sentinel.registry.layout import (
    AUTH_KEYS,
    NAME_MAX_LENGTH,
    SECTIONS,
    auth_keys_path,
    auth_path,
    client_path,
    instance_name,
    instance_path,
    metrics_path,
    parse_instance_name,
    sanitize_name,
    service_path,
    validate_name,
    validate_namespace,
)


@pytest.mark.parametrize("name", ["billing", "p1", "replica-a", "a.b_c-d", "_x", "9", "A" * 128])
def test_valid_names_pass(name):
    assert validate_name("service", name) == name


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "must not be empty"),
        ("a/b", "may only hold"),
        ("/abc", "may only hold"),
        ("a:b", "may only hold"),
        (".hidden", "must not start"),
        ("-dash", "must not start"),
        ("with space", "may only hold"),
        ("é", "may only hold"),
        ("a\n", "may only hold"),
        ("x" * (NAME_MAX_LENGTH + 1), "characters long"),
        (None, "must be a string"),
        (42, "must be a string"),
    ],
)
def test_invalid_names_raise_with_reason(name, fragment):
    with pytest.raises(InvalidName, match=fragment) as info:
        validate_name("partition", name)
    assert "partition" in str(info.value)
    assert isinstance(info.value, ValidationError) and isinstance(info.value, ValueError)


def test_instance_names_round_trip():
    assert instance_name("p1", "replica-a") == "p1:replica-a"
    assert parse_instance_name("p1:replica-a") == ("p1", "replica-a")
    assert instance_path("db", "p1", "a") == "/services/db/p1:a"
    assert service_path("db") == "/services/db"


@pytest.mark.parametrize("name", ["nolabel", "p1:", ":a", "p 1:a", "p1:a:b"])
def test_malformed_instance_names_are_rejected(name):
    with pytest.raises(InvalidName):
        parse_instance_name(name)


def test_every_node_of_one_instance_and_client_has_its_path():
    assert SECTIONS == ("/services", "/auth", "/shard_info", "/metrics", "/clients")
    assert metrics_path("db", "p1", "replica-a") == "/metrics/db/p1:replica-a"
    assert instance_path("db", "p1", "replica-a") == "/services/db/p1:replica-a"
    assert auth_path("db", "web-1") == "/auth/db/web-1"
    assert AUTH_KEYS == "/auth/.keys" and auth_keys_path("web-1") == "/auth/.keys/web-1"
    assert client_path("db", "web-1") == "/clients/db/web-1"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nolabel", "instance node name 'nolabel' has no ':'"),
        (":a", "partition name must not be empty"),
        ("p1:", "label name must not be empty"),
        ("p 1:a", "partition name 'p 1' may only hold"),
        # The first ':' splits: what follows it is the label, which cannot hold a ':'.
        ("p1:a:b", "label name 'a:b' may only hold"),
    ],
)
def test_a_malformed_instance_name_names_the_part_it_refuses(name, message):
    with pytest.raises(InvalidName) as info:
        parse_instance_name(name)
    assert str(info.value).startswith(message)


def test_the_errors_of_a_name_say_what_is_wrong_in_full():
    with pytest.raises(InvalidName) as info:
        validate_name("service", 42)
    assert str(info.value) == "service name must be a string, got int"
    with pytest.raises(InvalidName) as info:
        validate_name("service", "a b")
    assert str(info.value) == (
        "service name 'a b' may only hold ASCII letters, digits, '.', '_' and '-', "
        "and must not start with '.' or '-'"
    )
    with pytest.raises(InvalidName) as info:
        validate_name("service", "x" * 129)
    assert str(info.value) == "service name is 129 characters long; at most 128 are allowed"
    with pytest.raises(InvalidName) as info:
        validate_namespace("/sentinel/")
    assert str(info.value) == (
        "namespace '/sentinel/' must be an absolute path such as '/sentinel', made of "
        "valid names and without a trailing '/'"
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("10.0.0.1_5432", "10.0.0.1_5432"),
        ("::1_80", "__1_80"),
        ("host name", "host_name"),
        (".lead", "_.lead"),
        ("", "_"),
    ],
)
def test_sanitize_name_always_gives_a_valid_name(raw, expected):
    assert sanitize_name(raw) == expected
    validate_name("label", expected)


def test_sanitize_name_keeps_upper_case_letters():
    assert sanitize_name("Web-A.Example:8080") == "Web-A.Example_8080"


def test_sanitize_name_keeps_long_names_within_the_limit():
    assert len(sanitize_name("-" + "x" * 500)) == NAME_MAX_LENGTH


@pytest.mark.parametrize("namespace", ["/sentinel", "/a/b", "/env-1.prod"])
def test_valid_namespaces(namespace):
    assert validate_namespace(namespace) == namespace


@pytest.mark.parametrize("namespace", ["", "/", "sentinel", "/sentinel/", "//x", "/a b", None])
def test_invalid_namespaces(namespace):
    with pytest.raises(InvalidName):
        validate_namespace(namespace)
