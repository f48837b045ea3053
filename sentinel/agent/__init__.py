"""The host agent: one ZooKeeper session per host, shared by the host's processes.

``sentinel agent`` (:mod:`sentinel.agent.server`) follows what the processes on its host ask
for and serves them on a Unix socket; ``Sentinel(agent=...)`` (or ``$SENTINEL_AGENT``) makes a
client take its snapshots from there (:mod:`sentinel.agentlink.link`) instead of a session of its
own. The wire format is :mod:`sentinel.agentlink.protocol`; ``docs/agent.md`` is for operators.
"""
