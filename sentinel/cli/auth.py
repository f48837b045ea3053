"""``sentinel auth``: client keys, publishing credentials, rotation, and who has applied what."""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from kazoo.security import Id

from sentinel.auth import acl
from sentinel.auth.enrolment import enroll
from sentinel.auth.entries import ClientEntries, enrolled_owners
from sentinel.auth.keys import ClientKeyring, ManagerKey
from sentinel.auth.manager import Rotation, live_versions
from sentinel.auth.store import publish_public_keys, read_public_keys
from sentinel.cli.common import (
    client,
    connect,
    print_json,
    print_table,
)
from sentinel.cli.options import (
    EXIT_OK,
)
from sentinel.errors import ClientKeyNotFound, DecodeError, RotationFailed, ValidationError
from sentinel.plugins import AUTH_BACKENDS, load
from sentinel.registry.layout import AUTH, CLIENTS, auth_keys_path, validate_name
from sentinel.registry.reads import valid_children
from sentinel.registry.records import parse_json


def _keygen(args: argparse.Namespace) -> int:
    path = Path(args.out)
    # Checked before anything is written: an existing key file is never overwritten.
    if path.exists() and not args.add:
        raise ValidationError(f"{path} exists: use --add to add a key to a client key ring")
    if args.add and args.manager:
        raise ValidationError("--add applies to client key rings, not to --manager")
    if args.publish and not args.client:
        raise ValidationError("--publish needs --client ID")
    if args.manager:
        key = ManagerKey.generate()
        key.save(path)
        document: dict[str, Any] = {"file": str(path), "id": key.id, "public": key.public_text}
        if not args.json:
            print(f"manager signing key {key.id} written to {path}")
            print(f"clients trust it with AuthConfig(signer={key.public_text!r})")
    else:
        ring = ClientKeyring.load(path).with_new_key() if args.add else ClientKeyring.generate()
        ring.save(path)
        document = {"file": str(path), "key_ids": list(ring.key_ids)}
        if args.publish:
            with connect(args) as zk:
                document["published"] = publish_public_keys(zk, args.client, ring)
        if not args.json:
            print(f"key ring {path}: keys {', '.join(ring.key_ids)} (newest first)")
    if args.json:
        print_json(document)
    return EXIT_OK


def _enroll(args: argparse.Namespace) -> int:
    given = [a for a in (args.digest, args.sasl_user, args.identity_file) if a is not None]
    if len(given) != 1:
        raise ValidationError(
            "give exactly one of --digest ID, --sasl-user USER or --identity-file FILE"
        )
    if args.digest is not None:
        owner = acl.parse_digest_id(args.digest)
    elif args.sasl_user is not None:
        owner = Id("sasl", validate_name("SASL user", args.sasl_user))
    else:
        identity = acl.load_client_identity(args.identity_file, args.client, create_missing=True)
        owner = acl.identity_id(identity)
    admin = acl.load_identities(args.identities)["admin"] if args.identities else None
    with connect(args, identity=admin) as zk:
        changed = enroll(zk, args.client, owner, replace=args.replace)
    document = {"client": args.client, "owner": owner.id, "changed": changed}
    if args.json:
        print_json(document)
    else:
        state = "enrolled" if changed else "already enrolled"
        slot = auth_keys_path(args.client)
        print(f"client {args.client} {state}: {owner.id.split(':')[0]} writes {slot}")
        if args.identity_file:
            print(f"the client connects with the identity in {args.identity_file}")
    return EXIT_OK


def _credential(args: argparse.Namespace) -> dict[str, Any]:
    """From a JSON file or stdin: a secret never appears on the command line (ps shows it)."""
    try:
        text = sys.stdin.read() if args.credential == "-" else Path(args.credential).read_text()
    except OSError as exc:
        raise ValidationError(f"cannot read the credential file: {exc.strerror}") from None
    try:
        # The registry's bounded parser: deep nesting or huge numbers are bad input too.
        document = parse_json("the credential", text, max_bytes=None)
    except DecodeError:
        raise ValidationError("the credential must be a JSON object") from None
    if not isinstance(document, dict):
        raise ValidationError("the credential must be a JSON object")
    return document


