"""``sasl:user:password`` identities: kazoo's SASL options and ``sasl`` ACL entries (no server)."""

from __future__ import annotations

import pytest
from kazoo.security import ACL, Id

from sentinel.auth import acl
from sentinel.errors import ValidationError
from sentinel.testing.zookeeper import LocalZooKeeper


def test_a_sasl_identity_logs_in_with_digest_md5_and_owns_its_nodes_by_user_name():
    arguments = acl.client_arguments("sasl:alice:pw:with:colons")
    assert arguments["sasl_options"] == {
        "mechanism": "DIGEST-MD5",
        "username": "alice",
        "password": "pw:with:colons",
    }
    assert "auth_data" not in arguments
    assert arguments["default_acl"] == [ACL(31, Id("sasl", "alice")), acl.WORLD_READ]
    assert acl.owner_acl("sasl:alice:pw") == ACL(31, Id("sasl", "alice"))


def test_a_digest_identity_is_unchanged():
    arguments = acl.client_arguments("publisher:pw")
    assert arguments["auth_data"] == [("digest", "publisher:pw")]
    assert arguments["default_acl"][0].id.scheme == "digest"


def test_a_sasl_identity_without_a_password_is_refused_without_echoing_it():
    with pytest.raises(ValidationError) as raised:
        acl.client_arguments("sasl:alice:")
    assert "alice" not in str(raised.value)


@pytest.mark.parametrize("users", [{"al ice": "pw"}, {"alice": 'p"w'}, {"alice": ""}])
def test_the_launcher_refuses_sasl_users_it_cannot_write_into_jaas(users):
    with pytest.raises(ValueError, match="SASL user"):
        LocalZooKeeper(sasl_users=users)
