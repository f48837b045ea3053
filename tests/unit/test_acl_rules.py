"""The ACL rules a secured namespace relies on, as pure functions (no server needed)."""

from __future__ import annotations

import pytest
from kazoo.security import ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, Id, Permissions

from sentinel.auth import acl
from sentinel.auth.enrolment import enrolled_owner, key_slot_acl, owned_by
from sentinel.errors import ValidationError

ADMIN = acl.identity_id("admin:admin-password")
CLIENT = acl.identity_id("billing-api:client-password")
OTHER = acl.identity_id("billing-batch:other-password")


def redacted(identity: Id) -> Id:
    """How ZooKeeper shows a digest id to a session without ADMIN on the node."""
    return Id("digest", identity.id.split(":")[0] + ":x")


def test_an_enrolled_slot_names_its_one_writer():
    assert enrolled_owner(key_slot_acl({ADMIN}, CLIENT), {ADMIN}) == CLIENT
    assert enrolled_owner(key_slot_acl({ADMIN}, None), {ADMIN}) is None  # the admin's alone


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        (list(OPEN_ACL_UNSAFE), "anyone"),
        (
            [ACL(Permissions.ALL, ADMIN), ACL(Permissions.WRITE, CLIENT), ACL(3, OTHER)],
            "2 identities",
        ),
        ([ACL(Permissions.ALL, ADMIN), ACL(Permissions.ALL, CLIENT)], "change its ACL"),
    ],
)
def test_a_slot_anyone_else_could_write_is_not_enrolled(entries, reason):
    with pytest.raises(ValueError, match=reason):
        enrolled_owner(entries, {ADMIN})


def test_ownership_is_compared_by_user_name_where_zookeeper_hides_hashes():
    entry = [ACL(Permissions.ALL, redacted(CLIENT)), acl.WORLD_READ]
    assert owned_by(entry, CLIENT, frozenset({redacted(ADMIN)}))
    assert not owned_by(entry, OTHER, frozenset({ADMIN}))
    assert not owned_by(list(OPEN_ACL_UNSAFE), CLIENT, frozenset({ADMIN}))
    assert not owned_by([*entry, ACL(Permissions.WRITE, OTHER)], CLIENT, frozenset({ADMIN}))


def test_a_secured_namespace_gives_nobody_unidentified_more_than_read():
    acls = acl.namespace_acls({role: f"{role}:pw" for role in acl.ROLES})
    for path, entries in acls.items():
        world = [e for e in entries if e.id.scheme == "world"]
        assert all(e.perms == Permissions.READ for e in world), path
    assert acl.writers(acls["/auth/.keys"]) == {acl.identity_id("admin:pw")}


def test_clients_service_nodes_let_anyone_add_and_only_admins_do_more():
    entries = acl.clients_service_acl_for({ADMIN})
    assert acl.WORLD_READ_CREATE in entries
    assert not acl.world_writable([e for e in entries if e != acl.WORLD_READ_CREATE])
    assert ACL(Permissions.ALL, ADMIN) in entries


def test_digest_ids_are_checked():
    assert acl.parse_digest_id(CLIENT.id) == CLIENT
    for text in ("billing-api", "billing-api:short", ":" + CLIENT.id.split(":")[1]):
        with pytest.raises(ValidationError):
            acl.parse_digest_id(text)


def test_only_the_admin_holds_admin_on_what_init_secure_sets():
    identities = {role: f"{role}:pw" for role in acl.ROLES}
    for path, entries in acl.namespace_acls(identities).items():
        holders = {e.id for e in entries if e.perms & Permissions.ADMIN}
        assert holders == {acl.identity_id(identities["admin"])}, path
    assert acl.role_acl("publisher:pw").perms == Permissions.ALL & ~Permissions.ADMIN


def test_a_node_nobody_may_write_is_nobodys():
    shut = list(READ_ACL_UNSAFE)  # a squatter's, shut after it wrote it
    assert not owned_by(shut, CLIENT, frozenset({ADMIN}))
    assert not owned_by(shut, None, frozenset({ADMIN}))  # nor the admin's
    assert owned_by([ACL(Permissions.ALL, ADMIN), acl.WORLD_READ], None, frozenset({ADMIN}))


def test_a_hidden_digest_is_told_from_a_whole_one():
    assert acl.hidden(redacted(CLIENT)) and not acl.hidden(CLIENT)
    assert not acl.hidden(Id("sasl", "billing-api"))
