"""Runner: decode one request, run its task, build the reply.

A failing task never kills the worker: its exception, ``SystemExit`` and
``KeyboardInterrupt`` included, becomes an error reply (type name, message,
formatted traceback) for a call, and a log line for a job. ``time_limit`` is
enforced with a ``gevent.Timeout`` that only this module raises and swallows
(any other timeout propagates) and, for tasks that never yield, by the
watchdog's soft-limit signal (``watchdog.py``). ``soft_time_limit`` is a second
``gevent.Timeout`` that raises `SoftTimeLimitExceeded` into the
task where it yields, handed to the watchdog too, which raises it where the task does
not yield (whichever comes first; never both): the task may catch it and clean up.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any, Callable, Optional, Protocol, Union

import gevent

from ..errors import DeadlineExpired, NoJournal, ProtocolError, RemoteError, SoftTimeLimitExceeded, TimeLimitExceeded, UnknownTask
from ..logs import RateLimitedLog
from ..wire import envelope
from .durations import Durations
from .registry import Registry, Task, TaskContext
from .watchdog import SoftTimeLimit

log = logging.getLogger(__name__)

COUNTERS = (
    "jobs_received",
    "plain_received",
    "jobs_replayed",
    "jobs_succeeded",
    "jobs_failed",
    "jobs_retried",
    "jobs_dead",
    "confirmed_received",
    "confirmed_accepted",
    "confirmed_duplicates",
    "calls_received",
    "calls_succeeded",
    "calls_failed",
    "timed_out",
    "unknown_task",
    "malformed",
    "in_flight",
    "hook_errors",
    "calls_expired",
    "jobs_expired",
)

#: An error as sent in a reply: (type name, message, traceback).
ErrorInfo = tuple[str, str, str]
_NOTHING = object()


class TaskLimits(Protocol):
    """Time limits for tasks that do not yield: a worker's ``Watchdog`` (``watchdog.py``), or eager
    mode's ``ThreadLimits`` (``thread_limits.py``)."""

    def enter(self, name: str, time_limit: Optional[float], notice: Optional[gevent.Timeout] = None,
              fn: Any = None) -> None:
        """Task ``name`` (function ``fn``) starts in the current greenlet."""

    def leave(self) -> None:
        """The task that entered last has returned or raised."""


