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
from sentinel.auth.keys import SIGNING_KEY_FILE_ENV, ClientKeyring, ManagerKey
from sentinel.auth.manager import ClientEntries, Rotation, enrolled_owners, live_versions
from sentinel.auth.store import publish_public_keys, read_public_keys
from sentinel.cli.common import (
    EXIT_OK,
    SERVICE_HELP,
    add_command,
    add_parser,
    client,
    connect,
    print_json,
    print_table,
    seconds,
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


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``auth enroll|keygen|set|rotate|status``."""
    group = add_parser(
        commands,
        "auth",
        "client keys, credentials and their rotation (/auth)",
        "Credentials are encrypted per client (HPKE to the client's public key) "
        "and rotated by the paper's Procedure 2. See docs/auth.md.",
        (
            "sentinel auth keygen --out etl.keys --client etl --publish",
            "sentinel auth set --service orders-db --client etl cred.json",
            "sentinel auth status --service orders-db",
            "sentinel auth VERB --help               # each verb's options and examples",
        ),
    )
    verbs = group.add_subparsers(dest="verb", required=True, metavar="VERB")

    enrol = add_command(
        verbs,
        "enroll",
        _enroll,
        "give a client the key slot only its identity may publish keys in (admin)",
        "Create /auth/.keys/CLIENT owned by the admin, writable by the identity given: "
        "--digest user:HASH as ZooKeeper shows it (the admin never sees the password), "
        "--sasl-user USER for a client that logs in with SASL, or "
        "--identity-file FILE, created with a new identity (mode 0600) when missing, for "
        "the client to connect with. Runs as the admin: --identities FILE (from sentinel "
        "init --secure) or $SENTINEL_ZK_IDENTITY. A slot enrolled for another identity is "
        "handed over only with --replace, which also clears the keys published in it.",
        (
            "sentinel auth enroll etl --identity-file etl.identity --identities identities.json",
            "sentinel auth enroll etl --digest etl:HASH           # as ZooKeeper shows it",
        ),
    )
    enrol.add_argument("client", type=lambda v: validate_name("client", v), metavar="CLIENT")
    enrol.add_argument("--digest", metavar="ID", help="the client's digest id (user:hash)")
    enrol.add_argument("--sasl-user", metavar="USER", help="the client's SASL user name")
    enrol.add_argument("--identity-file", metavar="FILE", help="the client's identity file")
    enrol.add_argument("--identities", metavar="FILE", help="act as the admin of this file")
    enrol.add_argument(
        "--replace", action="store_true", help="hand a slot over from another identity"
    )

    keygen = add_command(
        verbs,
        "keygen",
        _keygen,
        "create a client key ring (or the manager's signing key)",
        "Write a new X25519 key ring to --out (mode 0600). --add puts a new key in front of "
        "an existing ring, so the key itself can rotate; --publish writes the public keys to "
        "/auth/.keys/<client>. --manager writes an Ed25519 signing key for the manager instead.",
        (
            "sentinel auth keygen --out etl.keys --client etl --publish",
            "sentinel auth keygen --out etl.keys --client etl --add --publish   # rotate the key",
            "sentinel auth keygen --out manager.key --manager",
        ),
    )
    keygen.add_argument("--out", required=True, metavar="FILE")
    keygen.add_argument("--add", action="store_true", help="add a key to an existing ring")
    keygen.add_argument("--publish", action="store_true", help="publish the public keys")
    keygen.add_argument("--client", type=lambda v: validate_name("client", v), metavar="ID")
    keygen.add_argument("--manager", action="store_true", help="a manager signing key")

    for verb, handler, summary, description, examples in (
        (
            "set",
            _set,
            "publish a credential for a client",
            "Encrypt the credential (a JSON object read from FILE, or - for stdin; never "
            "from the command line) to the client's newest public key and make it the "
            "only live one.",
            (
                "sentinel auth set --service orders-db --client etl cred.json",
                "sentinel auth set --service orders-db --client etl - < cred.json   # from stdin",
            ),
        ),
        (
            "rotate",
            _rotate,
            "rotate credentials by Procedure 2 (create, publish, confirm, revoke)",
            "Create new credentials through a backend, publish them next to the old ones, "
            "wait until every live client confirms it applied them, then revoke the old ones. "
            "Exit 1 naming the step on failure; the old credentials then still work.",
            (
                "sentinel auth rotate --service orders-db --option path=creds.json",
                "sentinel auth rotate --service orders-db --backend postgres "
                "--option dsn=env:PG_ADMIN_DSN --client etl",
                "sentinel auth rotate --service orders-db --resume",
            ),
        ),
        (
            "status",
            _status,
            "which clients have which credential versions",
            "For each client of the service: published versions, whether it is live, the "
            "version it confirmed, and its key ids.",
            (
                "sentinel auth status --service orders-db",
                "sentinel auth status --service api --json",
            ),
        ),
    ):
        parser = add_command(verbs, verb, handler, summary, description, examples)
        parser.add_argument("--service", required=True, help=SERVICE_HELP)
        if verb == "set":
            parser.add_argument("--client", required=True)
            parser.add_argument("credential", metavar="FILE")
        if verb == "rotate":
            parser.add_argument(
                "--client", action="append", default=[], help="repeat; default: every client"
            )
            parser.add_argument(
                "--backend", default="file", help="credential backend entry point (file, postgres)"
            )
            parser.add_argument(
                "--option",
                action="append",
                default=[],
                metavar="NAME=VALUE",
                help="backend argument (VALUE env:NAME reads it from the environment), "
                "e.g. path=creds.json or dsn=env:PG_ADMIN_DSN",
            )
            parser.add_argument("--timeout-confirm", type=seconds, default=30.0, metavar="SECONDS")
            parser.add_argument(
                "--resume", action="store_true", help="finish a rotation that timed out"
            )
        if verb in ("set", "rotate"):
            parser.add_argument(
                "--signing-key",
                metavar="FILE",
                help=f"manager key to sign with (default: ${SIGNING_KEY_FILE_ENV}); required "
                "in a secured namespace",
            )
