"""``sentinel doctor``'s checks of the namespace's ACLs: who may write each section and each
service's nodes, and the nodes no check expects there."""

from __future__ import annotations

import functools
import random
from collections import deque
from collections.abc import Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.protocol.states import ZnodeStat
from kazoo.security import Permissions

from sentinel.auth import acl
from sentinel.auth.enrolment import enrolled_owner
from sentinel.auth.grants import DAEMON_SERVICE_PREFIXES
from sentinel.cli.findings import Finding
from sentinel.registry.layout import (
    AUTH_KEYS,
    CLIENTS,
    SECTIONS,
    SERVICES,
)
from sentinel.registry.reads import (
    all_children,
    pipelined,
)

ACL_SAMPLE = 10_000
# Above this many problems under one /clients/<service>, they are one finding, not one each.
SHOWN_PER_SERVICE = 10


def acls(
    zk: KazooClient, namespace: str, identities: Mapping[str, str] | None = None
) -> list[Finding]:
    """The ACL of the root, every section and every node below them against what ``init
    --secure`` sets. Every node is checked but the entries of a ``/clients/<service>`` with
    more than ACL_SAMPLE of them: a random sample of those (said in a finding), and their
    problems add up to one finding per service (``N entries ... belong to no process``).

    ``identities`` (``--identities``): the session acts as every role, so ZooKeeper shows it
    the hash of each role's digest; identities are compared whole, and the root and the
    sections with exactly what ``init --secure`` sets. Without them, by user name, and a
    warning says how many nodes could not be told from a role's.
    """
    verified = identities is not None
    if not acl.is_secured(zk):
        return [
            Finding(
                "warn",
                "acl",
                f"anyone can write under {namespace}",
                f"{SECURE_FIX} --namespace {namespace} (ACLs per role, see docs/auth.md)",
            )
        ]
    admins = acl.admins(zk)
    expected = acl.namespace_acls(identities) if identities is not None else {}
    findings: list[Finding] = []
    for path in ("/", *SECTIONS, AUTH_KEYS):
        problem = _section_problem(zk, path, admins, expected.get(path))
        if problem is not None:
            findings.append(Finding("error", "acl", f"{path}: {problem}", _SECTION_FIX))
    queue = deque((section, zk.get_acls(section)[0]) for section in SECTIONS)
    checked, unverified = 0, 0
    sampled: list[Finding] = []
    entry_problems: dict[str, list[Finding]] = {}  # /clients/<service> -> its entries' problems
    while queue:
        parent, parent_acl = queue.popleft()
        children = all_children(zk, parent)
        if _is_clients_service(parent) and len(children) > ACL_SAMPLE:
            sampled.append(
                Finding(
                    "warn",
                    "acl",
                    f"{parent} has {len(children):,} entries: checked a random sample of "
                    f"{ACL_SAMPLE:,} of them",
                )
            )
            children = sorted(random.sample(children, ACL_SAMPLE))
        acls = pipelined(zk.get_acls_async, children, functools.partial(_child, parent))
        for child, result in acls:
            path = _child(parent, child)
            try:
                entries, stat = result.get()
            except NoNodeError:
                continue
            except NoAuthError:  # ZooKeeper shows an ACL (and children) only to its readers
                entries, stat = None, None
            checked += 1
            if entries is None:
                issue: tuple[str, str] | None = _UNREADABLE
            else:
                issue = _squatter(path, stat) or _acl_problem(
                    path, entries, parent_acl, admins, verified
                )
            if issue is not None:
                finding = Finding("error", "acl", f"{path}: {issue[0]}", issue[1])
                service = _clients_service_of(path)
                (entry_problems.setdefault(service, []) if service else findings).append(finding)
            elif not verified and not path.startswith(f"{CLIENTS}/"):
                unverified += any(acl.hidden(i) for i in acl.writers(entries))
            if stat is not None and stat.numChildren:
                # Below /clients/<service> and a daemon's service, their own ACL is the rule.
                own_rule = parent == CLIENTS or _daemon_service(path)
                queue.append((path, entries if own_rule else parent_acl))
    for service, problems in sorted(entry_problems.items()):
        findings += problems if len(problems) <= SHOWN_PER_SERVICE else [_junk(service, problems)]
    scope = f"{checked:,} nodes" + (" (some entries sampled)" if sampled else "")
    if not findings:
        findings.append(Finding("ok", "acl", f"{namespace} is secured; ACLs of {scope} as set"))
    findings += sampled
    if unverified:
        findings.append(
            Finding(
                "warn",
                "acl",
                f"{unverified:,} node(s) compared by user name only: ZooKeeper hides their "
                "digests from this session, so a node written with a role's user name and "
                "another password would pass",
                "sentinel doctor --identities FILE (the file init --secure wrote)",
            )
        )
    return findings


_UNREADABLE = (
    "nobody but its writer may read it (nor its ACL): nothing reads what it says",
    "a ZooKeeper superuser must delete it",
)


def _child(parent: str, name: str) -> str:
    return f"{parent}/{name}"


def _is_clients_service(path: str) -> bool:
    """Whether ``path`` is a ``/clients/<service>`` node."""
    return path.rpartition("/")[0] == CLIENTS


def _clients_service_of(path: str) -> str | None:
    """The ``/clients/<service>`` that ``path`` is below, or None."""
    parts = path.split("/")
    return "/".join(parts[:3]) if path.startswith(f"{CLIENTS}/") and len(parts) > 3 else None


