"""How Sentinel talks to ZooKeeper: the 3.6 protocol extension over kazoo, the transport,
the connection (identity, TLS, log redaction), ephemeral nodes kept across sessions, and the
local development server."""
