"""Watchdog: time limits that hold for tasks that never yield to gevent.

A task's ``time_limit`` is first a ``gevent.Timeout`` (``runner.py``), which
fires only when the task yields. A task that does not yield (a pure-Python
loop, a long computation, an unpatched C call) blocks the hub, so nothing
in the hub can stop it. The watchdog is a native thread outside the hub:

* The hub proves it is alive by a tick every ``interval`` seconds (a greenlet).
* **Soft limit.** When the hub has not ticked for ``interval`` and a running
  task is past its ``time_limit``, the watchdog sends `SOFT_SIGNAL` to
  its own process. Python runs the handler in the main thread between two
  bytecodes of whatever runs there, which is the blocking task's greenlet;
  the handler raises `SoftTimeLimit` into it (billiard, Celery's pool,
  does the same with SIGUSR1). It cannot interrupt a single long C call that
  holds the GIL (a catastrophic regex, ``time.sleep`` from an unpatched C
  library): the handler runs only when that call returns.
* **A task's soft_time_limit** (the notice, before its ``time_limit``) reaches a
  task that does not yield the same way: past the notice's time, the signal's
  handler raises the runner's `SoftTimeLimitExceeded`
  into it, unless the runner's own ``gevent.Timeout`` for it already fired
  (then the timer is no longer ``pending``): once, whichever comes first. The
  next signal is then due at the task's ``time_limit``.
* **Hard limit.** ``hard_grace`` seconds after a task's soft limit, the
  process ends if the hub is still blocked. The standard library's
  ``faulthandler.dump_traceback_later`` enforces it: its timer thread is C
  code that needs no GIL, so even a C call that holds the GIL cannot stop
  it. Every tick of the hub re-arms it for the earliest hard deadline of the
  running tasks; a hub blocked past that deadline gets no tick, and
  faulthandler writes every thread's traceback to stderr (where the task was
  stuck) and exits with status 1. Under ``--processes`` the supervisor
  starts a new child; a single process is restarted by its service manager
  (``Restart=on-failure``). A confirmed job killed this way is still pending
  in the journal, so it runs again after the restart as its ``retries`` say.

**Stop.** A worker told to stop (``server.py``) calls `Watchdog.kill_tasks_at`
with the end of its grace period (or now, for a cold stop). If the hub is
still blocked then, the same signal raises `TaskKilled` (a
``GreenletExit``, as gevent's own kill) into the blocking task, which
interrupts a pure-Python loop and a C call that releases the GIL and
returns on a signal (``time.sleep``, a socket read). A cold stop's own signal
handler raises it at once (`Watchdog.kill_if_due`), which also reaches
a C call that checks for signals while it holds the GIL (the ``re`` engine
does). If the hub is still blocked
`KILL_GRACE` seconds later, the thread ends the process with status
`KILLED_EXIT`. A C call that holds the GIL runs no Python thread at
all, so faulthandler's timer is armed too, for `HARD_STOP_GRACE`
seconds past the kill: it dumps the tracebacks and exits with status 1.

Both limits use the monotonic clock, and cost the hub one timer wake-up per
``interval`` and a dict update per task.
"""

from __future__ import annotations

import faulthandler
import math
import os
import signal
import sys
import time
from typing import Any, Optional

import gevent
from greenlet import getcurrent

#: The signal that carries a soft time limit into a task that does not yield.
SOFT_SIGNAL = signal.SIGUSR2
#: Exit status of a worker process ended by a hard time limit (faulthandler's).
HARD_LIMIT_EXIT = 1
#: Exit status of a worker that stopped with tasks killed (by a cold stop or the end of the grace period).
KILLED_EXIT = 1
#: Seconds a stop waits, past killing a task that blocks the hub, for the hub to run again before it exits.
KILL_GRACE = 2.0
#: Seconds past a stop's kill time after which faulthandler's C timer ends the process whatever holds the GIL.
HARD_STOP_GRACE = 5.0


class SoftTimeLimit(BaseException):
    """Raised inside a task that ran past its time limit without yielding.

    A ``BaseException``, so that a task's own ``except Exception`` does not
    swallow it; the runner turns it into a ``TimeLimitExceeded`` failure.
    """


