"""A process's side of the host agent: the wire format both ends speak
(:mod:`sentinel.agentlink.protocol`) and the process's end of the socket
(:mod:`sentinel.agentlink.link`), which the session opens as it opens kazoo's client.

Apart from :mod:`sentinel.agent`, the daemon, which is a role built on a client: the session
below the client opens this link, so it may not live in a package above the client.
"""
