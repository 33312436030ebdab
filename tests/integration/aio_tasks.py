"""Tasks for the asyncio client's tests, served by the in-process worker (whose hub they must not block)."""

import gevent

from zqsync.worker.registry import Registry

registry = Registry()


@registry.task
def echo(value=None):
    return value


@registry.task
def nap(seconds, value=None):
    """Answer with ``value`` after ``seconds``, yielding to the worker's hub meanwhile."""
    gevent.sleep(float(seconds))
    return value


@registry.task
def add(a, b):
    return a + b


@registry.task
def boom(message):
    raise ValueError(message)
