"""The registry's data in ZooKeeper: where each node lives, the records it holds, the
endpoints built from them, and the direct reads and writes of that data (no cache)."""
