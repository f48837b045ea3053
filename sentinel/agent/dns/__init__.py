"""``sentinel agent --dns``: the agent's cache answered as DNS (A, AAAA, SRV, TXT).

:mod:`~sentinel.agent.dns.names`: the names asked for and what they mean;
:mod:`~sentinel.agent.dns.answers`: the records of a snapshot;
:mod:`~sentinel.agent.dns.rates`: each source's rate of queries;
:mod:`~sentinel.agent.dns.transports`: UDP and TCP;
:mod:`~sentinel.agent.dns.server`: the server, following services on demand.
"""
