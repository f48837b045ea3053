"""Decoding cost per node: ``python -m benchmarks.decode``.

Times, best of 5 ``timeit.repeat`` rounds, what the cache does for each node it reads: an
instance node with two properties (``InstanceRecord.from_bytes``), the bare bounded ``decode``
of the same bytes, and a 400-key directory bucket (``decode_bucket``, which checks each key's
bucket and partition against the policy). Run it on two commits
(``git archive`` and ``PYTHONPATH``) to see what a change to the decoding boundary costs.
"""

from __future__ import annotations

import argparse
import timeit

from benchmarks.common import report
from sentinel.registry.records import InstanceRecord, decode
from sentinel.shards.spec import ShardPolicySpec, decode_bucket, encode_bucket


def main(argv: list[str] | None = None) -> None:
    """Print the table and write ``benchmarks/results/decode.json``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    record = InstanceRecord(
        "db", "p1", "a", "10.0.0.1", 5432, properties={"role": "replica", "tags": ["a", "b"]}
    )
    data = record.to_bytes("/services/db/p1:a")
    bucket = encode_bucket("/b", {f"tenant-{i}": f"p{i % 8}" for i in range(400)})
    # One bucket holds every key; the eight partitions declared, so both checks run.
    spec = ShardPolicySpec("t", "directory", partitions=tuple(f"p{i}" for i in range(8)), buckets=1)
    cases = {
        "instance node, whole record": (
            lambda: InstanceRecord.from_bytes("db", "p1:a", "/p", data),
            20_000,
        ),
        "instance node, decode only": (lambda: decode("/p", data), 20_000),
        "directory bucket of 400 keys": (lambda: decode_bucket(spec, 0, bucket), 2_000),
    }
    results = {
        name: min(timeit.repeat(call, number=number, repeat=args.rounds)) / number * 1e6
        for name, (call, number) in cases.items()
    }
    report(
        "decode",
        f"decoding one node: best of {args.rounds} rounds",
        ["node", "µs"],
        [(name, f"{us:.2f}") for name, us in results.items()],
        {"us": results},
    )


if __name__ == "__main__":
    main()
