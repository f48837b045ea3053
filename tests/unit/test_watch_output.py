"""``sentinel watch``'s lines and JSON for each kind of event, and ``--events`` kinds."""

import argparse
import json

import pytest

from sentinel.auth.envelope import Credential
from sentinel.cli.parsers.watch import EVENT_KINDS, event_kinds
from sentinel.cli.watch import describe, document
from sentinel.events import AuthChanged


def test_a_credential_change_shows_its_versions_and_never_the_secret():
    event = AuthChanged("db", 1, 2, Credential(2, {"user": "app", "password": "s3cret"}))
    assert describe(event) == [("db", "credential v1 -> v2")]
    assert document(event) == {
        "event": "AuthChanged",
        "service": "db",
        "old_version": 1,
        "new_version": 2,
    }
    assert "s3cret" not in json.dumps(document(event)) + repr(describe(event))


def test_event_kinds_take_short_names_or_event_names_in_any_case():
    assert event_kinds("shard, Connection") == {"ShardKeysChanged", "ConnectionChanged"}
    assert event_kinds("instanceschanged,metrics") == {"InstancesChanged", "MetricsChanged"}
    assert set(EVENT_KINDS.values()) == set(event_kinds(",".join(EVENT_KINDS)))
    with pytest.raises(argparse.ArgumentTypeError, match="unknown event kind 'metric'"):
        event_kinds("metric")