class Runner:
    """Executes requests against a registry and counts what happens.

    :param registry: the tasks to serve.
    :param builtins: extra ``{name: fn}`` tasks answered on rpc only (the
        worker's ``zqsync.*`` introspection tasks).
    :param confirm: handles ``confirm`` requests: ``confirm(request, task, answer)``
        returns at once and calls ``answer(reply frame)`` then or later, in the hub. ``None``: the worker has no journal, and
        confirmed jobs get an error reply saying how to enable them.
    :param watchdog: enforces time limits on tasks that do not yield (`TaskLimits`);
        ``None``: only ``gevent.Timeout``, which needs a yield.
    :param remote_tracebacks: put a failed task's formatted traceback in its error reply;
        ``False``: type and message only (the traceback is then logged here, at INFO).
    """

    def __init__(
        self,
        registry: Registry,
        *,
        builtins: Optional[dict[str, Callable[..., Any]]] = None,
        confirm: Optional[Callable[[envelope.Request, Task, Callable[[bytes], None]], None]] = None,
        watchdog: Optional[TaskLimits] = None,
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
        self.counters["plain_received"] += 1
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

    def is_builtin(self, task: Task) -> bool:
        """Whether ``task`` is one of the worker's own ``zqsync.*`` tasks (answered outside the task pool)."""
        return task.fn is self.builtins.get(task.name)

    def answer_call(self, request: envelope.Request, task: Task) -> bytes:
        """Run a call; returns its reply frame (the result, or the task's error).

        The worker's own ``zqsync.*`` tasks are answered without being
        counted or timed, so asking for stats never changes them. A call
        past its deadline is not run: its reply is a ``DeadlineExpired`` error.
        """
        if self.is_builtin(task):
            return _reply(request.id, task, *self.run(task, request, counted=False))[0]
        self.counters["calls_received"] += 1
        late = self.expired(request)
        if late is not None:
            return envelope.encode_error(request.id, DeadlineExpired.__name__,
                                         f"call {request.id} to {task.name!r} was not run: its deadline had passed "
                                         f"{late:.3f} s before the worker could start it (the caller gave up)")
        reply, ok = _reply(request.id, task, *self.run(task, request))
        self.counters["calls_succeeded" if ok else "calls_failed"] += 1
        return reply

    def expired(self, request: envelope.Request, *, durable: bool = False) -> Optional[float]:
        """Seconds by which ``request`` is past its deadline (counted as ``calls_expired`` or
        ``jobs_expired``, and logged, rate-limited), or ``None`` if it may start.

        :param durable: a confirmed job's: its expiry is ``options["expires"]``, epoch seconds (it outlives
            processes), where a plain job's or call's is ``expires``, this process's monotonic time.
        """
        if durable:
            expires = request.options.get("expires")
            late = None if expires is None else time.time() - expires
        else:
            late = None if request.expires is None else time.monotonic() - request.expires
        if late is None or late <= 0:
            return None
        self.counters["calls_expired" if request.kind == "call" else "jobs_expired"] += 1
        self._log.warning(("expired", request.kind), "did not start %s %s (%s): its deadline passed %.3f s ago",
                          request.kind, request.id, request.task, late)
        return late

    def _lookup(self, request: envelope.Request) -> Optional[Task]:
        builtin = self.builtins.get(request.task)
        if builtin is not None and request.kind == "call":
            return Task(request.task, builtin)
        return self.registry.get(request.task)

    def answer_confirm(self, request: envelope.Request, task: Task, answer: Callable[[bytes], None]) -> None:
        """Journal a confirmed job; ``answer(reply frame)`` is called once, now or later in the hub
        (see ``confirm``). Never blocks."""
        if self.confirm is None:
            answer(envelope.encode_error(
                request.id, NoJournal.__name__,
                "this worker keeps no journal, so it cannot confirm jobs nor run delayed ones: start it with "
                "--state-dir DIR",
            ))
            return
        self.counters["confirmed_received"] += 1
        self.confirm(request, task, answer)

    def run(self, task: Task, request: envelope.Request, *, counted: bool = True) -> tuple[bool, Any]:
        """Run ``task`` once with the request's arguments under its time limit.

        :param counted: count it in ``in_flight``, time it and pass the
            registry's middleware hooks (not for the worker's own tasks).
        :returns: ``(True, result)`` or ``(False, (type name, message, traceback))``.
        """
        ok, value, _ = self._run(task, request, counted, 1)
        return ok, value

    def run_job(self, task: Task, request: envelope.Request, attempt: int) -> tuple[bool, Any, Optional[float]]:
        """Run attempt ``attempt`` (1 for the first) of a job, and decide its retry.

        Calls the middleware's ``on_retry`` or ``on_dead_letter`` after a failure.

        :returns: ``(ok, value, delay)``: ``value`` as from `run`;
            ``delay`` is the seconds before the next attempt, or ``None``
            when there is none (success, retries exhausted, or a failure that
            ``retry_on`` does not cover).
        """
        ok, value, error = self._run(task, request, True, attempt)
        if ok:
            return ok, value, None
        delay = task.retry_delay(attempt, error)
        context = _context(task, request, attempt)
        if delay is None:
            self._hook("on_dead_letter", context, error)
        else:
            self._hook("on_retry", context, error, delay)
        return ok, value, delay

    def _run(self, task: Task, request: envelope.Request, counted: bool, attempt: int) -> tuple[bool, Any, Any]:
        context = _context(task, request, attempt) if counted and self.registry.middleware else None
        if context is not None:
            self._hook("before_task", context)
        ok, value, error = self._execute(task, request, counted)
        if context is not None:
            if not ok:
                self._hook("on_failure", context, error)
            self._hook("after_task", context, value if ok else None, error, reverse=True)
        return ok, value, error

    def _hook(self, name: str, context: TaskContext, *args: Any, reverse: bool = False) -> None:
        """Call hook ``name`` of every middleware; one that raises is logged and counted, never propagated."""
        chain = self.registry.middleware
        for middleware in reversed(chain) if reverse else chain:
            try:
                getattr(middleware, name)(context, *args)
            except Exception:
                self.counters["hook_errors"] += 1
                self._log.warning((name, type(middleware)), "%s.%s raised around task %r (job %s)",
                                  type(middleware).__name__, name, context.task, context.job_id, exc_info=True)

    def _execute(self, task: Task, request: envelope.Request, counted: bool) -> tuple[bool, Any, Any]:
        """``(True, result, None)`` or ``(False, error info, the exception)``."""
        step = 1 if counted else 0
        self.counters["in_flight"] += step
        timer = gevent.Timeout._start_new_or_dummy(task.time_limit)
        notice = _soft_notice(task)
        if self.watchdog is not None:
            self.watchdog.enter(task.name, task.time_limit, notice, task.fn)
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
            message = exc.remote_message if isinstance(exc, RemoteError) else str(exc)  # not "Type: Type: ..."
            return False, (type(exc).__name__, message, self._traceback(task)), exc
        finally:
            if self.watchdog is not None:
                self.watchdog.leave()
            timer.close()
            if notice is not None:
                notice.close()
            self.counters["in_flight"] -= step
            if counted:
                self.durations.record(task.name, time.perf_counter() - started)
        return True, result, None

    def _traceback(self, task: Task) -> str:
        """The current exception's traceback for the reply, or ``""`` (logged locally) if tracebacks stay here."""
        if self.remote_tracebacks:
            return traceback.format_exc()
        log.info("task %r failed (traceback not sent to the client)", task.name, exc_info=True)
        return ""

    def _timed_out(self, task: Task) -> tuple[bool, ErrorInfo, TimeLimitExceeded]:
        self.counters["timed_out"] += 1
        log.warning("task %r exceeded its time limit of %s s", task.name, task.time_limit)
        info = (TimeLimitExceeded.__name__, f"task {task.name!r} exceeded its time limit of {task.time_limit} s", "")
        return False, info, TimeLimitExceeded(*info)


def _soft_notice(task: Task) -> Optional[gevent.Timeout]:
    """The started timer that raises ``SoftTimeLimitExceeded`` into the task where it yields, or ``None``."""
    if task.soft_time_limit is None:
        return None
    error = SoftTimeLimitExceeded(SoftTimeLimitExceeded.__name__,
                                  f"task {task.name!r} ran past its soft time limit of {task.soft_time_limit} s")
    return gevent.Timeout.start_new(task.soft_time_limit, error)


def _context(task: Task, request: envelope.Request, attempt: int) -> TaskContext:
    kind = "call" if request.kind == "call" else "job"
    return TaskContext(task.name, request.id, kind, attempt, tuple(request.args), dict(request.kwargs))


def unsendable(task: Task, exc: ProtocolError) -> ErrorInfo:
    """The error of a task whose result cannot be sent back or kept (``exc`` from ``encode_result``)."""
    return ("TypeError", f"task {task.name!r} returned a value that cannot be sent back: {exc}", "")


def _reply(request_id: str, task: Task, ok: bool, value: Any) -> tuple[bytes, bool]:
    """A call's reply frame, and whether it is a success: a result that cannot be sent back is a
    ``TypeError`` reply (`unsendable`)."""
    if ok:
        try:
            return envelope.encode_result(request_id, value), True
        except ProtocolError as exc:
            value = unsendable(task, exc)
    return envelope.encode_error(request_id, *value), False
