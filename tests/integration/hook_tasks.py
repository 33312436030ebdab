"""Tasks and middleware for the hook tests: every hook call is appended as a JSON line to $ZQSYNC_HOOK_LOG."""

import json
import logging
import os

from examples.hooks_logging_context import LoggingContext
from examples.hooks_sentry import ErrorReporter
from zqsync.worker import Middleware, Registry

ATTEMPTS: dict = {}
log = logging.getLogger("hook_tasks")


def _record(**fields):
    with open(os.environ["ZQSYNC_HOOK_LOG"], "a") as handle:
        handle.write(json.dumps(fields) + "\n")


class Recorder(Middleware):
    def before_task(self, context):
        _record(hook="before_task", task=context.task, job_id=context.job_id, attempt=context.attempt,
                kind=context.kind, args=list(context.args))

    def after_task(self, context, result, error):
        _record(hook="after_task", task=context.task, job_id=context.job_id, attempt=context.attempt,
                result=result, error=type(error).__name__ if error else None)

    def on_failure(self, context, error):
        _record(hook="on_failure", task=context.task, job_id=context.job_id, attempt=context.attempt,
                error=type(error).__name__)

    def on_retry(self, context, error, delay):
        _record(hook="on_retry", task=context.task, job_id=context.job_id, attempt=context.attempt,
                error=type(error).__name__, delay=delay)

    def on_dead_letter(self, context, error):
        _record(hook="on_dead_letter", task=context.task, job_id=context.job_id, attempt=context.attempt,
                error=type(error).__name__)


class Broken(Middleware):
    def before_task(self, context):
        raise RuntimeError("a broken hook")


def _report(error, tags):
    _record(hook="reported", error=type(error).__name__, **{key.split(".")[1]: value for key, value in tags.items()})


registry = Registry(middleware=(LoggingContext(), Recorder(), ErrorReporter(capture=_report), Broken()))
LoggingContext.install()


def _fail_until(key, failures, error):
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    if ATTEMPTS[key] <= failures:
        raise error
    return ATTEMPTS[key]


@registry.task(retries=3, backoff=0.05, retry_on=(OSError,))
def flaky_io(key):
    """Fails twice with OSError, then succeeds."""
    log.warning("flaky_io attempt")
    return _fail_until(key, 2, OSError("disk hiccup"))


@registry.task(retries=3, backoff=0.05, retry_on=(OSError,))
def wrong_kind(key):
    """Fails with an error its retry_on does not cover: final at once."""
    return _fail_until(key, 99, ValueError("bad input"))


@registry.task(retries=3, backoff=30.0, max_delay=0.2, jitter=0.5)
def capped(key):
    """Always fails; its backoff starts at 30 s but is capped at 0.2 s (less up to half of jitter)."""
    return _fail_until(key, 99, RuntimeError("always"))


@registry.task
def explode():
    raise KeyError("boom")