def _junk(service: str, problems: list[Finding]) -> Finding:
    """One finding for the many problems found below one ``/clients/<service>``."""
    examples = ", ".join(p.detail.split(": ")[0].rpartition("/")[2] for p in problems[:3])
    return Finding(
        "error",
        "acl",
        f"{len(problems):,} entries under {service} belong to no process (e.g. {examples}): "
        "rotations and `auth status` ignore them, at the cost of one read each",
        problems[0].fix,
    )


SECURE_FIX = "sentinel init --secure --identities FILE"
_SECTION_FIX = (
    f"{SECURE_FIX} (when it reports the node unrepaired, its ACL shuts the admin out and a "
    "ZooKeeper superuser must reset it)"
)


def _section_problem(
    zk: KazooClient, path: str, admins: frozenset, expected: list | None
) -> str | None:
    """What is wrong with the ACL of the root or a section node, or None: anyone may write
    it, someone but the admins may change its ACL, or (``expected``, with ``--identities``)
    it is not what ``init --secure`` sets."""
    try:
        entries, _ = zk.get_acls(path)
    except NoNodeError:
        return None  # a missing section is the namespace check's finding
    if acl.world_writable(entries):
        return "anyone may write it"
    holders = {e.id for e in entries if e.perms & Permissions.ADMIN} - admins
    if holders:
        names = ", ".join(sorted(acl.principal(i).id for i in holders))
        return f"{names} may change its ACL (ADMIN): only the admin may"
    if expected is not None and sorted(entries) != sorted(expected):
        return "its ACL is not the one init --secure sets"
    return None


def _squatter(path: str, stat: ZnodeStat) -> tuple[str, str] | None:
    """What is wrong with a ``/clients`` entry that is no live process's (a client's entry is
    ephemeral, so it has no children), and the fix; None for any other node."""
    if not path.startswith(f"{CLIENTS}/") or len(path.strip("/").split("/")) != 3:
        return None
    if stat.ephemeralOwner and not stat.numChildren:
        return None
    kind = "has children" if stat.numChildren else "is persistent"
    return (
        f"not a client process's entry (it {kind}): rotations ignore it, and it keeps its "
        "name from the client",
        f"{SECURE_FIX} (removes it; when it reports it unrepaired, its ACL shuts the admin "
        "out and a ZooKeeper superuser must delete it)",
    )


def _acl_problem(
    path: str, entries: list, section_acl: list, admins: frozenset, verified: bool = False
) -> tuple[str, str] | None:
    """What is wrong with one node's ACL and the fix, or None."""
    parts = path.strip("/").split("/")
    if path.startswith(f"{AUTH_KEYS}/") and len(parts) == 3:
        try:
            enrolled_owner(entries, admins)
        except ValueError as exc:
            return f"key slot not as enrolled ({exc})", f"{SECURE_FIX} (resets it), then " + (
                f"sentinel auth enroll {parts[2]}"
            )
        return None
    if path.startswith(f"{CLIENTS}/") and len(parts) == 2:
        # Anyone may add an entry (READ|CREATE); nobody but the admins may do more.
        if sorted(entries) != sorted(acl.clients_service_acl_for(admins)):
            return "not admin-owned with create for all", SECURE_FIX
        return None
    if path.startswith(f"{CLIENTS}/"):
        if acl.world_writable(entries) or len(acl.writers(entries)) != 1:
            return (
                "a /clients entry with no owner: rotations neither count its confirmations "
                "nor wait for it",
                "give the client an identity of its own (docs/auth.md)",
            )
        return None
    if acl.world_writable(entries):
        return "anyone may write it", SECURE_FIX
    if _daemon_service(path):
        # Only the daemon role adds members; a section writer that may (the publisher, as
        # grants before this release set it) could add one that takes the daemons' work.
        creators = {e.id for e in entries if e.perms & Permissions.CREATE}
        if creators & (acl.writers(section_acl) - admins):
            return "the publisher may add members to this daemon's cluster", (
                "sentinel grant --identities FILE (gives members to the daemon role alone)"
            )
        # granted: the daemon role adds and removes instances, nothing more (sentinel grant)
        entries = [e for e in entries if e.perms & (Permissions.WRITE | Permissions.ADMIN)]
    allowed, found = acl.writers(section_acl), acl.writers(entries)
    if not found:
        return "nobody may write it, so nobody can change or remove what it says", (
            f"{SECURE_FIX} (removes it; when it reports it unrepaired, a ZooKeeper superuser "
            "must delete it)"
        )
    if not verified:  # the hashes are hidden: user names are all this session can compare
        allowed, found = {acl.principal(i) for i in allowed}, {acl.principal(i) for i in found}
    outsiders = found - allowed
    if outsiders:
        names = ", ".join(sorted(acl.principal(i).id for i in outsiders))
        impostor = {acl.principal(i) for i in outsiders} & {acl.principal(i) for i in allowed}
        why = " (a role's user name with another password)" if impostor else ""
        return f"writable by {names}{why}, outside its section's roles", f"{SECURE_FIX} " + (
            "(resets it, or removes it when it cannot)"
        )
    return None


def _daemon_service(path: str) -> bool:
    """Whether ``path`` is a daemon's own service node (:mod:`sentinel.auth.grants`)."""
    parent, _, name = path.rpartition("/")
    return parent == SERVICES and name.startswith(tuple(DAEMON_SERVICE_PREFIXES.values()))
