"""Admission of confirmed jobs read on a worker's rpc socket: a bounded count in flight, a bounded hold before it.

A confirmed job read on the rpc socket takes an *admission place* (at most
`ADMISSIONS`) until it is answered: while it waits for its group commit,
and after that while its acknowledgement waits for a backlog place in the
scheduler. When every place is taken, the job is *held* in a
`HeldConfirms` (oldest first, one entry per job id, at most
`HELD_CONFIRMS`), unacknowledged, and the rpc socket keeps being read,
so the worker's own calls (``zqsync.ping``, ``zqsync.stats``) still answer at
once. A resend under an id already held (the client sends again every
``ZQSYNC_CONFIRM_RETRY`` seconds) only updates where the answer goes. Past
that bound a new confirm is not acknowledged at all; its client sends it
again. Nothing is acknowledged before it is journaled, and memory stays bounded.
"""

from __future__ import annotations

import collections
from typing import Any, Optional

import gevent.event
import gevent.lock

#: Confirmed jobs received and not yet answered at once (they share group commits).
ADMISSIONS = 64
#: Confirmed jobs held, unacknowledged, while every admission place is taken; past it a new one is not
#: acknowledged (its client sends it again).
HELD_CONFIRMS = 1000


class Admissions:
    """Confirmed jobs received and not yet answered, at most ``size``: a count, with no greenlet per job.

    Quacks like the part of a ``gevent.pool.Pool`` that `Worker._offer_work` and a stop use
    (``free_count``, ``wait_available``, ``join``).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = gevent.lock.BoundedSemaphore(size)
        self._idle = gevent.event.Event()
        self._idle.set()

    def acquire(self) -> None:
        """Take a place; blocks the calling greenlet while all ``size`` are taken."""
        self._free.acquire()
        self._idle.clear()

    def release(self) -> None:
        """Give a place back (the job was answered)."""
        self._free.release()
        if self._free.counter == self.size:
            self._idle.set()

    def free_count(self) -> int:
        """Places free now."""
        return int(self._free.counter)

    def wait_available(self) -> None:
        """Block the calling greenlet until a place is free."""
        self._free.wait()

    def join(self, timeout: Optional[float] = None) -> None:
        """Block the calling greenlet until every job taken in is answered, or ``timeout`` seconds."""
        self._idle.wait(timeout)


class HeldConfirms:
    """Confirmed jobs waiting for an admission place: oldest first, one per job id, at most ``size``.

    An entry is whatever the worker needs to admit the job later (its reply envelope and request).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._jobs: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._some = gevent.event.Event()

    def __len__(self) -> int:
        return len(self._jobs)

    def hold(self, job_id: str, entry: Any) -> bool:
        """Hold ``entry`` for ``job_id``, replacing (in its place in line) one already held under that id;
        ``False`` if the hold is full and the job is new: it is not held."""
        if job_id not in self._jobs and len(self._jobs) >= self.size:
            return False
        self._jobs[job_id] = entry
        self._some.set()
        return True

    def wait(self) -> None:
        """Block the calling greenlet until some job is held."""
        while not self._jobs:
            self._some.clear()
            self._some.wait()

    def pop(self) -> Any:
        """The oldest entry, removed. :raises KeyError: none is held."""
        return self._jobs.popitem(last=False)[1]

    def clear(self) -> int:
        """Forget every held job; returns how many there were."""
        count = len(self._jobs)
        self._jobs.clear()
        return count


__all__ = ["ADMISSIONS", "HELD_CONFIRMS", "Admissions", "HeldConfirms"]
