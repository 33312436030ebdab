"""A Sentry-style error reporter as zqsync middleware.

Every failed attempt of a task is reported with its task name, job id and
attempt as tags; a job whose retries are over is reported once more as a
dead letter. With ``sentry_sdk`` installed and initialised, reports go to
Sentry; pass ``capture=`` to send them anywhere else::

    from zqsync.worker import Registry
    from examples.hooks_sentry import ErrorReporter

    registry = Registry(middleware=(ErrorReporter(),))

Run it with ``zqsync worker mymodule:registry --bind tcp://127.0.0.1:5555``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from zqsync.worker import Middleware, TaskContext

log = logging.getLogger(__name__)
#: ``capture(error, tags)``: sends one report.
Capture = Callable[[BaseException, dict[str, Any]], None]


def sentry_capture(error: BaseException, tags: dict[str, Any]) -> None:
    """Report ``error`` to Sentry with ``tags`` on a scope of its own (needs ``sentry_sdk``)."""
    import sentry_sdk

    with sentry_sdk.new_scope() as scope:
        for key, value in tags.items():
            scope.set_tag(key, value)
        sentry_sdk.capture_exception(error)


def log_capture(error: BaseException, tags: dict[str, Any]) -> None:
    """Report ``error`` as an ERROR log line with its traceback (when ``sentry_sdk`` is missing)."""
    log.error("task failed %s", tags, exc_info=(type(error), error, error.__traceback__))


class ErrorReporter(Middleware):
    """Reports task failures.

    :param capture: ``capture(error, tags)``; default Sentry if ``sentry_sdk``
        imports, else an ERROR log line.
    """

    def __init__(self, capture: Optional[Capture] = None) -> None:
        if capture is None:
            try:
                import sentry_sdk  # noqa: F401
                capture = sentry_capture
            except ImportError:
                capture = log_capture
        self.capture = capture

    def on_failure(self, context: TaskContext, error: BaseException) -> None:
        self.capture(error, self._tags(context, "failure"))

    def on_dead_letter(self, context: TaskContext, error: BaseException) -> None:
        self.capture(error, self._tags(context, "dead_letter"))

    @staticmethod
    def _tags(context: TaskContext, event: str) -> dict[str, Any]:
        return {"zqsync.task": context.task, "zqsync.job_id": context.job_id, "zqsync.kind": context.kind,
                "zqsync.attempt": context.attempt, "zqsync.event": event}
