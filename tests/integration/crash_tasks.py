"""Tasks for the journal scenario tests: a job that kills its process, jobs held at a gate, records."""

import os
import time

from zqsync.worker import Registry

registry = Registry()
#: A registry without the tasks above: a worker serving it must leave their orphans alone.
other = Registry()


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@registry.task(retries=2, backoff=0.05)
def poison(path):
    """Records its attempt, then kills its own process (as a segfaulting C extension would)."""
    _append(path, "poison")
    os._exit(17)


@registry.task(backoff=0.05)
def record(path, line, delay=0.0):
    """Appends ``line`` after ``delay`` seconds."""
    time.sleep(float(delay))
    _append(path, line)


@registry.task(backoff=0.05)
def gated(path, line, gate):
    """Waits until the file ``gate`` exists, then appends ``line``."""
    while not os.path.exists(gate):
        time.sleep(0.02)
    _append(path, line)


@registry.task(retries=0)
def fails_until(path, line, marker):
    """Fails (no retries: dead-lettered) until the file ``marker`` exists, then appends ``line``."""
    if not os.path.exists(marker):
        raise RuntimeError(f"{marker} is missing")
    _append(path, line)


@other.task
def unrelated():
    """Only here so that ``other`` is not empty."""


@registry.task
def hog(seconds, marker):
    """Creates ``marker``, then busy-loops without yielding for ``seconds``: the worker's hub answers
    nothing meanwhile (a slow worker)."""
    open(marker, "w").close()
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        pass


@registry.task
def noop(index):
    """Does nothing (replay benchmarks)."""
