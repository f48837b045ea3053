"""Attacks on the registries beside the namespace's own sections, on a namespace secured by the
CLI (docs/auth.md, threat model): the collector's cluster, the instances a secured namespace
serves, and the Curator base paths its clients follow (issue 37 items 7 and 8)."""

from __future__ import annotations

import pytest

from sentinel.collector.runner import CONFIG_PROPERTY, member_service
from sentinel.errors import AccessDenied
from sentinel.registry.layout import DEFAULT_COLLECTOR_CLUSTER, service_path
from tests.integration import test_attacks
from tests.integration.test_attacks import SecuredNamespace, intruders, refused

pytestmark = [pytest.mark.integration, pytest.mark.faults]
# The namespaces test_attacks.py makes: secured by the CLI, and open until a test secures it.
secured = test_attacks.secured
upgrade = test_attacks.upgrade


# --- the collector's cluster ------------------------------------------------------------------


def test_only_the_collector_identity_joins_the_collectors_cluster(secured: SecuredNamespace):
    """The publisher identity writes /services, but not the collector's cluster group: a
    member it registered with a forged configuration digest would be the cluster's
    configuration if it outnumbered the real ones, and every real collector would refuse
    work (issue 37: collection stopped for 25 s)."""
    cluster = member_service(DEFAULT_COLLECTOR_CLUSTER)
    publisher = secured.role("publisher")
    with pytest.raises(AccessDenied):
        publisher.register(
            cluster,
            DEFAULT_COLLECTOR_CLUSTER,
            "6.6.6.6",
            1,
            label="forged",
            properties={CONFIG_PROPERTY: "0" * 64},
        )
    raw = secured.kazoo(secured.identities["publisher"])
    assert refused(lambda: raw.create(f"{service_path(cluster)}/default:forged-2", b"{}"))
    for intruder in intruders(secured):
        assert refused(lambda i=intruder: i.create(f"{service_path(cluster)}/default:x", b"{}"))
    # The collector identity still joins.
    collector = secured.role("collector")
    member = collector.register(
        cluster,
        DEFAULT_COLLECTOR_CLUSTER,
        "10.0.0.9",
        1,
        label="c1",
        properties={CONFIG_PROPERTY: "1" * 64},
    )
    assert secured.kazoo().exists(member.path) is not None