class TaskKilled(gevent.GreenletExit):
    """Raised inside a task that blocked the hub when its worker stopped and killed its tasks.

    A ``GreenletExit``, as gevent's ``Greenlet.kill`` raises: the task ends the same way
    whether the hub was free (the worker kills it) or blocked (the watchdog does).
    """


#: Seconds between two soft-limit signals to the same task (one may land while another greenlet runs).
RESIGNAL = 0.5


class _Running:
    __slots__ = ("name", "soft", "hard", "notice", "notice_at", "next_signal")

    def __init__(self, name: str, soft: float, hard: Optional[float], kill_at: float,
                 notice: Optional[gevent.Timeout], notice_at: float) -> None:
        self.name, self.soft, self.hard, self.notice, self.notice_at = name, soft, hard, notice, notice_at
        self.next_signal = min(notice_at, soft, kill_at)


def original_signal(signum: int, handler: Any) -> None:
    """Install a Python-level handler for ``signum``, past gevent's monkey-patching of ``signal``.

    Python runs it in the main thread between two bytecodes, even while a task blocks the hub.
    """
    _original("signal", "signal")(signum, handler)


def _original(module: str, name: str) -> Any:
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        return monkey.get_original(module, name)
    return getattr(__import__(module), name)


class Watchdog:
    """Enforces soft and hard time limits from a native thread.

    :param interval: seconds between the hub's ticks and the watchdog's checks (float).
    :param hard_grace: seconds past a task's soft limit before the process is ended.

    Call `start` in the worker process's main thread, with its hub
    running; `enter` and `leave` around every task run. Not for
    use from more than one hub. One per process: faulthandler has one timer.
    """

    def __init__(self, *, interval: float = 0.05, hard_grace: float = 5.0) -> None:
        self.interval = interval
        self.hard_grace = hard_grace
        self._running: dict[Any, _Running] = {}
        self._tick = time.monotonic()
        self._stopped = False
        self._ticker: Optional[gevent.Greenlet] = None
        self._armed_until: Optional[float] = None
        self._pid = os.getpid()
        self._kill_at = math.inf
        self._stop_hard: Optional[float] = None
        #: tasks killed by `kill_tasks_at` while they blocked the hub
        self.killed = 0

    def start(self) -> None:
        """Install the soft-limit signal handler, and start the hub's ticker and the watching thread."""
        original_signal(SOFT_SIGNAL, self._on_soft_signal)
        self._ticker = gevent.spawn(self._tick_forever)
        _original("_thread", "start_new_thread")(self._watch, (_original("time", "sleep"),))

    def stop(self) -> None:
        """Stop ticking, watching and the hard limit (the thread ends within ``interval``)."""
        self._stopped = True
        if self._ticker is not None:
            self._ticker.kill(block=False)
        if self._armed_until is not None and self._pid == os.getpid():
            faulthandler.cancel_dump_traceback_later()
            self._armed_until = None

    def greenlets(self) -> list[gevent.Greenlet]:
        """The ticker greenlet, if started (a forked child kills its copy)."""
        return [self._ticker] if self._ticker is not None else []

    def kill_tasks_at(self, when: float) -> None:
        """Kill the tasks that block the hub at monotonic time ``when`` (see the module docstring).

        Safe to call from a Python signal handler; an earlier ``when`` than a previous call wins.
        """
        self._kill_at = min(self._kill_at, when)
        for running in list(self._running.values()):
            running.next_signal = min(running.next_signal, self._kill_at)
        self._stop_hard = self._kill_at + HARD_STOP_GRACE
        self._arm(time.monotonic())

    def enter(self, name: str, time_limit: Optional[float], notice: Optional[gevent.Timeout] = None,
              fn: Any = None) -> None:
        """Record that the current greenlet runs task ``name`` under ``time_limit`` seconds (``None``: no limit).

        :param notice: the started ``gevent.Timeout`` of the task's ``soft_time_limit``, whose exception
            the watchdog raises where the task does not yield (``None``: no soft time limit).
        :param fn: the task function (unused here: the watchdog knows the task by its hub's silence;
            ``thread_limits.py`` needs it).
        """
        if time_limit is None and notice is None:  # most tasks: only a stop's kill can apply
            self._running[getcurrent()] = _Running(name, math.inf, None, self._kill_at, None, math.inf)
            return
        now = time.monotonic()
        soft = math.inf if time_limit is None else now + time_limit
        hard = None if time_limit is None else soft + self.hard_grace
        notice_at = math.inf if notice is None else now + notice.seconds
        self._running[gevent.getcurrent()] = _Running(name, soft, hard, self._kill_at, notice, notice_at)
        if hard is not None and (self._armed_until is None or hard < self._armed_until):
            self._arm(now)

    def leave(self) -> None:
        """Record that the current greenlet's task ended."""
        self._running.pop(getcurrent(), None)

    # -- the hub side --------------------------------------------------------

    def _tick_forever(self) -> None:
        while True:
            self._tick = time.monotonic()
            self._arm(self._tick)
            gevent.sleep(self.interval)

    def _arm(self, now: float) -> None:
        """Point the hard-limit timer at the earliest hard deadline of the running tasks, or disarm it.

        Never in a child forked by a task: faulthandler's timer thread did not
        survive the fork, and re-arming (or cancelling) waits for that thread forever. Never before
        `start` either (a worker run in-process, whose process has its own uses for faulthandler).
        """
        if self._pid != os.getpid() or self._ticker is None:
            return  # forked, or not started: the process's faulthandler timer is not the watchdog's
        hards = [running.hard for running in self._running.values() if running.hard is not None]
        earliest = min([*hards, self._stop_hard] if self._stop_hard is not None else hards, default=None)
        if earliest is None:
            if self._armed_until is not None:
                faulthandler.cancel_dump_traceback_later()
                self._armed_until = None
        elif earliest != self._armed_until:
            faulthandler.dump_traceback_later(max(0.001, earliest - now), exit=True)
            self._armed_until = earliest

    def _on_soft_signal(self, signum: int, frame: Any) -> None:
        self.kill_if_due()
        running = self._running.get(gevent.getcurrent())
        if running is None:
            return
        now = time.monotonic()
        if running.notice is not None and now >= running.notice_at:
            notice, running.notice = running.notice, None
            running.next_signal = min(running.soft, self._kill_at)
            if notice.pending:  # not raised where the task yielded: raise it here, once
                notice.close()
                raise notice.exception
        if now >= running.soft:
            raise SoftTimeLimit(f"task {running.name!r} ran past its time limit without yielding")

    def kill_if_due(self) -> None:
        """From a signal handler: raise `TaskKilled` if the current greenlet runs a task and
        the kill time of `kill_tasks_at` has come (once per task)."""
        running = self._running.get(gevent.getcurrent())
        if running is not None and time.monotonic() >= self._kill_at:
            del self._running[gevent.getcurrent()]
            self.killed += 1
            raise TaskKilled(f"task {running.name!r} killed: the worker is stopping and the task blocked it")

    # -- the native thread ---------------------------------------------------

    def _watch(self, sleep: Any) -> None:
        while not self._stopped:
            sleep(self.interval)  # the unpatched sleep: this thread is native, outside the hub
            now = time.monotonic()
            if now - self._tick < 2 * self.interval:
                continue  # the hub runs: gevent.Timeout enforces the limits
            self._check(now)

    def _check(self, now: float) -> None:
        if now >= self._kill_at + KILL_GRACE:
            os.write(2, b"zqsync worker: the hub is still blocked after its tasks were killed at stop: exiting\n")
            os._exit(KILLED_EXIT)
        for running in list(self._running.values()):
            if now >= running.next_signal:
                running.next_signal = now + RESIGNAL
                os.kill(os.getpid(), SOFT_SIGNAL)


__all__ = ["HARD_LIMIT_EXIT", "KILLED_EXIT", "SOFT_SIGNAL", "SoftTimeLimit", "TaskKilled", "Watchdog",
           "original_signal"]
