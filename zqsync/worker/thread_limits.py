"""Time limits for tasks run in the caller's own thread (eager mode), for code that never yields.

A worker's watchdog (``watchdog.py``) signals its own process, and ends it at the hard limit; a
test process's signals and life belong to its test runner, and an eager task may run in any thread.
`ThreadLimits` instead asks the interpreter to raise an exception in the task's thread,
with CPython's ``PyThreadState_SetAsyncExc`` (called through ``ctypes``), from a native thread
that sleeps until the limit:

* at ``soft_time_limit``, unless the task's own ``gevent.Timeout`` for it already fired (it yields),
  `SoftTimeLimitExceeded` (the task may catch it and clean up);
* at ``time_limit``, the watchdog's `SoftTimeLimit`, which the runner
  turns into ``TimeLimitExceeded``, as on a worker; again every `RESIGNAL` seconds while the
  task still runs (it may catch ``BaseException``).

The exception is only ever raised inside the task: the thread is stopped (this thread holds the
GIL) and its current frames are read (``sys._current_frames``); the exception is set only when the
task function's frame is among them, so it is raised where the thread resumes, in the task. A task
that waits on another greenlet (it yields) is not running, so it is not interrupted: its
``gevent.Timeout`` fires instead. Like the watchdog's signal, the exception cannot interrupt one
long C call that holds the GIL; it is raised when that call returns.
"""

from __future__ import annotations

import ctypes
import math
import sys
import time
from typing import Any, Optional

from ..errors import SoftTimeLimitExceeded
from .watchdog import SoftTimeLimit, _original

#: Seconds between two exceptions raised into a task that is still running past its ``time_limit``.
RESIGNAL = 0.5
#: Seconds a limit waits, when the task is not running just then, before it looks again.
RECHECK = 0.01

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)


class _Limit:
    """One running task's limits, watched by a native thread until `finish`."""

    def __init__(self, name: str, code: Any, time_limit: Optional[float], notice: Any) -> None:
        self.name, self.code, self.notice = name, code, notice
        self.thread = _original("_thread", "get_ident")()
        now = time.monotonic()
        self.soft_at = now + notice.seconds if notice is not None else math.inf
        self.hard_at = now + time_limit if time_limit is not None else math.inf
        self.guard = _original("_thread", "allocate_lock")()
        self.finished = _original("_thread", "allocate_lock")()
        self.finished.acquire()
        self.raised = False
        _original("_thread", "start_new_thread")(self._watch, ())

    def finish(self) -> None:
        """The task returned: raise nothing more, and drop an exception set but not yet raised."""
        with self.guard:
            self.finished.release()
            if self.raised:
                _set_async_exc(self.thread, ctypes.py_object())  # NULL: clears a pending one

    def _watch(self) -> None:
        soft_due = self.notice is not None
        while True:
            due = self.soft_at if soft_due else self.hard_at
            if math.isinf(due) or self.finished.acquire(timeout=max(0.0, due - time.monotonic())):
                return
            with self.guard:
                if not self.finished.locked():
                    return
                if self._running():
                    if not soft_due:
                        self._raise(SoftTimeLimit)
                        self.hard_at = time.monotonic() + RESIGNAL
                    elif self.notice.pending:  # its gevent.Timeout has not fired: the task does not yield
                        self._raise(_soft_error(self.name, self.notice.seconds))
                    soft_due = False
                    continue
            _original("time", "sleep")(RECHECK)

    def _running(self) -> bool:
        """Whether the task's frame is on the thread's stack right now (the thread waits for the GIL)."""
        frame = sys._current_frames().get(self.thread)
        while frame is not None:
            if frame.f_code is self.code:
                return True
            frame = frame.f_back
        return False

    def _raise(self, error: type) -> None:
        self.raised = True
        _set_async_exc(self.thread, ctypes.py_object(error))


def _soft_error(name: str, seconds: float) -> type:
    """An exception class raised with no arguments (as the C API raises it) that reads as the runner's
    ``SoftTimeLimitExceeded``: same name, same message."""
    message = f"task {name!r} ran past its soft time limit of {seconds} s"

    def __init__(self: Any) -> None:
        SoftTimeLimitExceeded.__init__(self, SoftTimeLimitExceeded.__name__, message)

    return type(SoftTimeLimitExceeded.__name__, (SoftTimeLimitExceeded,), {"__init__": __init__})


class ThreadLimits:
    """The `Runner`'s ``watchdog`` in eager mode (see the module docstring)."""

    def __init__(self) -> None:
        self._running: list[Optional[_Limit]] = []

    def enter(self, name: str, time_limit: Optional[float], notice: Any = None, fn: Any = None) -> None:
        """A task starts in this thread: watch its ``time_limit`` (seconds) and soft ``notice``
        (a started ``gevent.Timeout``). ``fn``: the task function, whose frame marks the task running;
        one without a ``__code__`` (a callable object) is not interrupted."""
        code = getattr(fn, "__code__", None)
        wanted = code is not None and (time_limit is not None or notice is not None)
        self._running.append(_Limit(name, code, time_limit, notice) if wanted else None)

    def leave(self) -> None:
        """The task that entered last has returned or raised."""
        limit = self._running.pop()
        if limit is not None:
            limit.finish()
