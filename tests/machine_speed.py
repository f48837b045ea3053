"""How fast this machine runs a fixed piece of Python: ``python3 -m tests.machine_speed LABEL``.

``./run.sh test`` prints it before the set-up and after the suite. On the 2-core machine the
suite runs on, the CPU time of the same fixed work changes from one quarter of an hour to the
next with nothing else running and no steal time counted, and a run's time changes with it
(docs/testing-history.md, "Machine speed"): read a run's time beside these two figures. Standard
library only, so that it runs before the project's environment exists."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence

LOOP = 600_000
SAMPLES = 5


def sample() -> float:
    """The CPU time, in seconds, of one fixed loop of integer arithmetic in this process."""
    started = time.process_time()
    total = 0
    for i in range(LOOP):
        total += i * i % 7
    return time.process_time() - started


def reading(samples: int = SAMPLES) -> tuple[float, float, float]:
    """The median, fastest and slowest of ``samples`` loops, in milliseconds."""
    taken = [sample() * 1000 for _ in range(samples)]
    return statistics.median(taken), min(taken), max(taken)


def main(argv: Sequence[str] | None = None) -> int:
    """Print one line: the label, then the reading."""
    label = " ".join(sys.argv[1:] if argv is None else argv) or "now"
    median, fastest, slowest = reading()
    print(
        f"run.sh: machine speed {label}: a fixed loop took {median:.0f} ms of CPU "
        f"(median of {SAMPLES}, {fastest:.0f}-{slowest:.0f}; "
        "docs/testing-history.md, 'Machine speed')",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
