"""A replica's agent for the demo: registers one replica and holds its session until told.

``python -m sentinel.demo.agent HOSTS NAMESPACE SERVICE PARTITION LABEL PORT PATH PRIMARY``
registers the replica (its database file and its primary's in the ``path`` and ``primary``
properties), prints ``registered`` and waits for
its standard input to close, then leaves. Killed instead, it leaves its registration to
ZooKeeper, which removes it when the session times out: a crashed database host.
"""

from __future__ import annotations

import sys

from sentinel.client import Sentinel

SESSION_TIMEOUT = 3.0


def main(argv: list[str]) -> int:
    """Register, report, wait for end of input."""
    hosts, namespace, service, partition, label, port, path, primary = argv
    with Sentinel(
        hosts, f"demo-agent-{partition}-{label}", namespace, session_timeout=SESSION_TIMEOUT
    ) as sentinel:
        sentinel.register_service(
            service,
            partition,
            "127.0.0.1",
            int(port),
            scheme="sqlite",
            label=label,
            properties={"path": path, "primary": primary},
        )
        print("registered", flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
