"""A real worker core served in the calling process, for tests of task semantics without a subprocess.

`InProcessWorker` runs `Worker` (standalone intake, ephemeral
``tcp://127.0.0.1`` ports) in a native thread of its own, with a gevent hub of its own: the worker's
greenlets run in that hub, the test's clients in the test's thread (and hub, under monkey-patching),
and they meet over loopback TCP, as a client and a worker process do. It is the worker that
``zqsync worker`` runs, without the process around it: no signal handlers (signals reach only the
main thread) and no watchdog thread, so a time limit holds for tasks that yield (``gevent.Timeout``)
and not for those that block the hub; tests of signals, kills, forks and the watchdog need a real process.

`InProcessWorker.wait` blocks the test until a condition on the worker's counters holds. The
condition is checked in the worker's hub each time that hub is about to wait for I/O (a libev
``prepare`` watcher: after every piece of work, never on a timer), and at once when the test asks
(an ``async`` watcher), so nothing polls. The client and the worker use separate ZeroMQ contexts
(an ``inproc://`` endpoint needs one shared context, and the client speaks only ``tcp://``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import gevent
from gevent import monkey

from .registry import Registry

_start_thread = monkey.get_original("_thread", "start_new_thread")
_allocate_lock = monkey.get_original("_thread", "allocate_lock")

Condition = Callable[[dict[str, int]], bool]


class InProcessWorker:
    """A worker serving ``registry`` in a thread of this process (see the module docstring).

    :param registry: the tasks to serve.
    :param settings: `WorkerSettings` fields (``concurrency=4``,
        ``state_dir=...``); ``bind`` defaults to ``tcp://127.0.0.1:0``.
    """

    def __init__(self, registry: Registry, **settings: Any) -> None:
        self.registry = registry
        self.settings = {"bind": "tcp://127.0.0.1:0", **settings}
        self.worker: Any = None
        #: The worker's base endpoint (jobs on its port, rpc on the next), once started.
        self.endpoint = ""
        #: The process that runs it: this one.
        self.pid = os.getpid()
        #: The exit status `run` returned, once stopped.
        self.status: Optional[int] = None
        self._failure: Optional[BaseException] = None
        self._started, self._ended = _allocate_lock(), _allocate_lock()
        self._waiters: list[tuple[Condition, Any]] = []
        self._wake: Any = None

    def start(self, timeout: float = 30.0) -> "InProcessWorker":
        """Start the thread and wait until the worker listens; returns ``self``.

        :raises TimeoutError: not listening within ``timeout`` seconds.
        :raises Exception: what the worker raised while binding (a bad setting, a port in use).
        """
        self._started.acquire()
        self._ended.acquire()
        _start_thread(self._serve, ())
        if not self._started.acquire(timeout=timeout):
            raise TimeoutError(f"the in-process worker was not listening within {timeout} s")
        if self._failure is not None:
            raise self._failure
        return self

    def _serve(self) -> None:
        """The thread: make the worker here (its journal thread answers this thread's hub), bind, run."""
        from .server import Worker

        loop = gevent.get_hub().loop
        try:
            self.worker = Worker(self.registry, **self.settings)
            self.endpoint = self.worker.bind()
            self._wake = loop.async_()
            self._wake.start(self._check)
            prepare = loop.prepare()
            prepare.start(self._check)
        except BaseException as exc:  # reported to the test's thread by start()
            self._failure = exc
            self._started.release()
            self._ended.release()
            return
        self._started.release()
        try:
            self.status = self.worker.run()
        finally:
            prepare.close()
            self._wake.close()
            self._ended.release()
            gevent.get_hub().destroy(destroy_loop=True)

    def wait(self, condition: Condition, timeout: float = 30.0) -> dict[str, int]:
        """Block until ``condition(counters)`` holds for the worker's counters (``zqsync.stats``'
        counters: ``jobs_succeeded``, ``jobs_retried``, ...); returns a copy of them, taken once it held.

        :raises TimeoutError: it did not hold within ``timeout`` seconds (the counters are in the message).
        """
        done = _allocate_lock()
        done.acquire()
        self._waiters.append((condition, done))
        self._wake.send()
        if not done.acquire(timeout=timeout) and self._forget((condition, done)):
            raise TimeoutError(f"not within {timeout} s; the worker's counters: {dict(self.worker.runner.counters)}")
        return dict(self.worker.runner.counters)

    def join(self, finished: int, timeout: float = 30.0) -> dict[str, int]:
        """Block until ``finished`` plain or confirmed jobs have ended (succeeded, failed for good,
        cancelled, or expired) since the worker started; returns its counters then. See `wait`."""
        return self.wait(lambda counters: ended(counters) >= finished, timeout)

    def _check(self) -> None:
        """In the worker's hub: release the waiters whose condition holds."""
        for waiter in list(self._waiters):
            if waiter[0](self.worker.runner.counters) and self._forget(waiter):
                waiter[1].release()

    def _forget(self, waiter: tuple[Condition, Any]) -> bool:
        """Take ``waiter`` off the list; ``False`` if the other thread already did (it holds, or it timed out)."""
        try:
            self._waiters.remove(waiter)
        except ValueError:
            return False
        return True

    def stop(self, *, warm: bool = True, timeout: float = 30.0) -> Optional[int]:
        """Stop the worker (as TERM, or QUIT if not ``warm``) and wait for its thread; returns its exit status.

        :raises TimeoutError: the worker had not stopped within ``timeout`` seconds.
        """
        if self.worker is None or self.status is not None or self._failure is not None:
            return self.status
        self.worker.stop(warm=warm)
        if not self._ended.acquire(timeout=timeout):
            raise TimeoutError(f"the in-process worker had not stopped within {timeout} s")
        self._ended.release()
        return self.status


def ended(counters: dict[str, int]) -> int:
    """Jobs that have ended for good: succeeded, failed without a retry left, cancelled, or expired."""
    return (counters["jobs_succeeded"] + counters["jobs_failed"] + counters.get("jobs_cancelled", 0)
            + counters["jobs_expired"])
