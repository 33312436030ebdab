"""Tasks for the job status, delayed and cancel tests."""

import os
import time

import gevent

from zqsync.worker import Registry

registry = Registry()


def _append(path: str, line: str) -> None:
    with open(path, "a") as handle:
        handle.write(f"{line}\n")


@registry.task
def add(a, b):
    return a + b


@registry.task
def boom(message):
    raise ValueError(message)


@registry.task(store_result=True)
def whoami(value):
    """Returns the pid that ran it, so a test knows which worker holds the status."""
    return [value, os.getpid()]


@registry.task
def stamp(path, key):
    """Appends ``key`` and the time it ran (epoch seconds)."""
    _append(path, f"{key} {time.time()!r}")
    return key


@registry.task
def slow(path, key, seconds):
    """Appends ``start KEY``, sleeps cooperatively, appends ``end KEY``."""
    _append(path, f"start {key}")
    gevent.sleep(seconds)
    _append(path, f"end {key}")
    return key


@registry.task(retries=2, backoff=1.0)
def failing(path, key):
    """Appends ``key`` and fails, every attempt (three in all)."""
    _append(path, key)
    raise RuntimeError("fails every time")


@registry.task
def huge_int():
    """A value msgpack cannot encode: an int past 64 bits."""
    return 2**70


@registry.task
def blob(size):
    """``size`` bytes of result."""
    return b"x" * size


@registry.task
def nap(seconds, value):
    """Sleeps cooperatively, then returns ``value``."""
    gevent.sleep(seconds)
    return value
