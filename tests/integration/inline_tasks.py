"""Tasks for the inline-execution tests: which greenlet ran them, and ones that yield."""

from __future__ import annotations

import gevent

from zqsync.worker import Registry

registry = Registry()


@registry.task
def runs_in():
    """How many calls the greenlet running this one has run (1 for a fresh greenlet)."""
    greenlet = gevent.getcurrent()
    greenlet.zq_runs = getattr(greenlet, "zq_runs", 0) + 1
    return greenlet.zq_runs


@registry.task
def nap(seconds):
    """Yield to the hub for ``seconds``; returns them."""
    gevent.sleep(float(seconds))
    return seconds


@registry.task
def record(path):
    with open(path, "a") as handle:
        handle.write("ran\n")
