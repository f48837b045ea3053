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
from sentinel.auth.config import AuthConfig
from sentinel.cache.config import CacheConfig
from sentinel.errors import ValidationError
from sentinel.feedback import InstanceFeedback, OutlierDetection

HOSTS = "127.0.0.1:2181"  # never connected: nothing here calls start()

WRONG_SETTINGS = [
    ("connect_timeout", 0),
    ("connect_timeout", -1),
    ("connect_timeout", math.nan),
    ("connect_timeout", True),
    ("session_timeout", 0),
    ("session_timeout", "10"),
    ("feedback", 3),
    ("prometheus_registry", "default"),
    ("identity", 42),
    ("announce", "no"),
    ("announce", 1),
    ("cache", {"persistent_watches": False}),
    ("auth", "keys.json"),
]

WRONG_CACHE_SETTINGS = [
    ("read_through_rate", 0),
    ("read_through_rate", -5.0),
    ("read_through_rate", math.inf),
    ("read_through_rate", "100"),
    ("negative_ttl", -1),
    ("resync_jitter", -1),
    ("resync_jitter", 10**400),
    ("snapshot_interval", 0),
    ("snapshot_interval", None),
    ("inherited_max_age", -1),
    ("inherited_max_age", "old"),
    ("snapshot_path", 42),
    ("persistent_watches", None),
    ("events_on_connection_thread", "yes"),
    ("curator_base_paths", "/services"),  # a string is not a tuple of paths
    ("curator_base_paths", ("services",)),
    ("curator_base_paths", ("/services/",)),
    ("curator_base_paths", ("/a b",)),
    ("curator_base_paths", (None,)),
]

WRONG_AUTH_SETTINGS = [  # the setting, a wrong value, what the refusal names
    ("signer", 42, "signer"),
    ("signer", "not a key", "manager public key"),
    ("keys", 42, "keys"),
    ("require_signed", "yes", "require_signed"),
    ("client", "not a name!", "auth client"),
]


@pytest.mark.parametrize(("name", "value"), WRONG_SETTINGS)
def test_a_wrong_setting_is_refused_at_construction_naming_it(name, value):
    with pytest.raises(ValidationError, match=name):
        Sentinel(HOSTS, **{"prometheus_registry": None, name: value})


@pytest.mark.parametrize(("name", "value"), WRONG_CACHE_SETTINGS)
def test_a_wrong_cache_setting_is_refused_where_it_is_written(name, value):
    with pytest.raises(ValidationError, match=name):
        CacheConfig(**{name: value})


@pytest.mark.parametrize(("name", "value", "named"), WRONG_AUTH_SETTINGS)
def test_a_wrong_auth_setting_is_refused_where_it_is_written(name, value, named):
    with pytest.raises(ValidationError, match=named):
        AuthConfig(**{name: value})


def test_curator_base_paths_are_kept_as_a_tuple_and_were_never_a_keyword():
    assert CacheConfig(curator_base_paths=["/services", "/dubbo/x"]).curator_base_paths == (
        "/services",
        "/dubbo/x",
    )
    with pytest.raises(TypeError, match="curator_base_paths"):
        Sentinel(HOSTS, curator_base_paths=("/services",), prometheus_registry=None)


def test_a_keyword_no_release_took_is_a_type_error_as_for_any_function():
    with pytest.raises(TypeError, match="unexpected keyword argument 'sesion_timeout'"):
        Sentinel(HOSTS, sesion_timeout=3, prometheus_registry=None)


def test_a_secret_setting_is_never_in_the_message():
    with pytest.raises(ValidationError) as refused:
        Sentinel(HOSTS, identity=b"user:secret-password", prometheus_registry=None)
    assert "secret-password" not in str(refused.value)


def test_the_limits_themselves_and_none_are_accepted(tmp_path: Path):
    client = Sentinel(
        HOSTS,
        cache=CacheConfig(
            negative_ttl=0,
            resync_jitter=0,
            inherited_max_age=0,
            read_through_rate=0.5,
            snapshot_interval=0.01,
            snapshot_path=tmp_path / "snapshot.json",
            persistent_watches=False,
        ),
        auth=AuthConfig(signer=ManagerKey.generate().public_text, require_signed=None),
        feedback=InstanceFeedback(
            OutlierDetection(
                consecutive_failures=1,
                interval=0.001,
                min_success_percent=100,
                min_requests=1,
                base_ejection_time=0,
                max_ejection_time=0,
                max_ejection_percent=100,
                panic_threshold=100,
            ),
            smoothing=1,
        ),
        prometheus_registry=CollectorRegistry(),
        announce=False,
    )
    assert client.cache_config.inherited_max_age == 0
    assert CacheConfig(inherited_max_age=None).inherited_max_age is None


@pytest.mark.parametrize(
    "settings",
    [
        {"consecutive_failures": 0},
        {"consecutive_failures": 2.5},
        {"consecutive_failures": True},
        {"consecutive_failures": "3"},
        {"interval": 0},
        {"interval": "30"},
        {"min_success_percent": 101},
        {"min_success_percent": -1},
        {"min_requests": 0},
        {"base_ejection_time": -1},
        {"base_ejection_time": math.inf},
        {"max_ejection_time": 10},  # under the base
        {"max_ejection_percent": -5},
        {"max_ejection_percent": 100.5},
        {"panic_threshold": 100.5},
        {"panic_threshold": "50"},
    ],
)
def test_outlier_detection_settings_are_refused_naming_them(settings):
    with pytest.raises(ValidationError, match=next(iter(settings))):
        OutlierDetection(**settings)


@pytest.mark.parametrize(
    "settings",
    [
        {"smoothing": 0},
        {"smoothing": 1.5},
        {"decay_time": 0},
        {"decay_time": math.inf},
        {"decay_time": "10"},
        {"detection": 3},
        {"detection": {"consecutive_failures": 3}},
        {"clock": 1.0},
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
    from sentinel.testing.helpers import ManualClock
    from tests.unit.endpoints import endpoint

    feedback = InstanceFeedback(clock=ManualClock())  # still: the estimate does not decay
    one = endpoint("a")
    feedback.report(one, latency=0.25)
    with pytest.raises(ValidationError, match="latency"):
        feedback.report(one, latency=latency)
    assert feedback.latency(one) == 0.25  # the average is untouched


@pytest.mark.parametrize("call", ["listen", "cached_instances"])
def test_a_service_name_no_service_could_have_is_refused(call):
    client = Sentinel(HOSTS, client_id="names", prometheus_registry=None)
    arguments = ("bad name!", lambda event: None) if call == "listen" else ("bad name!",)
    with pytest.raises(ValidationError, match="service"):
        getattr(client, call)(*arguments)
    assert client.cached_instances("not-followed") == ()
