"""Tasks for the canvas tests: each appends ``TASK ARGS`` to the file ``$CANVAS_LOG`` (when set) as it
completes, so a test counts completions at the worker; ``hold`` first waits for the file ``GATE``."""

import os

import gevent

from zqsync.worker import Registry

registry = Registry()


def _completed(line: str) -> None:
    path = os.environ.get("CANVAS_LOG")
    if path:
        with open(path, "a") as log:
            log.write(f"{line}\n")


@registry.task
def add(a, b):
    _completed(f"add {a} {b}")
    return a + b


@registry.task
def total(values, bonus=0):
    _completed(f"total {values} {bonus}")
    return sum(values) + bonus


@registry.task
def boom(value):
    raise ValueError(f"boom {value}")


@registry.task
def show(values):
    """Returns what it was given (a chord callback with ``errors="pass"`` gets the errors)."""
    return values


@registry.task
def hold(value, started, gate):
    """Creates ``started``, waits (yielding) until the file ``gate`` exists, then returns ``value``."""
    open(started, "a").close()
    while not os.path.exists(gate):
        gevent.sleep(0.02)
    _completed(f"hold {value}")
    return value


#: ``hold`` under a second name, which a test routes to another worker.
registry.add(hold.task.fn, name="hold_b")
