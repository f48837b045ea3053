"""The exception tree: resolution errors carry their fields, a throttle is temporary, every
error pickles with its fields (Spark carries them from executors to the driver)."""

from __future__ import annotations

import inspect
import pickle

import pytest

from sentinel import errors
from sentinel.errors import (
    DecodeError,
    NoInstanceAvailable,
    PartitionNotFound,
    ReadThroughThrottled,
    ResolutionError,
    RotationFailed,
    SentinelError,
    ServiceNotFound,
)

ALL_ERRORS = [
    cls
    for _, cls in inspect.getmembers(errors, inspect.isclass)
    if issubclass(cls, SentinelError) and cls.__module__ == errors.__name__
]


def test_a_throttle_is_a_temporary_resolution_error_not_an_unknown_key():
    throttled = ReadThroughThrottled("db", "acme", rate=20.0)
    assert isinstance(throttled, ResolutionError)
    assert not isinstance(throttled, PartitionNotFound)
    assert (throttled.service, throttled.key, throttled.retry_after) == ("db", "acme", 0.05)


@pytest.mark.parametrize(
    ("error", "fields"),
    [
        (ServiceNotFound("db"), ("db", None, None, None)),
        (PartitionNotFound("db", "acme", "tenants", "no such key"), ("db", "acme", None, None)),
        (
            NoInstanceAvailable("none", service="db", key="acme", partition="p1", policy="p"),
            ("db", "acme", "p1", "p"),
        ),
    ],
)
def test_each_resolution_error_carries_its_fields(error, fields):
    assert isinstance(error, ResolutionError)
    assert (error.service, error.key, error.partition, error.policy) == fields


def test_messages_name_the_call():
    assert str(ServiceNotFound("db")) == "service 'db' is not registered"
    missing = PartitionNotFound("db", "acme", "tenants", "shard policy 'tenants' has no such key")
    assert str(missing) == (
        "service 'db': key 'acme' maps to no partition (shard policy 'tenants' has no such key)"
    )
    assert missing.shard_policy == "tenants"


@pytest.mark.parametrize(
    "error",
    [
        ServiceNotFound("db", "has an unreadable spec: bad"),
        PartitionNotFound("db", 7, "tenants", "no such key"),
        ReadThroughThrottled("db", "acme", 5.0),
        NoInstanceAvailable("none", service="db", key="k", partition="p1", policy="MinLag()"),
        DecodeError("/services/db", "not JSON"),
        RotationFailed("confirm", "timed out", ("worker-1",)),
    ],
    ids=lambda error: type(error).__name__,
)
def test_errors_pickle_with_their_message_and_fields(error):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)


def test_every_error_pickles():
    for cls in ALL_ERRORS:
        plain = cls.__new__(cls, "message")
        plain.args = ("message",)
        assert str(pickle.loads(pickle.dumps(plain))) == "message", cls


def test_the_docstring_draws_every_error_once_under_its_base():
    drawn: dict[str, str] = {}
    parents = ["SentinelError"]
    for line in errors.__doc__.splitlines():
        if "── " not in line:
            continue
        depth = (line.index("── ") - 5) // 4 + 1  # "    ├── " is depth 1
        name = line.split("── ")[1].split()[0]
        del parents[depth:]
        assert name not in drawn, f"{name} is drawn twice"
        drawn[name] = parents[-1]
        parents.append(name)
    assert sorted(drawn) == sorted(cls.__name__ for cls in ALL_ERRORS if cls is not SentinelError)
    for name, parent in drawn.items():
        assert issubclass(getattr(errors, name), getattr(errors, parent)), (name, parent)
