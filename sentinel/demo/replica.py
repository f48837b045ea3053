"""A replica's publisher for the demo: registers one replica and holds its session until told.

``python -m sentinel.demo.replica HOSTS NAMESPACE SERVICE PARTITION LABEL HOST PORT SCHEME
PROPERTIES`` registers the replica (``PROPERTIES`` is a JSON object: the SQLite replicas name
their database file and their primary's), prints ``registered`` and waits for its standard
input to close, then leaves. Killed instead, it leaves its registration to
ZooKeeper, which removes it when the session times out: a crashed database host.
"""

from __future__ import annotations

import json
import sys

from sentinel.client import Sentinel

SESSION_TIMEOUT = 3.0


def main(argv: list[str]) -> int:
    """Register, report, wait for end of input."""
    hosts, namespace, service, partition, label, host, port, scheme, properties = argv
    with Sentinel(
        hosts, f"demo-replica-{partition}-{label}", namespace, session_timeout=SESSION_TIMEOUT
    ) as sentinel:
        sentinel.register(
            service,
            partition,
            host,
            int(port),
            scheme=scheme,
            label=label,
            properties=json.loads(properties),
        )
        print("registered", flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
