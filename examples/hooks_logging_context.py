"""Per-task logging context as zqsync middleware.

While a task runs, every log record made in its greenlet carries the task
name, job id and attempt, so one job's lines can be told apart from the
hundred others running beside it::

    from zqsync.worker import Registry
    from examples.hooks_logging_context import LoggingContext

    registry = Registry(middleware=(LoggingContext(),))
    LoggingContext.install()   # adds the fields to the root handlers' format

A ``contextvars.ContextVar`` holds the context: gevent gives each greenlet
its own, so concurrent tasks never see each other's.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any, Optional

from zqsync.worker import Middleware, TaskContext

#: The running task's context, or ``None`` outside a task.
current: contextvars.ContextVar[Optional[TaskContext]] = contextvars.ContextVar("zqsync_task", default=None)
FORMAT = "%(asctime)s %(levelname)s %(name)s [%(zq_task)s %(zq_job_id)s #%(zq_attempt)s]: %(message)s"


class ContextFilter(logging.Filter):
    """Adds ``zq_task``, ``zq_job_id`` and ``zq_attempt`` to every record (``-`` outside a task)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = current.get()
        record.zq_task = context.task if context else "-"
        record.zq_job_id = context.job_id if context else "-"
        record.zq_attempt = context.attempt if context else "-"
        return True


class LoggingContext(Middleware):
    """Sets :data:`current` around each task."""

    def __init__(self) -> None:
        self._tokens: dict[Any, contextvars.Token] = {}

    def before_task(self, context: TaskContext) -> None:
        self._tokens[(context.job_id, context.attempt)] = current.set(context)

    def after_task(self, context: TaskContext, result: Any, error: Optional[BaseException]) -> None:
        token = self._tokens.pop((context.job_id, context.attempt), None)
        if token is not None:
            current.reset(token)

    @staticmethod
    def install(fmt: str = FORMAT) -> None:
        """Give every root handler the :class:`ContextFilter` and the format ``fmt``."""
        for handler in logging.getLogger().handlers:
            handler.addFilter(ContextFilter())
            handler.setFormatter(logging.Formatter(fmt))
