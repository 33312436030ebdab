"""Rate limits: how often one worker process starts the jobs of a task (``@registry.task(rate_limit="20/s")``).

Each limited task has a token bucket per worker process (`TokenBucket`) holding at most one
token (the burst): a job starts at once if a token is there, else it takes the next token to come
and waits for it, so the jobs of a task start at most one every ``1 / rate`` seconds, and an idle
task saves up no more than one start. The bucket hands out reservations rather than answering
"not yet": a waiting job knows when its turn comes and sleeps until then in a timer, holding no task
slot (``scheduler.py``), and nothing polls. Jobs wait in the order they reached the bucket.

Calls (``client.call``) are not limited: their caller waits for the reply under its own timeout.
Under ``--processes N`` each child has its own buckets, so a task runs at most ``N * rate`` jobs
a second on that worker; there is no fleet-wide limit.
"""

from __future__ import annotations

import re
import time
from typing import Callable, Optional

from ..errors import ConfigurationError

#: Seconds per unit of a rate string.
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"\s*(\d+(?:\.\d*)?)\s*/\s*([smh])\s*")


def parse_rate(value: Optional[str]) -> Optional[float]:
    """A rate string (``"100/s"``, ``"10/m"``, ``"600/h"``) as starts per second; ``None`` for ``None``.

    :raises ConfigurationError: not ``N/s``, ``N/m`` or ``N/h`` with ``N`` a number above 0.
    """
    if value is None:
        return None
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise ConfigurationError(
            f"rate_limit must be a string 'N/s', 'N/m' or 'N/h' with N a number above 0 (jobs started per "
            f"second, minute or hour), got {value!r}", setting="rate_limit")
    return float(match.group(1)) / UNITS[match.group(2)]


class TokenBucket:
    """One task's limiter in one process: ``rate`` starts per second, a burst of one.

    :param rate: tokens per second (float > 0).
    :param clock: the monotonic clock, seconds.
    """

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = 1.0 / rate
        self._clock = clock
        self._next = self._clock()  # when the next token is there (the bucket holds at most one)
        #: jobs holding a reservation whose time has not come yet
        self.waiting = 0

    def reserve(self) -> float:
        """Take the next token: seconds to wait before starting (0.0: start now). Never blocks."""
        now = self._clock()
        start = max(now, self._next)
        self._next = start + self.interval
        return start - now


class RateLimits:
    """The buckets of one worker process, by task name, created on first use."""

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}

    def reserve(self, task: str, rate: float) -> float:
        """Seconds a job of ``task`` (limited to ``rate`` starts per second) must wait before it starts."""
        bucket = self._buckets.get(task)
        if bucket is None:
            bucket = self._buckets[task] = TokenBucket(rate)
        return bucket.reserve()

    def waiting(self, task: str, step: int) -> None:
        """A job of ``task`` starts (``step`` 1) or stops (-1) waiting for its reservation."""
        self._buckets[task].waiting += step

    def stats(self) -> dict[str, int]:
        """``{task: jobs waiting for their turn}`` for every limited task that has run here."""
        return {task: bucket.waiting for task, bucket in sorted(self._buckets.items())}


__all__ = ["RateLimits", "TokenBucket", "parse_rate"]
