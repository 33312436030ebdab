"""Per-owner permits that cap sockets in flight (DESIGN.md, pool rules 5 and 6).

A hub owner waits on a ``gevent.lock.BoundedSemaphore`` (cooperative). A
native-thread owner uses :class:`ThreadPermits`, built on the *original*
``_thread`` lock even under monkey-patching, so a lease in a plain thread
never creates a hub.
"""

from __future__ import annotations

import _thread
import sys
import time
from typing import Any, Optional

from .owner import Owner


def native_lock() -> Any:
    """A real (never monkey-patched) ``_thread`` lock."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        return monkey.get_original("_thread", "allocate_lock")()
    return _thread.allocate_lock()


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


def new_permits(owner: Owner, value: int) -> Any:
    """Permits for ``owner``: cooperative under a hub, :class:`ThreadPermits` otherwise."""
    if owner.green:
        from gevent.lock import BoundedSemaphore

        return BoundedSemaphore(value)
    return ThreadPermits(value)
