import pytest

from sentinel.errors import InvalidName, ValidationError
from sentinel.registry.layout import (
    NAME_MAX_LENGTH,
    instance_name,
    instance_path,
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


def test_sanitize_name_keeps_long_names_within_the_limit():
    assert len(sanitize_name("-" + "x" * 500)) == NAME_MAX_LENGTH


@pytest.mark.parametrize("namespace", ["/sentinel", "/a/b", "/env-1.prod"])
def test_valid_namespaces(namespace):
    assert validate_namespace(namespace) == namespace


@pytest.mark.parametrize("namespace", ["", "/", "sentinel", "/sentinel/", "//x", "/a b", None])
def test_invalid_namespaces(namespace):
    with pytest.raises(InvalidName):
        validate_namespace(namespace)
