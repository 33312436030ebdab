"""Tasks that block their worker's hub until killed, tasks that sleep politely, and a task that leaves a trace."""

from __future__ import annotations

import re

import gevent
from gevent import monkey

from zqsync.worker import Registry

registry = Registry()


def _mark(path: str, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text + "\n")


@registry.task
def spin_forever(path):
    """A pure-Python loop that never yields and has no time limit."""
    _mark(path, "spinning")
    while True:
        pass


@registry.task
def c_sleep(path, seconds):
    """An unpatched C-level sleep: the hub is blocked for ``seconds``."""
    _mark(path, "sleeping")
    monkey.get_original("time", "sleep")(float(seconds))
    return "slept"


@registry.task
def nap(seconds):
    """Sleeps cooperatively (takes a task slot, never blocks the hub)."""
    gevent.sleep(float(seconds))
    return "rested"


@registry.task
def touch(path):
    """Leaves a line in ``path``: proof that it ran."""
    _mark(path, "ran")
    return "touched"


@registry.task
def gil_regex(path):
    """One C call that holds the GIL for hours (catastrophic backtracking), with no time limit."""
    _mark(path, "matching")
    return bool(re.match(r"(a+)+$", "a" * 60 + "b"))
