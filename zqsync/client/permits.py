"""Per-owner permits that cap sockets in flight (docs/design.md, pool rules 5 and 6).

A hub owner waits cooperatively on `FairPermits`, first come first
served. (``gevent.lock.BoundedSemaphore`` lets a greenlet that just released
a permit take it straight back ahead of the queued ones; with 50 greenlets on
4 sockets that starved some for seconds.) A native-thread owner uses
`ThreadPermits`, built on the *original* ``_thread`` lock even under
monkey-patching, so a lease in a plain thread never creates a hub.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Optional

from .._common import native_lock
from .owner import Owner


class ThreadPermits:
    """Counting semaphore for a native-thread owner.

    A thread owner has a single flow of control and nested leases raise, so
    this is never contended in practice; it still honours the cap and a
    timeout (polling every millisecond).
    """

    def __init__(self, value: int) -> None:
        self._value = value
        self._lock = native_lock()

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take a permit; ``False`` if none came free within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._value > 0:
                    self._value -= 1
                    return True
            if not blocking or (deadline is not None and time.monotonic() >= deadline):
                return False
            time.sleep(0.001)

    def release(self) -> None:
        """Give a permit back."""
        with self._lock:
            self._value += 1

    def available(self) -> bool:
        """Whether a permit is free now (a read, without taking it)."""
        return self._value > 0


class FairPermits:
    """A first-in, first-out counting semaphore for the greenlets of one hub.

    A released permit is handed to the oldest waiter directly, and the
    fast path (a free permit, taken without waiting) is closed while anyone
    waits, so no greenlet can overtake the queue.
    """

    def __init__(self, value: int) -> None:
        self._value = value
        self._waiters: collections.deque[Any] = collections.deque()

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take a permit, waiting cooperatively; ``False`` if none came within ``timeout`` seconds."""
        if self._value > 0 and not self._waiters:
            self._value -= 1
            return True
        if not blocking:
            return False
        from gevent.event import Event

        turn = Event()
        self._waiters.append(turn)
        try:
            granted = turn.wait(timeout)
        except BaseException:  # interrupted (a caller's Timeout, GreenletExit): never keep a permit
            if not self._leave(turn):
                self.release()
            raise
        return granted or not self._leave(turn)

    def _leave(self, turn: Any) -> bool:
        """Leave the queue; ``False`` if release() handed us the permit meanwhile (we then hold it)."""
        try:
            self._waiters.remove(turn)
            return True
        except ValueError:
            return False

    def available(self) -> bool:
        """Whether a permit is free now and nobody queues for one (a read, without taking it)."""
        return self._value > 0 and not self._waiters

    def release(self) -> None:
        """Give a permit back: to the oldest waiter if there is one."""
        if self._waiters:
            self._waiters.popleft().set()
        else:
            self._value += 1


def new_permits(owner: Owner, value: int) -> Any:
    """Permits for ``owner``: `FairPermits` under a hub, `ThreadPermits` otherwise."""
    return FairPermits(value) if owner.green else ThreadPermits(value)
