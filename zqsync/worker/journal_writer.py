"""WriterThread: the journal's own OS thread, fed by the hub and answering it in batches.

The scheduler's group commit (``scheduler.py``) used to run in a writer
greenlet that handed every batch to the hub's thread pool: one pool hop per
batch (a task queue, a semaphore and an ``async`` wake-up, about 28 us wall on
a small machine). Here the writer loop itself runs in a dedicated native
thread, so a batch costs no hop: the thread blocks on a native queue, commits
with plain ``sqlite3`` (which releases the GIL while it waits on the disk) and
hands its answers back with `WriterThread.post`, which queues a callable
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
import time
from typing import Any, Callable, Optional

import gevent
from gevent import monkey

log = logging.getLogger(__name__)

_start_thread = monkey.get_original("_thread", "start_new_thread")
_SimpleQueue = monkey.get_original("queue", "SimpleQueue")
_sleep = monkey.get_original("time", "sleep")
_allocate_lock = monkey.get_original("_thread", "allocate_lock")

#: Seconds an item queued with `WriterThread.defer` waits for other work before the thread is woken
#: for it (at most about twice this: a timer looks every ``LINGER`` seconds).
LINGER = 0.01
#: Wakes the thread for deferred items; never part of a batch.
_FLUSH = object()


class WriterThread:
    """Runs ``loop(writer)`` in a native thread; the loop takes work with `next_batch`.

    :param loop: the body of the thread; it returns when the writer is to end.
    :param linger: seconds an item queued with `defer` may wait for other work to go with.
    """

    def __init__(self, loop: Callable[["WriterThread"], None], linger: float = LINGER) -> None:
        self._loop = loop
        self._inbox: Any = _SimpleQueue()
        self._deferred: collections.deque[tuple[float, Any]] = collections.deque()  # (monotonic s, item)
        self._linger = linger
        self._flush: Optional[Any] = None
        self._flushing = False  # a _FLUSH is queued that no batch has taken yet
        self._outbox: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        self._wake: Optional[Any] = None
        # held by the thread from its first wait for work on, except while it waits, and by `pause`
        self._busy = _allocate_lock()
        self._started = False  # the thread has waited for work once (it holds `_busy` since)

    def start(self) -> None:
        """Start the thread (call from the hub's thread, which runs the posted callables)."""
        loop = gevent.get_hub().loop
        self._wake = loop.async_()
        self._wake.start(self._run_posted)
        self._flush = loop.timer(self._linger, self._linger)  # repeating: see _arm
        _start_thread(self._run, ())

    def close(self) -> None:
        """Stop answering the hub (the thread ends when its loop returns)."""
        for watcher in (self._wake, self._flush):
            if watcher is not None:
                watcher.close()
        self._wake = self._flush = None

    def put(self, item: Any) -> None:
        """Queue ``item`` for the thread; never blocks."""
        self._inbox.put(item)

    def defer(self, item: Any) -> None:
        """In the hub: queue ``item`` without waking the thread now. It goes with the next batch the thread
        takes, or once it has waited ``linger`` seconds (a timer looks every ``linger`` seconds and wakes the
        thread for it, if nothing else has). Never blocks."""
        self._deferred.append((time.monotonic(), item))
        self._arm()

    def _arm(self) -> None:
        """Start the timer unless it runs. It repeats every ``linger`` seconds until it finds nothing deferred.

        A fired one-shot libev timer must not be restarted with ``start``: libev keeps what was left of its
        delay (by then negative) and adds the loop time to it, so it fires again on the next loop iteration,
        and again, for as long as it is restarted. ``again`` on a repeating timer sets the delay afresh.
        """
        flush = self._flush
        if flush is not None and not flush.active:
            flush.again(self._wake_for_deferred)

    def _wake_for_deferred(self) -> None:
        """In the hub, every ``linger`` seconds while the timer runs: wake the thread if the oldest deferred
        item waited ``linger``; stop the timer if the thread took them all."""
        try:
            age = time.monotonic() - self._deferred[0][0]
        except IndexError:
            self._disarm()
            return
        if age >= self._linger and not self._flushing:  # one wake-up until a batch takes the deferred items
            self._flushing = True
            self._inbox.put(_FLUSH)

    def pause(self) -> bool:
        """In the hub: if the thread waits for work and nothing is queued, keep it from taking any (deferred
        items included) until `resume`, and return ``True``; else ``False`` at once. Never blocks."""
        if not self._inbox.empty() or not self._busy.acquire(False):
            return False
        if self._inbox.empty():
            return True
        self._busy.release()
        return False

    def take_deferred(self) -> list[Any]:
        """In the hub, between `pause` and `resume`: every deferred item, oldest first, removed."""
        items = [item for _, item in self._deferred]
        self._deferred.clear()
        return items

    def resume(self, unwritten: list[Any]) -> None:
        """In the hub, after `pause`: deferred items taken and not written go back in front, in order; the
        thread may take work again."""
        now = time.monotonic()
        self._deferred.extendleft((now, item) for item in reversed(unwritten))
        self._busy.release()
        if unwritten:
            self._arm()
        else:
            self._disarm()

    def _disarm(self) -> None:
        """In the hub: stop the timer if nothing is deferred (batches took it all); the next defer restarts it.
        Called after each batch's answers too, so a steady stream of batches carries the deferred items and the
        timer never fires."""
        flush = self._flush
        if flush is not None and not self._deferred:
            flush.stop()

    def next_batch(self, block: bool, limit: int) -> list[Any]:
        """In the thread: up to ``limit`` queued items, waiting for one if ``block``, after up to ``limit``
        deferred ones (an empty list when the thread was woken for deferred items another batch took)."""
        batch = [self._wait_for_work()] if block else []
        while len(batch) < limit and not self._inbox.empty():
            batch.append(self._inbox.get_nowait())
        deferred: list[Any] = []
        self._flushing = False
        while len(deferred) < limit and self._deferred:
            deferred.append(self._deferred.popleft()[1])
        return [item for item in deferred + batch if item is not _FLUSH]

    def _wait_for_work(self) -> Any:
        """In the thread: the next queued item; the hub may `pause` the thread only while it waits here, or
        before the thread first got here (a thread that has not reached its loop yet must not send the
        first confirms to itself)."""
        if self._started:
            self._busy.release()
        self._started = True
        try:
            return self._inbox.get()
        finally:
            self._busy.acquire()

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
        finally:
            if self._started:
                self._busy.release()

    def _run_posted(self) -> None:
        while self._outbox:
            function, args = self._outbox.popleft()
            try:
                function(*args)
            except Exception:  # pragma: no cover - posted callables are the scheduler's own
                log.exception("journal writer callback %r failed", function)
        self._disarm()
