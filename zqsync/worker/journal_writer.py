"""WriterThread: the journal's own OS thread, fed by the hub and answering it in batches.

The scheduler's group commit (``scheduler.py``) used to run in a writer
greenlet that handed every batch to the hub's thread pool: one pool hop per
batch (a task queue, a semaphore and an ``async`` wake-up, about 28 us wall on
a small machine). Here the writer loop itself runs in a dedicated native
thread, so a batch costs no hop: the thread blocks on a native queue, commits
with plain ``sqlite3`` (which releases the GIL while it waits on the disk) and
hands its answers back with :meth:`WriterThread.post`, which queues a callable
and wakes the hub once through a gevent ``async`` watcher, the one gevent
object documented as safe to signal from another thread. The hub runs every
posted callable in order, so greenlet-side state (``AsyncResult``, counters,
queues) is only ever touched from the hub's thread.

No ZeroMQ socket is used from this thread: the scheduler posts one callable
per committed batch, which sends the batch's acknowledgements from the hub,
on the ROUTER the hub's thread owns (a libzmq socket must only be used from
one thread).
"""
from __future__ import annotations

import collections
import logging
from typing import Any, Callable, Optional

import gevent
from gevent import monkey

log = logging.getLogger(__name__)

_start_thread = monkey.get_original("_thread", "start_new_thread")
_SimpleQueue = monkey.get_original("queue", "SimpleQueue")
_sleep = monkey.get_original("time", "sleep")


class WriterThread:
    """Runs ``loop(writer)`` in a native thread; the loop takes work with :meth:`next_batch`.

    :param loop: the body of the thread; it returns when the writer is to end.
    """

    def __init__(self, loop: Callable[["WriterThread"], None]) -> None:
        self._loop = loop
        self._inbox: Any = _SimpleQueue()
        self._outbox: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        self._wake: Optional[Any] = None

    def start(self) -> None:
        """Start the thread (call from the hub's thread, which runs the posted callables)."""
        self._wake = gevent.get_hub().loop.async_()
        self._wake.start(self._run_posted)
        _start_thread(self._run, ())

    def close(self) -> None:
        """Stop answering the hub (the thread ends when its loop returns)."""
        if self._wake is not None:
            self._wake.close()
            self._wake = None

    def put(self, item: Any) -> None:
        """Queue ``item`` for the thread; never blocks."""
        self._inbox.put(item)

    def next_batch(self, block: bool, limit: int) -> list[Any]:
        """In the thread: up to ``limit`` queued items, waiting for the first one if ``block``."""
        batch = [self._inbox.get()] if block else []
        while len(batch) < limit and not self._inbox.empty():
            batch.append(self._inbox.get_nowait())
        return batch

    def post(self, function: Callable[..., Any], *args: Any) -> None:
        """In the thread: have the hub call ``function(*args)`` soon, after everything posted before."""
        self._outbox.append((function, args))
        wake = self._wake
        if wake is not None:
            wake.send()

    @staticmethod
    def sleep(seconds: float) -> None:
        """In the thread: block it (not the hub) for ``seconds``."""
        _sleep(seconds)

    def _run(self) -> None:
        try:
            self._loop(self)
        except BaseException:  # pragma: no cover - the loop catches its own errors
            log.exception("the journal writer thread died")

    def _run_posted(self) -> None:
        while self._outbox:
            function, args = self._outbox.popleft()
            try:
                function(*args)
            except Exception:  # pragma: no cover - posted callables are the scheduler's own
                log.exception("journal writer callback %r failed", function)
