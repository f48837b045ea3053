"""Every setting of Sentinel and InstanceFeedback is checked where it is given: a wrong value
raises ValidationError naming it at construction, never a plain ValueError or TypeError
later (a rate of 0 used to fail on the first read-through, on the lookup path)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sentinel import Sentinel
from sentinel.auth import ManagerKey
from sentinel.errors import ValidationError
from sentinel.feedback import InstanceFeedback

HOSTS = "127.0.0.1:2181"  # never connected: nothing here calls start()

WRONG_SETTINGS = [
    ("read_through_rate", 0),
    ("read_through_rate", -5.0),
    ("read_through_rate", math.inf),
    ("read_through_rate", "100"),
    ("connect_timeout", 0),
    ("connect_timeout", -1),
    ("connect_timeout", math.nan),
    ("connect_timeout", True),
    ("session_timeout", 0),
    ("session_timeout", "10"),
    ("drain_wait", -0.5),
    ("negative_ttl", -1),
    ("resync_jitter", -1),
    ("resync_jitter", 10**400),
    ("snapshot_interval", 0),
    ("snapshot_interval", None),
    ("inherited_max_age", -1),
    ("inherited_max_age", "old"),
    ("feedback", 3),
    ("prometheus_registry", "default"),
    ("identity", 42),
    ("auth_signer", 42),
    ("auth_signer", "not a key"),
    ("auth_keys", 42),
    ("snapshot_path", 42),
    ("announce", "no"),
    ("announce", 1),
    ("persistent_watches", None),
    ("require_signed", "yes"),
]


@pytest.mark.parametrize(("name", "value"), WRONG_SETTINGS)
def test_a_wrong_setting_is_refused_at_construction_naming_it(name, value):
    with pytest.raises(ValidationError) as refused:
        Sentinel(HOSTS, **{"prometheus_registry": None, name: value})
    assert name in str(refused.value) or name == "auth_signer"


def test_a_secret_setting_is_never_in_the_message():
    with pytest.raises(ValidationError) as refused:
        Sentinel(HOSTS, identity=b"user:secret-password", prometheus_registry=None)
    assert "secret-password" not in str(refused.value)


def test_the_limits_themselves_and_none_are_accepted(tmp_path: Path):
    client = Sentinel(
        HOSTS,
        drain_wait=0,
        negative_ttl=0,
        resync_jitter=0,
        inherited_max_age=0,
        read_through_rate=0.5,
        snapshot_interval=0.01,
        snapshot_path=tmp_path / "snapshot.json",
        feedback=InstanceFeedback(errors=1, down_for=0, smoothing=1),
        prometheus_registry=CollectorRegistry(),
        auth_signer=ManagerKey.generate().public_text,
        require_signed=None,
        persistent_watches=False,
        announce=False,
    )
    assert (client.drain_wait, client.inherited_max_age) == (0, 0)
    assert (
        Sentinel(HOSTS, inherited_max_age=None, prometheus_registry=None).inherited_max_age is None
    )


@pytest.mark.parametrize(
    "settings",
    [
        {"errors": 0},
        {"errors": 2.5},
        {"errors": True},
        {"errors": "3"},
        {"window": 0},
        {"window": "30"},
        {"down_for": -1},
        {"down_for": math.inf},
        {"smoothing": 0},
        {"smoothing": 1.5},
    ],
)
def test_feedback_settings_are_refused_naming_them(settings):
    with pytest.raises(ValidationError, match=next(iter(settings))):
        InstanceFeedback(**settings)


def test_an_empty_client_id_is_refused_not_replaced_by_the_default():
    with pytest.raises(ValidationError, match="client"):
        Sentinel(HOSTS, client_id="", prometheus_registry=None)


@pytest.mark.parametrize("latency", [math.nan, math.inf, -0.1, "fast", True])
def test_a_reported_latency_must_be_a_finite_number_of_zero_or_more(latency):
    from tests.unit.endpoints import endpoint

    feedback = InstanceFeedback()
    one = endpoint("a")
    feedback.report(one, latency=0.25)
    with pytest.raises(ValidationError, match="latency"):
        feedback.report(one, latency=latency)
    assert feedback.latency(one) == 0.25  # the average is untouched


@pytest.mark.parametrize("call", ["listen", "instances"])
def test_a_service_name_no_service_could_have_is_refused(call):
    client = Sentinel(HOSTS, client_id="names", prometheus_registry=None)
    arguments = ("bad name!", lambda event: None) if call == "listen" else ("bad name!",)
    with pytest.raises(ValidationError, match="service"):
        getattr(client, call)(*arguments)
    assert client.instances("not-followed") == ()
