"""The scheduler's rate limits and expiry: when a job may start, and whether it still may.

A job of a task with a ``rate_limit`` takes a turn from its bucket (``ratelimit.py``) before it
starts; one whose turn is later waits for it in a timer, holding no task slot, then queues to run
with its turn taken (``Job.waited``). A job past its expiry (``expires=``) is not started: a plain
one is counted (``jobs_expired``) and logged; a confirmed one is also recorded ``expired`` in the
journal. A job waiting for its turn is looked at again by its expiry at the latest.
"""

from __future__ import annotations

import time
from typing import Callable

import gevent
import gevent.queue

from ..errors import JobExpired
from .jobs import Job
from .journal_api import Outcome
from .ratelimit import RateLimits
from .runner import ErrorInfo, Runner


class Pacing:
    """The pacing half of `JobScheduler` (a mixin: it sets these)."""

    runner: Runner
    limits: RateLimits
    _ready: gevent.queue.Queue
    _timers: set[gevent.Greenlet]
    _settle: Callable[..., None]

    def _turn(self, job: Job) -> float:
        """Seconds ``job`` must wait for its rate limit's turn (taken now), or 0.0: it may start."""
        rate = job.task.rate_limit
        return 0.0 if rate is None or job.waited else self.limits.reserve(job.task.name, rate)

    def _wait_turn(self, delay: float, job: Job) -> None:
        """Queue ``job`` to run once its turn comes in ``delay`` seconds (or its expiry, if sooner)."""
        self.limits.waiting(job.task.name, 1)
        gevent.get_hub().loop.update_now()  # the timer counts from now, not from the hub's last wake-up
        timer = gevent.spawn_later(min(delay, self._expires_in(job)), self._turn_came, job)
        self._timers.add(timer)
        timer.link(self._timers.discard)

    def _turn_came(self, job: Job) -> None:
        self.limits.waiting(job.task.name, -1)
        self._ready.put(job._replace(waited=True))

    @staticmethod
    def _expires_in(job: Job) -> float:
        """Seconds until ``job`` expires (infinite: never)."""
        expires = job.request.options.get("expires") if job.durable else job.request.expires
        if expires is None:
            return float("inf")
        return max(0.0, expires - (time.time() if job.durable else time.monotonic()))

    def _expire(self, job: Job) -> bool:
        """Whether ``job`` is past its expiry: then it is counted and logged, and a confirmed one is
        recorded ``expired`` (never run, nor retried)."""
        late = self.runner.expired(job.request, durable=job.durable)
        if late is None:
            return False
        if job.durable:
            error = (JobExpired.__name__, f"job {job.request.id} ({job.task.name}) expired before it started "
                                          f"({late:.3f} s before this attempt could start)", "")
            self._settle(job, Outcome(job.request.id, "expired", job.attempts, 0.0, describe(error)), "expired",
                         error=error)
        return True


def describe(error: ErrorInfo) -> str:
    """An error as the journal keeps it: ``Type: message``."""
    return f"{error[0]}: {error[1]}"


__all__ = ["Pacing", "describe"]
