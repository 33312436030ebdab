"""Runner: turn one decoded request into a task execution and a reply.

A failing task never kills the worker: its exception becomes an error reply
(type name, message, formatted traceback) for a call, and a log line for a
job. ``time_limit`` is enforced with a ``gevent.Timeout`` that only this
module raises and swallows; any other timeout propagates.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any, Callable, Optional

import gevent

from .. import protocol
from ..errors import ProtocolError
from .registry import Registry, Task

log = logging.getLogger(__name__)

COUNTERS = (
    "jobs_received",
    "jobs_succeeded",
    "jobs_failed",
    "calls_received",
    "calls_succeeded",
    "calls_failed",
    "timed_out",
    "unknown_task",
    "malformed",
    "in_flight",
)


class Runner:
    """Executes requests against a registry and counts what happens.

    :param registry: the tasks to serve.
    :param builtins: extra ``{name: fn}`` tasks answered on rpc only (the
        worker's ``zqsync.*`` introspection tasks).
    """

    def __init__(self, registry: Registry, *, builtins: Optional[dict[str, Callable[..., Any]]] = None) -> None:
        self.registry = registry
        self.builtins = dict(builtins or {})
        self.counters = dict.fromkeys(COUNTERS, 0)

    def handle_job(self, frame: bytes) -> None:
        """Decode and run one job; nothing is sent back."""
        try:
            request = protocol.decode_request(frame)
        except ProtocolError as exc:
            self.counters["malformed"] += 1
            log.warning("dropped a malformed job frame: %s", exc)
            return
        self.counters["jobs_received"] += 1
        task = self.registry.get(request.task)
        if task is None:
            self.counters["unknown_task"] += 1
            log.warning("dropped job %s: unknown task %r", request.id, request.task)
            return
        ok, value = self._run(task, request)
        self.counters["jobs_succeeded" if ok else "jobs_failed"] += 1
        if not ok:
            log.error("job %s (%s) failed: %s: %s\n%s", request.id, task.name, *value)

    def handle_call(self, frame: bytes) -> bytes:
        """Decode and run one call; returns the reply frame (never raises for bad input)."""
        try:
            request = protocol.decode_request(frame)
        except ProtocolError as exc:
            self.counters["malformed"] += 1
            return protocol.encode_error("", "ProtocolError", f"malformed request: {exc}")
        self.counters["calls_received"] += 1
        builtin = self.builtins.get(request.task)
        task = Task(request.task, builtin, None) if builtin else self.registry.get(request.task)
        if task is None:
            self.counters["unknown_task"] += 1
            known = ", ".join(self.registry.names()) or "none"
            return protocol.encode_error(
                request.id, "UnknownTask", f"no task named {request.task!r} is registered (known: {known})"
            )
        ok, value = self._run(task, request)
        if ok:
            try:
                reply = protocol.encode_result(request.id, value)
                self.counters["calls_succeeded"] += 1
                return reply
            except ProtocolError as exc:
                value = ("TypeError", f"task {task.name!r} returned a value that {exc}", "")
        self.counters["calls_failed"] += 1
        return protocol.encode_error(request.id, *value)

    def _run(self, task: Task, request: protocol.Request) -> tuple[bool, Any]:
        self.counters["in_flight"] += 1
        timer = gevent.Timeout._start_new_or_dummy(task.time_limit)
        try:
            result = task.fn(*request.args, **request.kwargs)
        except gevent.Timeout as ex:
            if ex is not timer:
                raise
            self.counters["timed_out"] += 1
            message = f"task {task.name!r} exceeded its time limit of {task.time_limit} s"
            return False, ("TimeLimitExceeded", message, "")
        except Exception as exc:
            return False, (type(exc).__name__, str(exc), traceback.format_exc())
        finally:
            timer.close()
            self.counters["in_flight"] -= 1
        return True, result
