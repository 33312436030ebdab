"""Runner: decode one request, run its task, build the reply.

A failing task never kills the worker: its exception, ``SystemExit`` and
``KeyboardInterrupt`` included, becomes an error reply (type name, message,
formatted traceback) for a call, and a log line for a job. ``time_limit`` is
enforced with a ``gevent.Timeout`` that only this module raises and swallows
(any other timeout propagates) and, for tasks that never yield, by the
watchdog's soft-limit signal (``watchdog.py``).
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any, Callable, Optional, Union

import gevent

from ..errors import NoJournal, ProtocolError, TimeLimitExceeded, UnknownTask
from ..logs import RateLimitedLog
from ..wire import envelope
from .durations import Durations
from .registry import Registry, Task
from .watchdog import SoftTimeLimit, Watchdog

log = logging.getLogger(__name__)

COUNTERS = (
    "jobs_received",
    "jobs_succeeded",
    "jobs_failed",
    "jobs_retried",
    "jobs_dead",
    "confirmed_received",
    "confirmed_duplicates",
    "calls_received",
    "calls_succeeded",
    "calls_failed",
    "timed_out",
    "unknown_task",
    "malformed",
    "in_flight",
)

#: An error as sent in a reply: (type name, message, traceback).
ErrorInfo = tuple[str, str, str]
_NOTHING = object()


class Runner:
    """Executes requests against a registry and counts what happens.

    :param registry: the tasks to serve.
    :param builtins: extra ``{name: fn}`` tasks answered on rpc only (the
        worker's ``zqsync.*`` introspection tasks).
    :param confirm: handles ``confirm`` requests: ``confirm(request, task)``
        returns the reply frame. ``None``: the worker has no journal, and
        confirmed jobs get an error reply saying how to enable them.
    :param watchdog: enforces time limits on tasks that do not yield
        (``watchdog.py``); ``None``: only ``gevent.Timeout``, which needs a yield.
    :param remote_tracebacks: put a failed task's formatted traceback in its error reply;
        ``False``: type and message only (the traceback is then logged here, at INFO).
    """

    def __init__(
        self,
        registry: Registry,
        *,
        builtins: Optional[dict[str, Callable[..., Any]]] = None,
        confirm: Optional[Callable[[envelope.Request, Task], bytes]] = None,
        watchdog: Optional[Watchdog] = None,
        remote_tracebacks: bool = True,
    ) -> None:
        self.registry = registry
        self.watchdog = watchdog
        self.remote_tracebacks = remote_tracebacks
        self.builtins = dict(builtins or {})
        self.confirm = confirm
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.durations = Durations()
        self._log = RateLimitedLog(log)

    def decode_job(self, frame: bytes) -> Optional[tuple[Task, envelope.Request]]:
        """Decode a job frame; ``None`` (counted and logged) if malformed or for an unknown task."""
        try:
            request = envelope.decode_request(frame)
        except ProtocolError as exc:
            self.counters["malformed"] += 1
            self._log.warning("malformed", "dropped a malformed job frame: %s", exc)
            return None
        self.counters["jobs_received"] += 1
        task = self.registry.get(request.task)
        if task is None:
            self.counters["unknown_task"] += 1
            self._log.warning(("unknown", request.task), "dropped job %s: unknown task %r", request.id, request.task)
            return None
        return task, request

    def decode_rpc(self, frame: bytes) -> Union[tuple[envelope.Request, Task], bytes]:
        """Decode an rpc request and find its task.

        :returns: ``(request, task)``, or the error reply frame for a
            malformed request, a plain job sent to rpc, or an unknown task.
        """
        try:
            request = envelope.decode_request(frame)
        except ProtocolError as exc:
            self.counters["malformed"] += 1
            return envelope.encode_error("", ProtocolError.__name__, f"malformed request: {exc}")
        if request.kind == "job":
            return envelope.encode_error(request.id, ProtocolError.__name__, "a plain job belongs on the jobs socket")
        task = self._lookup(request)
        if task is None:
            self.counters["unknown_task"] += 1
            known = ", ".join(self.registry.names()) or "none"
            return envelope.encode_error(
                request.id, UnknownTask.__name__, f"no task named {request.task!r} is registered (known: {known})"
            )
        return request, task

    def answer_call(self, request: envelope.Request, task: Task) -> bytes:
        """Run a call; returns its reply frame (the result, or the task's error).

        The worker's own ``zqsync.*`` tasks are answered without being
        counted or timed, so asking for stats never changes them.
        """
        if task.fn is self.builtins.get(task.name):
            ok, value = self.run(task, request, counted=False)
            return envelope.encode_result(request.id, value) if ok else envelope.encode_error(request.id, *value)
        self.counters["calls_received"] += 1
        ok, value = self.run(task, request)
        if ok:
            try:
                reply = envelope.encode_result(request.id, value)
                self.counters["calls_succeeded"] += 1
                return reply
            except ProtocolError as exc:
                value = ("TypeError", f"task {task.name!r} returned a value that {exc}", "")
        self.counters["calls_failed"] += 1
        return envelope.encode_error(request.id, *value)

    def _lookup(self, request: envelope.Request) -> Optional[Task]:
        builtin = self.builtins.get(request.task)
        if builtin is not None and request.kind == "call":
            return Task(request.task, builtin)
        return self.registry.get(request.task)

    def answer_confirm(self, request: envelope.Request, task: Task) -> bytes:
        """Journal a confirmed job and acknowledge it; returns the reply frame."""
        if self.confirm is None:
            return envelope.encode_error(
                request.id, NoJournal.__name__,
                "this worker keeps no journal, so it cannot confirm jobs: start it with --state-dir DIR",
            )
        self.counters["confirmed_received"] += 1
        return self.confirm(request, task)

    def run(self, task: Task, request: envelope.Request, *, counted: bool = True) -> tuple[bool, Any]:
        """Run ``task`` with the request's arguments under its time limit.

        :param counted: count it in ``in_flight`` and time it (not for the worker's own tasks).
        :returns: ``(True, result)`` or ``(False, (type name, message, traceback))``.
        """
        step = 1 if counted else 0
        self.counters["in_flight"] += step
        timer = gevent.Timeout._start_new_or_dummy(task.time_limit)
        if self.watchdog is not None:
            self.watchdog.enter(task.name, task.time_limit)
        started = time.perf_counter()
        result: Any = _NOTHING
        try:
            result = task.fn(*request.args, **request.kwargs)
        except gevent.Timeout as ex:
            if ex is not timer:
                raise
            return self._timed_out(task)
        except SoftTimeLimit:
            if result is _NOTHING:  # the signal landed after the task returned: it succeeded
                return self._timed_out(task)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            # A task's sys.exit() or KeyboardInterrupt fails that task; it never stops the worker.
            return False, (type(exc).__name__, str(exc), self._traceback(task))
        finally:
            if self.watchdog is not None:
                self.watchdog.leave()
            timer.close()
            self.counters["in_flight"] -= step
            if counted:
                self.durations.record(task.name, time.perf_counter() - started)
        return True, result

    def _traceback(self, task: Task) -> str:
        """The current exception's traceback for the reply, or ``""`` (logged locally) if tracebacks stay here."""
        if self.remote_tracebacks:
            return traceback.format_exc()
        log.info("task %r failed (traceback not sent to the client)", task.name, exc_info=True)
        return ""

    def _timed_out(self, task: Task) -> tuple[bool, ErrorInfo]:
        self.counters["timed_out"] += 1
        log.warning("task %r exceeded its time limit of %s s", task.name, task.time_limit)
        return False, (TimeLimitExceeded.__name__, f"task {task.name!r} exceeded its time limit of {task.time_limit} s", "")
