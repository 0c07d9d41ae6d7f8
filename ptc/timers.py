"""Process-wide stage timers for benchmarks: cheap enough to leave on (one perf_counter pair
per call site), read and reset by `ptc bench` to split wall time into forward passes,
solves, hashing and bank I/O."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

SECONDS: defaultdict[str, float] = defaultdict(float)
CALLS: defaultdict[str, int] = defaultdict(int)


@contextmanager
def timed(name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        SECONDS[name] += time.perf_counter() - start
        CALLS[name] += 1


def snapshot_and_reset() -> dict[str, dict[str, float]]:
    figures = {name: {"seconds": SECONDS[name], "calls": CALLS[name]} for name in sorted(SECONDS)}
    SECONDS.clear()
    CALLS.clear()
    return figures