def _signer(args: argparse.Namespace) -> ManagerKey | None:
    """``--signing-key FILE``, else the file ``$SENTINEL_AUTH_SIGNING_KEY_FILE`` names."""
    return ManagerKey.load(args.signing_key) if args.signing_key else ManagerKey.from_env()


def _set(args: argparse.Namespace) -> int:
    credential = _credential(args)
    with client(args) as sentinel:
        version = sentinel.credentials.publish(
            args.service, args.client, credential, signer=_signer(args)
        )
    if args.json:
        print_json({"service": args.service, "client": args.client, "version": version})
    else:
        print(f"published credential v{version} for client {args.client} of {args.service}")
    return EXIT_OK


def _backend(args: argparse.Namespace) -> Any:
    options = {}
    for option in args.option:
        name, sep, value = option.partition("=")
        if not sep:
            raise ValidationError(f"--option {option!r} is not NAME=VALUE")
        # env:NAME keeps a DSN with a password out of the command line.
        options[name] = os.environ.get(value[4:], "") if value.startswith("env:") else value
    return load(AUTH_BACKENDS, args.backend, **options)


def _rotate(args: argparse.Namespace) -> int:
    backend = _backend(args)
    with connect(args) as zk:  # rooted at the namespace, which connect() validated
        clients = args.client or valid_children(zk, f"{AUTH}/{args.service}")
        if not clients:
            raise ValidationError(f"no client has credentials for {args.service}: name --client")
        rotation = Rotation(
            zk, args.namespace, args.service, clients, backend, signer=_signer(args)
        )
        try:
            result = (
                rotation.resume(args.timeout_confirm)
                if args.resume
                else rotation.run(args.timeout_confirm)
            )
        except RotationFailed as exc:
            if args.json:
                print_json({"step": exc.step, "laggards": list(exc.laggards), "error": str(exc)})
            raise
    if args.json:
        print_json(
            {
                "service": result.service,
                "versions": dict(result.versions),
                "revoked": {c: list(v) for c, v in result.revoked.items()},
                "confirmed_in": result.confirmed_in,
            }
        )
    else:
        rows = [
            (c, f"v{v}", ", ".join(f"v{o}" for o in result.revoked.get(c, ())) or "-")
            for c, v in sorted(result.versions.items())
        ]
        print_table(rows, ("client", "new", "revoked"))
        print(f"confirmed by every live client in {result.confirmed_in * 1000:.0f} ms")
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    service = validate_name("service", args.service)
    with connect(args) as zk:
        # In a secured namespace only entries an enrolled identity wrote are its processes:
        # anyone may add entries under /clients/<service>, and those are counted apart.
        census = ClientEntries(zk, service, owners=enrolled_owners(zk)).read()
        processes = census.processes
        rows = []
        for name in sorted(set(valid_children(zk, f"{AUTH}/{service}")) | set(processes)):
            try:
                keys = ",".join(k.id for k in read_public_keys(zk, name).keys)
            except (ClientKeyNotFound, DecodeError):
                keys = "-"
            rows.append(
                {
                    "client": name,
                    "published": list(live_versions(zk, service, name)),
                    "live": name in processes,
                    "processes": processes.get(name, {}),
                    "keys": keys,
                }
            )
    if census.ignored:
        why = ", ".join(f"{n:,} {reason}" for reason, n in sorted(census.ignored.items()))
        print(
            f"{sum(census.ignored.values()):,} entries under {CLIENTS}/{service} belong to no "
            f"process and are not listed ({why}); `sentinel doctor` reports them",
            file=sys.stderr,
        )
    if args.json:
        print_json(rows)
    else:
        print_table(
            [
                (
                    r["client"],
                    ", ".join(f"v{v}" for v in r["published"]) or "-",
                    len(r["processes"]),
                    _applied(r["processes"]),
                    r["keys"],
                )
                for r in rows
            ],
            ("client", "published", "processes", "applied", "keys"),
        )
    return EXIT_OK


def _applied(processes: dict[str, object]) -> str:
    """``v2 x3, v1 x1``: how many live processes confirmed each version."""
    counts = Counter("-" if v is None else f"v{v}" for v in processes.values())
    return ", ".join(f"{version} x{n}" for version, n in sorted(counts.items())) or "-"
