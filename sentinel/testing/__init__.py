"""Real servers and helpers for tests, benchmarks and the demo (as ``kazoo.testing`` is kazoo's).

- :mod:`sentinel.testing.zookeeper`: start ZooKeeper on loopback (a server or an ensemble);
- :mod:`sentinel.testing.postgres`: start PostgreSQL on loopback (a primary and replicas);
- :mod:`sentinel.testing.spark`: start a Spark standalone cluster on loopback (a master and
  workers);
- :mod:`sentinel.testing.devserver`: start and stop the development ZooKeeper (``sentinel zk``);
- :mod:`sentinel.testing.helpers`: bounded waits, session expiry, a TCP proxy, publishers in
  child processes.
- :mod:`sentinel.testing.browser`: headless Chromium through Selenium (the dashboard's
  browser tests and benchmark).

The SDK never imports this package when it is imported: a client only resolves hosts
(:mod:`sentinel.devserver`), and starts nothing.
"""
