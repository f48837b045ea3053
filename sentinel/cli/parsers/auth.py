"""``sentinel auth``: its parsers (implementation: :mod:`sentinel.cli.auth`)."""

from __future__ import annotations

import argparse

from sentinel.cli.options import SERVICE_HELP, OnDemand, add_command, add_parser, seconds
from sentinel.registry.layout import validate_name


def _signing_key_help() -> str:
    # The key module loads cryptography: read only when the help is shown.
    from sentinel.auth.keys import SIGNING_KEY_FILE_ENV

    return (
        f"manager key to sign with (default: ${SIGNING_KEY_FILE_ENV}); required in a secured "
        "namespace"
    )


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
        "auth:_enroll",
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
        "auth:_keygen",
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
            "auth:_set",
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
            "auth:_rotate",
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
            "auth:_status",
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
                help=OnDemand(_signing_key_help),
            )
